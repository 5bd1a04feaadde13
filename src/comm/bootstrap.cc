// The communicator's start-up: who this rank is (the launcher's variables or the Options), the
// store, the communicator id, the host identities and the ring's order by host, the links (the
// transport table), the tuner, the calibration (calibrate.cc) and the stall monitor.
#include <unistd.h>

#include <random>

#include "comm/comm_impl.h"
#include "core/log.h"
#include "rendezvous/launch_env.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/error.h"
#include "transport/table.h"
#include "transport/topology.h"

namespace ringreduce::detail {
namespace {

std::vector<uint8_t> to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

}  // namespace

void CommImpl::init(const Options& options, const SplitFrom* from) {
  if (auto it = options.settings.find("RINGREDUCE_DEBUG"); it != options.settings.end()) {
    core::LogLevel level;
    if (core::parse_log_level(it->second, &level)) core::set_log_level(level);
  }
  const double timeout_s = config_.number("RINGREDUCE_TIMEOUT");
  if (!(timeout_s > 0)) throw InvalidArgument("RINGREDUCE_TIMEOUT must be > 0 seconds");
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
  const auto deadline = core::Deadline::after(timeout_);

  std::string store_host;
  int local_size = -1;
  const std::string token = config_.str("RINGREDUCE_TOKEN");
  // Where the stall monitor gets its own store client (TCP launches), or the store to share.
  std::function<std::shared_ptr<Store>()> stall_store;
  if (from) {
    // A split: rank and size from the parent's groups, its store (under a prefix of this split's
    // own), its data interface, its job's ranks on this host, its store server.
    rank_ = *options.rank;
    size_ = *options.world_size;
    store_ = std::make_shared<PrefixStore>(from->store, options.store_prefix);
    stall_store = [parent = from->stall_store, prefix = options.store_prefix] {
      return std::make_shared<PrefixStore>(parent(), prefix);
    };
    store_host = from->store_host;
    local_size = from->local_size;
    store_server_ = from->server;
  } else if (options.store) {
    // In-process: rank and size must be given; no launcher, no TCP store.
    if (!options.rank || !options.world_size)
      throw InvalidArgument("Options with a store need rank and world_size");
    rank_ = *options.rank;
    size_ = *options.world_size;
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
    size_ = launch.world_size;
    local_size = launch.local_size;
    if (launch.store_host.empty() || launch.store_port <= 0)
      throw InvalidArgument(
          "rank " + std::to_string(rank_) +
          ": no rendezvous address: set RINGREDUCE_ADDR=host:port (or MASTER_ADDR "
          "and MASTER_PORT) to the address of rank 0's host");
    store_host = launch.store_host;
    if (rank_ == 0 && config_.str("RINGREDUCE_STORE_SERVER") != "0") {
      // Rank 0 hosts the store on the address it was given, so it is reachable where the others
      // will look for it.
      store_server_ =
          std::make_shared<rendezvous::TcpStoreServer>(launch.store_host, launch.store_port, token);
    }
    auto tcp = rendezvous::connect_tcp_store(launch.store_host, launch.store_port, timeout_, token);
    store_ = std::make_shared<PrefixStore>(tcp, options.store_prefix);
    // A client of its own with a short timeout: when the store's host is stuck, a stall report
    // must fail fast, not hold up the communicator's destruction for RINGREDUCE_TIMEOUT.
    stall_store = [host = launch.store_host, port = launch.store_port,
                   prefix = options.store_prefix, token,
                   t = std::min(timeout_, std::chrono::milliseconds(5000))] {
      return std::make_shared<PrefixStore>(rendezvous::connect_tcp_store(host, port, t, token),
                                           prefix);
    };
    RR_LOG(info, rank_, "launched by ", launch.launcher, " as rank ", rank_, " of ", size_,
           "; store at ", launch.store_host, ":", launch.store_port);
  }
  stall_store_ = stall_store;
  store_host_ = store_host;
  if (rank_ == 0)
    RR_LOG(info, rank_,
           config_.has("RINGREDUCE_TOKEN")
               ? "RINGREDUCE_TOKEN is set: store and data connections prove they hold it"
               : "RINGREDUCE_TOKEN is not set: connections are not authenticated");
  if (core::log_enabled(core::LogLevel::info) && rank_ == 0)
    RR_LOG(info, rank_, "settings:\n", config_.dump());

  // A fresh id per communicator: a connection from another job, or from an earlier communicator
  // on the same ports, is refused at its hello.
  uint64_t comm_id = 0;
  if (rank_ == 0) {
    std::random_device rd;
    comm_id = (static_cast<uint64_t>(rd()) << 32) ^ rd() ^ static_cast<uint64_t>(getpid());
    store_->set("comm_id", to_bytes(std::to_string(comm_id)));
  } else {
    auto v = store_->get("comm_id", timeout_);
    comm_id = std::stoull(std::string(v.begin(), v.end()));
  }

  const int64_t channels = config_.integer("RINGREDUCE_CHANNELS");
  if (channels < 1 || channels > 64)
    throw InvalidArgument("rank " + std::to_string(rank_) +
                          ": RINGREDUCE_CHANNELS=" + std::to_string(channels) + " is not in 1..64");
  const int64_t nsocks = config_.integer("RINGREDUCE_NSOCKS");
  if (nsocks < 1 || nsocks > 16)
    throw InvalidArgument("rank " + std::to_string(rank_) +
                          ": RINGREDUCE_NSOCKS=" + std::to_string(nsocks) + " is not in 1..16");
  // Which ranks share a host: they may use shared memory, they share its cores, and the ring
  // keeps them next to each other.
  std::vector<std::string> hosts(static_cast<size_t>(size_));
  if (size_ > 1) {
    const std::string mine = config_.str("RINGREDUCE_HOST_ID").empty()
                                 ? transport::host_identity()
                                 : "id:" + config_.str("RINGREDUCE_HOST_ID");
    hosts = transport::exchange_host_identities(*store_, rank_, size_, mine, timeout_);
  }
  int same_host = 0;
  for (int q = 0; q < size_; ++q)
    same_host += hosts[static_cast<size_t>(q)] == hosts[static_cast<size_t>(rank_)] ? 1 : 0;
  if (local_size < 0) local_size = same_host;
  local_size_ = local_size;
  ring_order(hosts);
  // More ranks than cores on this host: polling steals the core from the rank that would
  // produce the data, so poll briefly and yield while doing it.
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = local_size > 0 && cores > 0 && local_size > cores;
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
  // Enough yields for every rank that shares this core to run twice.
  if (oversubscribed)
    args.engine.max_idle_yields = 4 * static_cast<int>((local_size + cores - 1) / cores);
  // Every rank routes each pair alike (the transport table over the same host identities):
  // shared memory between the ranks of a host, TCP between hosts.
  transport_ = transport::connect(args, *store_, deadline);
  transport_->set_describer([this](const transport::OpTag& t) { return describe(t); });
  tuner::Setup setup;
  setup.size = size_;
  setup.channels = static_cast<int>(channels);
  setup.link = transport_->traits();
  setup.window = transport_->window() != nullptr;
  setup.host_size = host_size_ < size_ ? host_size_ : 0;
  tuner_ = std::make_unique<tuner::Tuner>(config_, setup);
  if (same_host < size_)
    probe_network(hosts, deadline);
  else if (size_ > 1)
    probe_links(deadline);
  const double stall_s = config_.number("RINGREDUCE_STALL_WARN");
  if (!(stall_s >= 0))
    throw InvalidArgument("RINGREDUCE_STALL_WARN must be >= 0 seconds (0: no stall reports)");
  // Always there with 2+ ranks: besides the warnings it finds mismatches no message shows.
  if (size_ > 1)
    stall_ = std::make_unique<StallMonitor>(
        rank_, size_, std::chrono::milliseconds(static_cast<int64_t>(stall_s * 1000)),
        StallMonitor::Hooks{stall_store, [this](const transport::OpTag& t) { return describe(t); },
                            [this](const std::string& reason) {
                              transport_->interrupt(reason, static_cast<int>(ErrorCode::mismatch));
                            }});
  RR_LOG(info, rank_, "communicator ready: ", size_, " ranks over ", transport_->kinds_text());
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
