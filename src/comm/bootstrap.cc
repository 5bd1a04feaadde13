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
#include "core/security.h"
#include "rendezvous/join.h"
#include "rendezvous/launch_env.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/torch_store.h"
#include "ringreduce/error.h"
#include "transport/table.h"
#include "transport/topology.h"

namespace ringreduce::detail {
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

CommImpl::CommImpl(const Options& options, const SplitFrom* from)
    : overrides_(overrides_from(options)), config_(overrides_) {
  try {
    init(options, from);
  } catch (const Error& e) {
    // A shrink's: no store to mark, no join to fail; shrink() says what it was making.
    if (from && from->membership) throw;
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

std::string CommImpl::host_id() const {
  return config_.str("RINGREDUCE_HOST_ID").empty() ? transport::host_identity()
                                                   : "id:" + config_.str("RINGREDUCE_HOST_ID");
}

namespace {

// The job's namespace, under a generation of its own where the launcher's store outlives its
// worker groups (torchrun: rendezvous/join.h, first_free_generation).
std::string with_generation(const std::shared_ptr<Store>& store, const std::string& prefix) {
  if (!rendezvous::rounds_share_store()) return prefix;
  PrefixStore job(store, prefix);
  return prefix + "/" + rendezvous::first_free_generation(job);
}

}  // namespace

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
    PrefixStore store(
        from ? from->store : options.store,
        from ? options.store_prefix : with_generation(options.store, options.store_prefix));
    rendezvous::mark_failed(store, what);
  } else {
    // Failed before reaching the store (a setting that does not parse): reach it now, briefly,
    // if the launcher's address can be read; rank 0's store is not there if rank 0 failed.
    const rendezvous::LaunchHints hints = rendezvous::launch_hints(config_);
    if (!hints.store_host.empty() && hints.store_port > 0) {
      try {
        core::Security security;
        try {
          security = core::security_settings(config_);
        } catch (...) {  // the token alone, as the settings allow
          try {
            security.token = config_.str("RINGREDUCE_TOKEN");
          } catch (...) {
          }
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
                                                                  hints.store_port, security);
          } catch (...) {  // someone else hosts it after all
          }
        }
        auto tcp = rendezvous::connect_store(hints.store_host, hints.store_port, hints.torch_store,
                                             std::chrono::milliseconds(1000), security);
        std::string job;
        try {
          job = rendezvous::job_id(config_);
        } catch (...) {
        }
        PrefixStore store(
            tcp, with_generation(
                     tcp, job.empty() ? options.store_prefix : options.store_prefix + "/" + job));
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

int64_t thread_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1000 + ts.tv_nsec / 1000000;
}

std::string agreed_settings(const core::Config& config) {
  // The settings that decide the plans and the links: a difference would otherwise show later
  // as a mismatch, or a hang at connection.
  std::string out;
  for (const char* name : {"RINGREDUCE_ALGO", "RINGREDUCE_SEGMENT_BYTES", "RINGREDUCE_CHANNELS",
                           "RINGREDUCE_PROBE_BATCHES", "RINGREDUCE_WIRE"})
    out += std::string(name) + "=" + config.str(name) + "\n";
  return out + transport::agreed_settings(config);  // each kind's own (shm, tcp)
}

void CommImpl::init(const Options& options, const SplitFrom* from) {
  StartSettings st;
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
  st.deadline = core::Deadline::after(timeout_.load());
  // This rank's own settings first, before anything waits on the others: a bad value fails
  // every rank that has it at once, each naming its own.
  st.channels = config_.integer("RINGREDUCE_CHANNELS");
  if (st.channels < 1 || st.channels > 64)
    throw InvalidArgument("RINGREDUCE_CHANNELS=" + std::to_string(st.channels) +
                          " is not in 1..64");
  st.stall_s = config_.number("RINGREDUCE_STALL_WARN");
  if (!(st.stall_s >= 0))
    throw InvalidArgument("RINGREDUCE_STALL_WARN must be >= 0 seconds (0: no stall reports)");
  transport::check_settings(config_);  // each kind's own

  std::string store_host;
  int local_size = -1;
  // The store's connections are protected as the data links are (issue 45).
  const core::Security security = core::security_settings(config_);
  const std::string token = st.token = security.token;
  // Where the stall monitor gets its own store client (TCP launches), or the store to share.
  std::function<std::shared_ptr<Store>()> stall_store;
  if (from) {
    // A split or a shrink: rank and size from the parent's groups, its store (under a prefix of
    // this one's own), its data interface, its job's ranks on this host, its store server.
    rank_ = *options.rank;
    rank_known_ = true;
    size_ = *options.world_size;
    // A communicator made from handles (membership.cc) has no store: no stall reports, no split.
    if (from->store) {
      store_ = std::make_shared<PrefixStore>(from->store, options.store_prefix);
      job_store_ = from->job_store ? from->job_store : from->store;
      stall_store = [parent = from->stall_store, prefix = options.store_prefix] {
        return std::make_shared<PrefixStore>(parent(), prefix);
      };
    }
    store_host = from->store_host;
    // A shrink's or a handles' communicator counts its ranks per host from its hosts.
    local_size = from->membership ? -1 : from->local_size;
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
    store_ = std::make_shared<PrefixStore>(options.store,
                                           with_generation(options.store, options.store_prefix));
    job_store_ = store_;
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
      store_server_ = std::make_shared<rendezvous::TcpStoreServer>(launch.store_host,
                                                                   launch.store_port, security);
    }
    // Under torchrun's agent store, torch's TCPStore is already there: every rank is its client.
    auto tcp = rendezvous::connect_store(launch.store_host, launch.store_port, launch.torch_store,
                                         timeout_.load(), security);
    // Under the job's own id where the launcher gives one, so that a store reused by several
    // jobs never mixes their keys.
    const std::string job = rendezvous::job_id(config_);
    const std::string prefix =
        with_generation(tcp, job.empty() ? options.store_prefix : options.store_prefix + "/" + job);
    store_ = std::make_shared<PrefixStore>(tcp, prefix);
    job_store_ = store_;
    // A client of its own with a short timeout: when the store's host is stuck, a stall report
    // must fail fast, not hold up the communicator's destruction for RINGREDUCE_TIMEOUT.
    stall_store = [host = launch.store_host, port = launch.store_port, prefix, security,
                   torch = launch.torch_store,
                   t = std::min(timeout_.load(), std::chrono::milliseconds(5000))] {
      return std::make_shared<PrefixStore>(
          rendezvous::connect_store(host, port, torch, t, security), prefix);
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
    if (launch.torch_store && rank_ == 0 && security.encrypt != core::Encrypt::off)
      RR_LOG(warn, init, rank_, "RINGREDUCE_ENCRYPT=", core::encrypt_name(security.encrypt),
             ", but the store is torchrun's agent store (torch's TCPStore), which encrypts "
             "nothing: the data connections are encrypted, the store connections are not (set "
             "RINGREDUCE_ADDR to a port of its own for a ringreduce store that is)");
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

  // Where start-up spends its time (the "communicator ready" line, RINGREDUCE_DEBUG=INFO).
  st.clock.begin = core::Clock::now();
  st.clock.cpu_begin = thread_cpu_ms();
  Membership joined;
  std::optional<transport::Listeners> own_listeners;
  const Membership* members = &joined;
  if (from && from->membership) {
    // A shrink (the survivors agreed on it over the parent's control plane, shrink.cc) or
    // handles exchanged out of band (membership.cc): no join through the store.
    members = from->membership;
    parent_ranks_ = members->parent_ranks;
  } else {
    // Start-up waits in the store watch the job's failure mark: a rank that fails at start-up
    // fails the others within ~100 ms (rendezvous/join.h).
    startup_store_ = std::make_shared<rendezvous::FailFastStore>(store_);
    joined.check_failed = [&startup = *startup_store_] { startup.throw_if_failed(); };
    // Which ranks share a host: they may use shared memory, they share its cores, and the ring
    // keeps them next to each other. The join checks that the ranks belong together and hands
    // every rank the table in a constant number of store round trips.
    joined.hosts.assign(static_cast<size_t>(size_), "");
    joined.hosts[static_cast<size_t>(rank_)] = host_id();
    if (size_ > 1) {
      // Listening before joining: what the peers need to reach this rank goes in its record.
      joined.listeners = &own_listeners.emplace(config_, token, store_host);
      // A fresh id per communicator: a connection from another job, or from an earlier
      // communicator on the same ports, is refused at its hello.
      uint64_t comm_id = 0;
      if (rank_ == 0) {
        std::random_device rd;
        comm_id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
      }
      rendezvous::JoinRecord record;
      record.rank = rank_;
      record.world_size = size_;
      record.host = joined.hosts[static_cast<size_t>(rank_)];
      char hostname[256] = {};
      gethostname(hostname, sizeof hostname - 1);
      record.where = "host " + std::string(hostname) + " pid " + std::to_string(getpid());
      record.settings = agreed_settings(config_);
      record.links = joined.listeners->published();
      const rendezvous::JobTable table =
          rendezvous::join(*startup_store_, record, comm_id, timeout_.load());
      joined.comm_id = table.comm_id;
      joined.hosts = table.hosts;
      joined.published = table.links;
    }
  }
  st.clock.joined = core::Clock::now();
  st.clock.cpu_joined = thread_cpu_ms();
  build(*members, st, local_size);
}

}  // namespace ringreduce::detail
