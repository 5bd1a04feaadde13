// The communicator's start-up: who this rank is (the launcher's variables or the Options), the
// store, the communicator id, the host identities and the ring's order by host, the links (the
// transport table), the tuner, the calibration (calibrate.cc) and the stall monitor.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <random>

#include "comm/agree.h"
#include "comm/comm_impl.h"
#include "comm/device.h"
#include "comm/errors.h"
#include "core/log.h"
#include "rendezvous/join.h"
#include "rendezvous/launch_env.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/torch_store.h"
#include "ringreduce/error.h"
#include "transport/table.h"
#include "transport/topology.h"

namespace ringreduce::detail {
namespace {

// Options fields become overrides of the settings they stand for, so that the one registry
// resolves every setting the same way.
std::map<std::string, std::string> overrides_from(const Options& o) {
  std::map<std::string, std::string> m = o.settings;
  if (o.rank) m["RINGREDUCE_RANK"] = std::to_string(*o.rank);
  if (o.world_size) m["RINGREDUCE_WORLD_SIZE"] = std::to_string(*o.world_size);
  if (o.addr) m["RINGREDUCE_ADDR"] = *o.addr;
  if (o.token) m["RINGREDUCE_TOKEN"] = *o.token;
  if (o.timeout)
    m["RINGREDUCE_TIMEOUT"] = std::to_string(static_cast<double>(o.timeout->count()) / 1000.0);
  return m;
}

}  // namespace

CommImpl::CommImpl(const Options& options, const SplitFrom* from)
    : overrides_(overrides_from(options)), config_(overrides_) {
  try {
    init(options, from);
  } catch (const Error& e) {
    // A shrink's: no store to mark, no join to fail; shrink() says what it was making.
    if (from && from->shrink) throw;
    // A peer lost during the start-up probes may have left because the job failed elsewhere (the
    // other ranks may already be in their first op, and fail it): that cause is the error.
    if (e.code() == ErrorCode::peer && transport_) {
      if (auto cause = transport_->find_cause(kCauseGrace, blamed_rank(e))) {
        try {
          std::rethrow_exception(cause);
        } catch (const Error& c) {
          std::rethrow_exception(
              with_prefix(c, "rank " + std::to_string(rank_) + ": start-up: ", ""));
        }
      }
    }
    std::rethrow_exception(startup_failed(e, options, from));
  }
}

std::exception_ptr CommImpl::startup_failed(const Error& e, const Options& options,
                                            const SplitFrom* from) {
  std::string who;
  if (rank_known_) {
    who = "rank " + std::to_string(rank_);
  } else if (auto hint = rendezvous::launch_hints(config_).rank) {
    who = "rank " + *hint;  // as the launcher numbered this process: its own settings failed
  }
  std::exception_ptr error;
  if (who.empty())
    error = with_prefix(e, "start-up: ", "");
  else if (std::string_view(e.what()).starts_with(who + ": "))
    error = rebuild(e, e.what());
  else
    error = with_prefix(e, who + ": start-up: ", "");
  std::string what;
  try {
    std::rethrow_exception(error);
  } catch (const Error& x) {
    what = x.what();
  }
  // The rank that hosts the store stays until the others have read the mark (at most 1.5 s):
  // its store would otherwise go with it, and they would see a lost connection, not the cause.
  constexpr std::chrono::milliseconds kLinger(1500);
  // A failure the job already knows (another rank's mark) needs no mark of its own.
  if (e.code() == ErrorCode::aborted && startup_store_) {
    if (store_server_ && !from) rendezvous::linger_for_readers(*store_, size_ - 1, kLinger);
    return error;
  }
  if (store_) {
    rendezvous::mark_failed(*store_, what);
    if (store_server_ && !from) rendezvous::linger_for_readers(*store_, size_ - 1, kLinger);
  } else if (from || options.store) {
    // The store was given (a split's parent's, or the caller's): its keys are under the prefix.
    PrefixStore store(from ? from->store : options.store, options.store_prefix);
    rendezvous::mark_failed(store, what);
  } else {
    // Failed before reaching the store (a setting that does not parse): reach it now, briefly,
    // if the launcher's address can be read; rank 0's store is not there if rank 0 failed.
    const rendezvous::LaunchHints hints = rendezvous::launch_hints(config_);
    if (!hints.store_host.empty() && hints.store_port > 0) {
      try {
        std::string token;
        try {
          token = config_.str("RINGREDUCE_TOKEN");
        } catch (...) {
        }
        // Rank 0 was to host the store: host it now, for as long as the news takes.
        std::unique_ptr<rendezvous::TcpStoreServer> server;
        std::string hosting;
        try {
          hosting = config_.str("RINGREDUCE_STORE_SERVER");
        } catch (...) {
        }
        if (hints.rank && *hints.rank == "0" && hosting != "0" && !hints.torch_store) {
          try {
            server = std::make_unique<rendezvous::TcpStoreServer>(hints.store_host,
                                                                  hints.store_port, token);
          } catch (...) {  // someone else hosts it after all
          }
        }
        auto tcp = rendezvous::connect_store(hints.store_host, hints.store_port, hints.torch_store,
                                             std::chrono::milliseconds(1000), token);
        std::string job;
        try {
          job = rendezvous::job_id(config_);
        } catch (...) {
        }
        PrefixStore store(tcp,
                          job.empty() ? options.store_prefix : options.store_prefix + "/" + job);
        rendezvous::mark_failed(store, what);
        if (server) {
          // How many will read it, if the world size can be read.
          int others = 0;
          try {
            others = std::stoi(config_.str("RINGREDUCE_WORLD_SIZE")) - 1;
          } catch (...) {
          }
          rendezvous::linger_for_readers(store, others, kLinger);
        }
      } catch (...) {
      }
    }
  }
  return error;
}

namespace {

size_t open_descriptors() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
    n = n > 3 ? n - 3 : 0;  // ".", ".." and the directory's own
  }
  return n;
}

// The descriptors this rank's links will hold: per same-host peer a pidfd, a doorbell and its
// segment until mapped (and on the host's first rank, or in a mesh, a socket or two more: 4 is the
// bound); per other-host peer a socket per wire and one for the lane; and some of its own (store,
// epoll, listeners): beside those already open (the application's, another communicator's). A
// short soft limit is raised towards the hard one (as ringrun does for itself; the default soft
// limit, 1,024, holds about 250 same-host peers); where even the hard one is short the rank fails
// now, naming both, instead of meeting EMFILE halfway through its links.
void ensure_open_files(size_t shm_peers, size_t tcp_peers, size_t per_tcp_peer) {
  const size_t links = 4 * shm_peers + per_tcp_peer * tcp_peers + 32, open = open_descriptors();
  const rlim_t needed = static_cast<rlim_t>(links + open);
  // With room for the application's own files.
  if (core::raise_open_files_limit(needed, needed + 256) >= needed) return;
  rlimit l{};
  getrlimit(RLIMIT_NOFILE, &l);
  throw Error("its links need about " + std::to_string(links) + " open files (" +
              std::to_string(shm_peers) + " same-host peers, " + std::to_string(tcp_peers) +
              " on other hosts) beside the " + std::to_string(open) +
              " it has open, but its limit is " + std::to_string(l.rlim_cur) +
              " and the hard limit " + std::to_string(l.rlim_max) +
              " (raise it with ulimit -Hn, or LimitNOFILE in a systemd unit)");
}

}  // namespace

std::string agreed_settings(const core::Config& config) {
  // The settings that decide the plans and the links: a difference would otherwise show later
  // as a mismatch, or a hang at connection.
  std::string out;
  for (const char* name :
       {"RINGREDUCE_ALGO", "RINGREDUCE_SEGMENT_BYTES", "RINGREDUCE_CHANNELS", "RINGREDUCE_NSOCKS",
        "RINGREDUCE_SHM", "RINGREDUCE_SOCKET_FAMILY", "RINGREDUCE_PROBE_BATCHES"})
    out += std::string(name) + "=" + config.str(name) + "\n";
  return out;
}

void CommImpl::init(const Options& options, const SplitFrom* from) {
  if (auto it = options.settings.find("RINGREDUCE_DEBUG"); it != options.settings.end()) {
    core::LogLevel level;
    if (core::parse_log_level(it->second, &level)) core::set_log_level(level);
  }
  if (auto it = options.settings.find("RINGREDUCE_DEBUG_SUBSYS"); it != options.settings.end()) {
    uint32_t mask = 0;
    std::string why;
    if (!core::parse_log_subsys(it->second, &mask, &why))
      throw InvalidArgument("RINGREDUCE_DEBUG_SUBSYS='" + it->second + "': " + why);
    core::set_log_subsys_mask(mask);
  }
  if (auto it = options.settings.find("RINGREDUCE_DEBUG_FILE"); it != options.settings.end())
    core::set_log_file(core::expand_log_path(it->second, core::host_name(), getpid()));
  const double timeout_s = config_.number("RINGREDUCE_TIMEOUT");
  if (!(timeout_s > 0)) throw InvalidArgument("RINGREDUCE_TIMEOUT must be > 0 seconds");
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const auto deadline = core::Deadline::after(timeout_.load());
  // This rank's own settings first, before anything waits on the others: a bad value fails
  // every rank that has it at once, each naming its own.
  const int64_t channels = config_.integer("RINGREDUCE_CHANNELS");
  if (channels < 1 || channels > 64)
    throw InvalidArgument("RINGREDUCE_CHANNELS=" + std::to_string(channels) + " is not in 1..64");
  const int64_t nsocks = config_.integer("RINGREDUCE_NSOCKS");
  if (nsocks < 1 || nsocks > 16)
    throw InvalidArgument("RINGREDUCE_NSOCKS=" + std::to_string(nsocks) + " is not in 1..16");
  const double stall_s = config_.number("RINGREDUCE_STALL_WARN");
  if (!(stall_s >= 0))
    throw InvalidArgument("RINGREDUCE_STALL_WARN must be >= 0 seconds (0: no stall reports)");
  if (const std::string c = config_.str("RINGREDUCE_SHM_CONNECT"); c != "first" && c != "mesh")
    throw InvalidArgument("RINGREDUCE_SHM_CONNECT='" + c + "' is neither first nor mesh");

  std::string store_host;
  int local_size = -1;
  const std::string token = config_.str("RINGREDUCE_TOKEN");
  // Where the stall monitor gets its own store client (TCP launches), or the store to share.
  std::function<std::shared_ptr<Store>()> stall_store;
  if (from) {
    // A split or a shrink: rank and size from the parent's groups, its store (under a prefix of
    // this one's own), its data interface, its job's ranks on this host, its store server.
    rank_ = *options.rank;
    rank_known_ = true;
    size_ = *options.world_size;
    store_ = std::make_shared<PrefixStore>(from->store, options.store_prefix);
    stall_store = [parent = from->stall_store, prefix = options.store_prefix] {
      return std::make_shared<PrefixStore>(parent(), prefix);
    };
    store_host = from->store_host;
    local_size = from->shrink ? -1 : from->local_size;  // a shrink's: counted from its hosts
    store_server_ = from->server;
  } else if (options.store) {
    // In-process: rank and size must be given; no launcher, no TCP store.
    if (!options.rank || !options.world_size)
      throw InvalidArgument("Options with a store need rank and world_size");
    rank_ = *options.rank;
    size_ = *options.world_size;
    rank_known_ = rank_ >= 0;
    if (size_ < 1 || rank_ < 0 || rank_ >= size_)
      throw InvalidArgument("rank " + std::to_string(rank_) + " is outside a world of " +
                            std::to_string(size_));
    store_ = std::make_shared<PrefixStore>(options.store, options.store_prefix);
    stall_store = [store = store_] { return store; };
    store_host = "127.0.0.1";
    local_size = size_;
  } else {
    rendezvous::LaunchInfo launch = rendezvous::detect_launch(config_);
    rank_ = launch.rank;
    rank_known_ = true;
    size_ = launch.world_size;
    local_size = launch.local_size;
    if (launch.store_host.empty() || launch.store_port <= 0)
      throw InvalidArgument(
          "rank " + std::to_string(rank_) +
          ": no rendezvous address: set RINGREDUCE_ADDR=host:port (or MASTER_ADDR "
          "and MASTER_PORT) to the address of rank 0's host");
    store_host = launch.store_host;
    if (rank_ == 0 && config_.str("RINGREDUCE_STORE_SERVER") != "0" && !launch.torch_store) {
      // Rank 0 hosts the store on the address it was given, so it is reachable where the others
      // will look for it.
      store_server_ =
          std::make_shared<rendezvous::TcpStoreServer>(launch.store_host, launch.store_port, token);
    }
    // Under torchrun's agent store, torch's TCPStore is already there: every rank is its client.
    auto tcp = rendezvous::connect_store(launch.store_host, launch.store_port, launch.torch_store,
                                         timeout_.load(), token);
    // Under the job's own id where the launcher gives one, so that a store reused by several
    // jobs never mixes their keys.
    const std::string job = rendezvous::job_id(config_);
    const std::string prefix =
        job.empty() ? options.store_prefix : options.store_prefix + "/" + job;
    store_ = std::make_shared<PrefixStore>(tcp, prefix);
    // A client of its own with a short timeout: when the store's host is stuck, a stall report
    // must fail fast, not hold up the communicator's destruction for RINGREDUCE_TIMEOUT.
    stall_store = [host = launch.store_host, port = launch.store_port, prefix, token,
                   torch = launch.torch_store,
                   t = std::min(timeout_.load(), std::chrono::milliseconds(5000))] {
      return std::make_shared<PrefixStore>(rendezvous::connect_store(host, port, torch, t, token),
                                           prefix);
    };
    std::string which;
    if (launch.torch_store)
      which = rendezvous::torch_store_dialect(*tcp) == rendezvous::TorchStoreDialect::v1
                  ? " (torchrun's agent store: torch's TCPStore, torch 1 protocol)"
                  : " (torchrun's agent store: torch's TCPStore, torch 2 protocol)";
    RR_LOG(info, init, rank_, "launched by ", launch.launcher, " as rank ", rank_, " of ", size_,
           "; store at ", launch.store_host, ":", launch.store_port, which);
    if (launch.torch_store && rank_ == 0 && !token.empty())
      RR_LOG(warn, init, rank_,
             "RINGREDUCE_TOKEN is set, but the store is torchrun's agent store (torch's TCPStore), "
             "which authenticates no one: the data connections prove the token, the store "
             "connections cannot (set RINGREDUCE_ADDR to a port of its own for a ringreduce "
             "store that does)");
  }
  stall_store_ = stall_store;
  store_host_ = store_host;
  if (rank_ == 0) RR_LOG(info, init, rank_, "ringreduce ", RINGREDUCE_VERSION_STRING);
  // Every rank, not only rank 0: environments differ by host (and by rank, under a wrapper
  // script), and a typo on one host must not go unseen. Once per process.
  core::warn_unknown_variables(rank_);
  open_timeline();
  if (rank_ == 0)
    RR_LOG(info, init, rank_,
           config_.has("RINGREDUCE_TOKEN")
               ? "RINGREDUCE_TOKEN is set: store and data connections prove they hold it"
               : "RINGREDUCE_TOKEN is not set: connections are not authenticated");
  if (core::log_enabled(core::LogLevel::info, core::LogSubsys::env) && rank_ == 0)
    RR_LOG(info, env, rank_, "settings:\n", config_.dump());

  // Start-up waits in the store watch the job's failure mark: a rank that fails at start-up
  // fails the others within ~100 ms (rendezvous/join.h).
  startup_store_ = std::make_shared<rendezvous::FailFastStore>(store_);
  Store& startup = *startup_store_;

  // A fresh id per communicator: a connection from another job, or from an earlier communicator
  // on the same ports, is refused at its hello.
  uint64_t comm_id = 0;
  if (rank_ == 0) {
    std::random_device rd;
    comm_id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
  }
  // Which ranks share a host: they may use shared memory, they share its cores, and the ring
  // keeps them next to each other. The join checks that the ranks belong together and hands
  // every rank the table in a constant number of store round trips.
  // Where start-up spends its time (the "communicator ready" line, RINGREDUCE_DEBUG=INFO).
  const auto t_begin = core::Clock::now();
  // And the CPU this thread spent in each (where ranks crowd the cores, the wall time is mostly
  // other ranks' turns).
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
  };
  const int64_t cpu_begin = cpu_ms();
  auto ms_since = [](core::Clock::time_point t) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(core::Clock::now() - t).count();
  };
  std::vector<std::string> hosts(static_cast<size_t>(size_));
  const std::string mine = config_.str("RINGREDUCE_HOST_ID").empty()
                               ? transport::host_identity()
                               : "id:" + config_.str("RINGREDUCE_HOST_ID");
  hosts[static_cast<size_t>(rank_)] = mine;
  // Listening before joining: what the peers need to reach this rank goes in its record.
  std::optional<transport::Listeners> own_listeners;
  transport::Listeners* listeners = nullptr;
  std::vector<std::string> published;
  if (from && from->shrink) {
    // A shrink: the survivors agreed on all of it over the parent's control plane (shrink.cc).
    comm_id = from->shrink->comm_id;
    hosts = from->shrink->hosts;
    published = from->shrink->published;
    listeners = from->shrink->listeners;
    parent_ranks_ = from->shrink->parent_ranks;
  } else if (size_ > 1) {
    listeners = &own_listeners.emplace(config_, token, store_host);
    rendezvous::JoinRecord record;
    record.rank = rank_;
    record.world_size = size_;
    record.host = mine;
    char hostname[256] = {};
    gethostname(hostname, sizeof hostname - 1);
    record.where = "host " + std::string(hostname) + " pid " + std::to_string(getpid());
    record.settings = agreed_settings(config_);
    record.links = listeners->published();
    const rendezvous::JobTable table = rendezvous::join(startup, record, comm_id, timeout_.load());
    comm_id = table.comm_id;
    hosts = table.hosts;
    published = table.links;
  }
  const auto t_joined = core::Clock::now();
  const int64_t cpu_joined = cpu_ms();
  int same_host = 0;
  for (int q = 0; q < size_; ++q)
    same_host += hosts[static_cast<size_t>(q)] == hosts[static_cast<size_t>(rank_)] ? 1 : 0;
  if (local_size < 0) local_size = same_host;
  local_size_ = local_size;
  {
    const bool shm = config_.str("RINGREDUCE_SHM") != "0";
    const size_t others = static_cast<size_t>(size_ - 1),
                 local = static_cast<size_t>(same_host - 1);
    ensure_open_files(shm ? local : 0, shm ? others - local : others,
                      static_cast<size_t>(channels * nsocks + 1));
  }
  ring_order(hosts);
  // More ranks than cores on this host: polling steals the core from the rank that would
  // produce the data, so poll briefly and yield while doing it.
  const long cores = cores_ = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const bool oversubscribed = local_size > 0 && local_size > cores;
  // Ranks per core on this host, rounded up (1 with cores to spare).
  const int crowding = oversubscribed ? static_cast<int>((local_size + cores - 1) / cores) : 1;
  transport::ConnectArgs args;
  args.rank = rank_;
  args.size = size_;
  args.comm_id = comm_id;
  args.channels = static_cast<int>(channels);
  args.nsocks = static_cast<int>(nsocks);
  if (size_ > 1) args.hosts = hosts;
  args.hosts_given = !config_.str("RINGREDUCE_HOST_ID").empty();
  args.token = token;
  args.store_host = store_host;
  args.config = &config_;
  args.engine.rank = rank_;
  args.engine.size = size_;
  args.engine.channels = static_cast<int>(channels);
  args.engine.spin_us = config_.has("RINGREDUCE_SPIN_US")
                            ? static_cast<int>(config_.integer("RINGREDUCE_SPIN_US"))
                            : (oversubscribed ? 20 : 50);
  args.engine.oversubscribed = oversubscribed;
  args.published = published;  // kept: a shrink needs it (published_)
  if (from && from->shrink)
    args.check_failed = from->shrink->check_failed;  // no store: the agreement's peers
  else
    args.check_failed = [&startup = *startup_store_] { startup.throw_if_failed(); };
  args.listeners = listeners;
  // Enough yields for every rank that shares this core to run twice.
  if (oversubscribed) args.engine.max_idle_yields = 4 * crowding;
  // Every rank routes each pair alike (the transport table over the same host identities):
  // shared memory between the ranks of a host, TCP between hosts.
  transport_ = transport::connect(args, startup, deadline);
  const auto t_linked = core::Clock::now();
  const int64_t cpu_linked = cpu_ms();
  transport_->set_describer([this](const transport::OpTag& t) { return describe(t); });
  tuner::Setup setup;
  setup.size = size_;
  setup.channels = static_cast<int>(channels);
  setup.link = transport_->traits();
  setup.window = transport_->window() != nullptr;
  setup.host_size = host_size_ < size_ ? host_size_ : 0;
  tuner_ = std::make_unique<tuner::Tuner>(config_, setup);
  if (from && from->shrink) {
    // The parent's measured costs where its links were of the same kind (the survivors' links
    // are a subset of its links); the defaults otherwise. Probing again would cost a shrink
    // ~100 ms, and across hosts it goes through the store, which may be gone.
    const std::string kind = same_host < size_ ? "net" : transport_->traits().name;
    if (from->shrink->costs && from->shrink->cost_kind == kind) {
      tuner_->set_costs(*from->shrink->costs);
      cost_kind_ = kind;
    }
  } else if (same_host < size_) {
    probe_network(hosts, deadline);
  } else if (size_ > 1) {
    probe_links(deadline);
  }
  // What a later shrink builds from: who is where, how to reach them without the store.
  comm_id_ = comm_id;
  hosts_ = hosts;
  published_ = published;
  if (size_ > 1 && listeners && listeners->ctl.valid()) {
    transport::ControlPlane::Options c;
    c.rank = rank_;
    c.size = size_;
    c.comm_id = comm_id;
    c.token = token;
    c.listener = std::move(listeners->ctl);
    c.nonce = listeners->ctl_nonce;
    for (const std::string& p : published)
      c.published.push_back(transport::published_part(p, "ctl="));
    control_ = std::make_unique<ControlChannel>(std::move(c));
  }
  // Always there with 2+ ranks: besides the warnings it finds mismatches no message shows.
  if (size_ > 1)
    stall_ = std::make_unique<StallMonitor>(
        rank_, size_, std::chrono::milliseconds(static_cast<int64_t>(stall_s * 1000)),
        StallMonitor::Hooks{stall_store, [this](const transport::OpTag& t) { return describe(t); },
                            [this](const std::string& reason) {
                              transport_->interrupt(reason, static_cast<int>(ErrorCode::mismatch));
                            }},
        crowding);
  if (timeline_) {
    // Start-up from the timeline's opening (the join, the links, the probes); the engine records
    // waits from here on, so that the probes' do not bury the first op.
    timeline_->complete(
        "init", "start-up", timeline_opened_us_, core::Timeline::now_us(),
        "\"size\":" + std::to_string(size_) + ",\"links\":\"" + transport_->kinds_text() + "\"");
    transport_->set_timeline(timeline_.get());
  }
  RR_LOG(info, init, rank_, "communicator ready: ", size_, " ranks over ", transport_->kinds_text(),
         "; start-up ", ms_since(t_begin), " ms: join ",
         std::chrono::duration_cast<std::chrono::milliseconds>(t_joined - t_begin).count(),
         ", links ",
         std::chrono::duration_cast<std::chrono::milliseconds>(t_linked - t_joined).count(),
         ", probe and monitor ", ms_since(t_linked), "; cpu ", cpu_joined - cpu_begin, " + ",
         cpu_linked - cpu_joined, " + ", cpu_ms() - cpu_linked, " ms");
}

void CommImpl::ring_order(const std::vector<std::string>& hosts) {
  // Hosts in the order of their lowest rank, each host's ranks in rank order. On one host (or
  // with ranks placed host by host, as launchers do by default) this is rank order.
  ring_.clear();
  std::vector<bool> placed(hosts.size(), false);
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (placed[r]) continue;
    for (size_t q = r; q < hosts.size(); ++q)
      if (!placed[q] && hosts[q] == hosts[r]) {
        placed[q] = true;
        ring_.push_back(static_cast<int>(q));
      }
  }
  // Every host the same size? (Then host h holds ring positions h*size ...)
  host_size_ = 0;
  for (size_t p = 0; p < ring_.size(); ++p) {
    size_t run = 1;
    const auto& h = hosts[static_cast<size_t>(ring_[p])];
    while (p + run < ring_.size() && hosts[static_cast<size_t>(ring_[p + run])] == h) ++run;
    if (host_size_ == 0) host_size_ = static_cast<int>(run);
    if (static_cast<int>(run) != host_size_) {
      host_size_ = 0;
      break;
    }
    p += run - 1;
  }
  ring_pos_.assign(hosts.size(), 0);
  for (size_t p = 0; p < ring_.size(); ++p)
    ring_pos_[static_cast<size_t>(ring_[p])] = static_cast<int>(p);
}

}  // namespace ringreduce::detail
