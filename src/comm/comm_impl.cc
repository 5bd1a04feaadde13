#include "comm/comm_impl.h"

#include <unistd.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "core/log.h"
#include "reduce/reduce.h"
#include "rendezvous/launch_env.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/error.h"
#include "transport/hybrid/hybrid_transport.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"
#include "transport/topology.h"

namespace ringreduce::detail {
namespace {

using algorithms::Collective;

// How long a rank that lost a peer listens for another peer's deeper cause before it reports the
// lost peer. The cause was sent before the lost peer even reacted to it, so it is normally there
// already; this only bounds the wait when there is none (a rank that really died).
constexpr std::chrono::milliseconds kCauseGrace{100};
// probe_network's bulk transfer: long enough to see a 1 Gbit/s link's rate (4.4 ms there), short
// enough to cost little at start-up.
constexpr size_t kProbeBytes = 512 << 10;

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

bool has_root(Collective c) {
  return c == Collective::broadcast || c == Collective::reduce;
}
bool has_op(Collective c) {
  return c == Collective::allreduce || c == Collective::reduce_scatter || c == Collective::reduce;
}

std::vector<uint8_t> to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}

// The rank a failure is pinned on: the peer of a PeerError (dead, stuck or failing), else none.
int blamed_rank(const Error& e) {
  const auto* pe = dynamic_cast<const PeerError*>(&e);
  return pe ? pe->peer() : -1;
}

// Rebuilds `e` with `prefix` in front of its message, keeping its type.
std::exception_ptr with_prefix(const Error& e, const std::string& prefix,
                               const std::string& suffix) {
  const std::string msg = prefix + e.what() + suffix;
  switch (e.code()) {
    case ErrorCode::timeout:
      return std::make_exception_ptr(TimeoutError(msg));
    case ErrorCode::peer: {
      const auto* pe = dynamic_cast<const PeerError*>(&e);
      return std::make_exception_ptr(PeerError(msg, pe ? pe->peer() : -1));
    }
    case ErrorCode::mismatch:
      return std::make_exception_ptr(MismatchError(msg));
    case ErrorCode::invalid_argument:
      return std::make_exception_ptr(InvalidArgument(msg));
    default:
      return std::make_exception_ptr(Error(msg, e.code()));
  }
}

}  // namespace

CommImpl::CommImpl(const Options& options) : config_(overrides_from(options)) {
  try {
    init(options);
  } catch (const Error& e) {
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
    // Start-up errors name the rank like every other error (once rank_ is known).
    const std::string prefix = "rank " + std::to_string(rank_) + ": ";
    if (std::string_view(e.what()).starts_with(prefix)) throw;
    std::rethrow_exception(with_prefix(e, prefix + "start-up: ", ""));
  }
}

void CommImpl::init(const Options& options) {
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
  if (options.store) {
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
          std::make_unique<rendezvous::TcpStoreServer>(launch.store_host, launch.store_port, token);
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
  const bool shm_allowed = size_ > 1 && config_.str("RINGREDUCE_SHM") != "0";
  std::vector<std::string> hosts(static_cast<size_t>(size_));
  if (size_ > 1) {
    const std::string mine = config_.str("RINGREDUCE_HOST_ID").empty()
                                 ? transport::host_identity()
                                 : "id:" + config_.str("RINGREDUCE_HOST_ID");
    hosts = transport::exchange_host_identities(*store_, rank_, size_, mine, timeout_);
  }
  std::vector<int> local_ranks;
  for (int q = 0; q < size_; ++q)
    if (hosts[static_cast<size_t>(q)] == hosts[static_cast<size_t>(rank_)])
      local_ranks.push_back(q);
  const int same_host = static_cast<int>(local_ranks.size());
  if (local_size < 0) local_size = same_host;
  ring_order(hosts);
  // More ranks than cores on this host: polling steals the core from the rank that would
  // produce the data, so poll briefly and yield while doing it.
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  const bool oversubscribed = local_size > 0 && cores > 0 && local_size > cores;
  const int spin_us = config_.has("RINGREDUCE_SPIN_US")
                          ? static_cast<int>(config_.integer("RINGREDUCE_SPIN_US"))
                          : (oversubscribed ? 20 : 50);
  // Enough yields for every rank that shares this core to run twice.
  const int max_idle_yields =
      oversubscribed ? 4 * static_cast<int>((local_size + cores - 1) / cores) : 0;
  auto make_shm = [&](std::vector<int> locals) {
    transport::shm::ShmOptions sopts;
    sopts.rank = rank_;
    sopts.size = size_;
    sopts.comm_id = comm_id;
    sopts.channels = static_cast<int>(channels);
    sopts.spin_us = spin_us;
    sopts.yield_while_spinning = oversubscribed;
    sopts.max_idle_yields = oversubscribed ? max_idle_yields : sopts.max_idle_yields;
    sopts.local_ranks = std::move(locals);
    sopts.token = token;
    return std::make_unique<transport::shm::ShmTransport>(sopts, *store_, deadline);
  };
  auto make_tcp = [&](std::vector<int> peers, bool striped) {
    transport::tcp::TcpOptions topts;
    // Forwards between shared memory and TCP move one frame per message, so a mixed
    // communicator keeps one connection per link.
    topts.nsocks = striped ? static_cast<int>(nsocks) : 1;
    topts.rank = rank_;
    topts.size = size_;
    topts.comm_id = comm_id;
    topts.channels = static_cast<int>(channels);
    topts.socket_buffer = static_cast<int>(config_.size("RINGREDUCE_SOCKET_BUFFER"));
    topts.congestion = config_.str("RINGREDUCE_SOCKET_CC");
    if (topts.congestion == "system") topts.congestion.clear();
    topts.yield_while_spinning = oversubscribed;
    topts.spin_us = spin_us;
    topts.store_host = store_host;
    topts.peers = std::move(peers);
    // Only detected identities say that a loopback address cannot reach a peer: hosts named
    // with RINGREDUCE_HOST_ID may be emulated on one machine, where loopback is the way.
    if (config_.str("RINGREDUCE_HOST_ID").empty()) {
      topts.other_host.resize(static_cast<size_t>(size_));
      for (int q = 0; q < size_; ++q)
        topts.other_host[static_cast<size_t>(q)] =
            hosts[static_cast<size_t>(q)] != hosts[static_cast<size_t>(rank_)];
    }
    return std::make_unique<transport::tcp::TcpTransport>(topts, config_, *store_, deadline);
  };
  // Every host decides alike, so each pair of ranks agrees on its link's kind: shared memory
  // between the ranks of a host, TCP between hosts.
  const bool use_shm = shm_allowed && same_host == size_;
  if (use_shm) {
    transport_ = make_shm({});
    link_kind_ = "shm";
  } else if (shm_allowed && same_host > 1) {
    std::vector<int> remote;
    for (int q = 0; q < size_; ++q)
      if (hosts[static_cast<size_t>(q)] != hosts[static_cast<size_t>(rank_)]) remote.push_back(q);
    auto shm = make_shm(local_ranks);
    auto tcp = make_tcp(std::move(remote), false);
    transport_ = std::make_unique<transport::hybrid::HybridTransport>(
        std::move(shm), std::move(tcp), local_ranks, oversubscribed, max_idle_yields, spin_us);
    link_kind_ = "shm+tcp";
  } else {
    transport_ = make_tcp({}, true);
    link_kind_ = "tcp";
  }
  transport_->set_describer([this](const transport::OpTag& t) { return describe(t); });
  tuner_ = std::make_unique<tuner::Tuner>(config_, size_, static_cast<int>(channels), use_shm,
                                          host_size_ < size_ ? host_size_ : 0);
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
  RR_LOG(info, rank_, "communicator ready: ", size_, " ranks over ", link_kind_);
}

namespace {

// probe_links: calls per batch of recursive doubling on 8 bytes and of the ring on kProbeBulk.
constexpr int kProbeSmallRounds = 16;
constexpr size_t kProbeBulk = 1 << 20;
constexpr int kProbeBulkRounds = 2;

// Seconds per byte of the reduce kernel: f32 sum of two cached 32 KiB inputs, 16 at a time (one
// takes about a microsecond, near the clock's granularity here), best of 4.
double measure_gamma() {
  constexpr size_t kCount = 8192;
  constexpr int kReps = 16;
  std::vector<float> a(kCount, 1.0f), b(kCount, 2.0f), out(kCount);
  double best = 1e9;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = core::Clock::now();
    for (int k = 0; k < kReps; ++k)
      reduce::combine(out.data(), a.data(), b.data(), kCount, DataType::f32, ReduceOp::sum);
    best = std::min(best, std::chrono::duration<double>(core::Clock::now() - t0).count() / kReps);
  }
  return best / static_cast<double>(kCount * sizeof(float));
}

}  // namespace

double CommImpl::time_probe_allreduce(algorithms::RunFn fn, float* buf, size_t count, int reps,
                                      const core::Deadline& deadline) {
  const bool shm = link_kind_ == "shm";
  algorithms::Context ctx{*transport_,
                          rank_,
                          size_,
                          deadline,
                          shm ? size_t{256} << 10 : size_t{512} << 10,
                          1,
                          shm,
                          0,
                          [this](size_t bytes) { return scratch(bytes); },
                          ring_.data(),
                          ring_pos_.data(),
                          host_size_};
  algorithms::Args args;
  args.send = args.recv = buf;
  args.count = count;
  const auto t0 = core::Clock::now();
  for (int i = 0; i < reps; ++i) fn(ctx, args);
  return std::chrono::duration<double>(core::Clock::now() - t0).count() / reps;
}

void CommImpl::probe_network(const std::vector<std::string>& hosts,
                             const core::Deadline& deadline) {
  // The partner: the first rank after rank 0 in the ring that is on another host.
  int partner = -1;
  const int p0 = ring_pos_[0];
  for (int k = 1; k < size_ && partner < 0; ++k) {
    const int q = ring_[static_cast<size_t>((p0 + k) % size_)];
    if (hosts[static_cast<size_t>(q)] != hosts[0]) partner = q;
  }
  if (partner < 0) return;
  cost_kind_ = "net";
  // Rank 0 decides whether a calibration file replaces the measurement and tells the partner.
  std::optional<tuner::Costs> file;
  if (rank_ == 0) {
    file = tuning_file_costs("net");
    const std::string plan = file ? "file" : "probe";
    store_->set("net_plan", std::vector<uint8_t>(plan.begin(), plan.end()));
  }
  bool probe = !file;
  if (rank_ != 0) {
    auto v = store_->get("net_plan", std::chrono::milliseconds(deadline.remaining_ms()));
    probe = std::string(v.begin(), v.end()) == "probe";
  }
  double alpha = 0, bandwidth = 0, gamma = 0;
  if (probe && (rank_ == 0 || rank_ == partner)) {
    // The all-zero tag: no user op has it (their sequence numbers start at 1), and it is what
    // the op lines of ranks that have not begun an op show, so shared-memory peers watching this
    // rank's op line see no mismatch.
    transport::OpTag zero;
    zero.root = 0;  // every field zero, as in an op line nobody has written
    transport_->begin_op(zero);
    auto& link = transport_->link(rank_ == 0 ? partner : 0, 0);
    std::vector<char> buf(kProbeBytes);
    auto round = [&](size_t out, size_t back) {
      transport::Completion c;
      const auto t0 = core::Clock::now();
      if (rank_ == 0) {
        link.send(buf.data(), out, &c);
        link.recv(buf.data(), back, &c);
      } else {
        link.recv(buf.data(), out, &c);
        transport_->wait(c, deadline);
        link.send(buf.data(), back, &c);
      }
      transport_->wait(c, deadline);
      return std::chrono::duration<double>(core::Clock::now() - t0).count();
    };
    // Latency: the best of a few 8-byte round trips (the first also warms both ranks up).
    double rtt = 1e9;
    for (int i = 0; i < 5; ++i) rtt = std::min(rtt, round(8, 8));
    // Bandwidth: the best of two one-way bulk transfers, each acknowledged by 8 bytes.
    double bulk = 1e9;
    for (int i = 0; i < 2; ++i) bulk = std::min(bulk, round(kProbeBytes, 8));
    alpha = rtt / 2;
    bandwidth = static_cast<double>(kProbeBytes) / std::max(bulk - rtt, 1e-7);
    if (rank_ == 0) gamma = measure_gamma();  // only rank 0's numbers are shared
  } else if (file) {
    alpha = file->link.alpha;
    bandwidth = 1.0 / file->link.beta;
    gamma = file->gamma;
  }
  if (probe) {
    // Then every rank: recursive doubling on 8 bytes gives the step latency as the algorithms
    // see it with every rank stepping at once (the pair's round trips alone miss the other
    // ranks' share of the links, and of the cores where hosts share them): alpha is the larger.
    transport::OpTag zero;
    zero.root = 0;
    transport_->begin_op(zero);
    float small[2] = {1.0f, 1.0f};
    time_probe_allreduce(algorithms::recursive_doubling_allreduce, small, 2, 4, deadline);
    double rd = 1e9;
    const size_t batches = std::max<size_t>(1, config_.size("RINGREDUCE_PROBE_BATCHES"));
    for (size_t b = 0; b < batches; ++b)
      rd = std::min(rd, time_probe_allreduce(algorithms::recursive_doubling_allreduce, small, 2,
                                             kProbeSmallRounds, deadline));
    alpha = std::max(alpha, rd / tuner::rd_steps(size_));
  }
  if (rank_ == 0) {
    std::ostringstream v;
    v.precision(17);
    v << alpha << " " << bandwidth << " " << gamma;
    const std::string text = v.str();
    store_->set("net_probe", std::vector<uint8_t>(text.begin(), text.end()));
  } else {
    auto v = store_->get("net_probe", std::chrono::milliseconds(deadline.remaining_ms()));
    std::istringstream in(std::string(v.begin(), v.end()));
    in >> alpha >> bandwidth >> gamma;
  }
  tuner::Costs costs = tuner::Tuner::default_costs("net");
  costs.link = {alpha, 1.0 / bandwidth, /*overlap=*/true};
  if (gamma > 0) costs.gamma = gamma;
  tuner_->set_costs(costs);
  RR_LOG(info, rank_, "network between hosts (rank 0 <-> rank ", partner, "): latency ",
         alpha * 1e6, " us, ", bandwidth / 1e9, " GB/s");
}

std::optional<tuner::Costs> CommImpl::tuning_file_costs(const std::string& kind) const {
  const std::string path = config_.str("RINGREDUCE_TUNING_FILE");
  if (path.empty()) return std::nullopt;
  std::ifstream in(path);
  if (!in)
    throw InvalidArgument("rank " + std::to_string(rank_) + ": RINGREDUCE_TUNING_FILE '" + path +
                          "' cannot be read");
  // Lines: "link KIND RANKS ALPHA_S BETA_S_PER_BYTE [PI_S_PER_BYTE]" and "gamma S_PER_BYTE";
  // '#' comments.
  std::optional<tuner::Costs> found;
  double gamma = 0;
  std::string line;
  int lineno = 0;
  while (std::getline(in, line)) {
    ++lineno;
    if (line.empty() || line[0] == '#') continue;
    std::istringstream f(line);
    std::string what;
    f >> what;
    if (what == "link") {
      std::string k;
      int ranks = 0;
      double alpha = 0, beta = 0, pi = 0;
      if (!(f >> k >> ranks >> alpha >> beta) || alpha < 0 || beta <= 0)
        throw InvalidArgument(
            "rank " + std::to_string(rank_) + ": RINGREDUCE_TUNING_FILE '" + path + "' line " +
            std::to_string(lineno) +
            ": expected 'link KIND RANKS ALPHA_S BETA_S_PER_BYTE [PI_S_PER_BYTE]'");
      if (!(f >> pi)) pi = 0;
      if (k == kind && ranks == size_) {
        found = tuner::Tuner::default_costs(kind);
        found->link.alpha = alpha;
        found->link.beta = beta;
        found->pi = pi;
      }
    } else if (what == "gamma") {
      if (!(f >> gamma) || gamma <= 0)
        throw InvalidArgument("rank " + std::to_string(rank_) + ": RINGREDUCE_TUNING_FILE '" +
                              path + "' line " + std::to_string(lineno) +
                              ": expected 'gamma S_PER_BYTE'");
    } else {
      throw InvalidArgument("rank " + std::to_string(rank_) + ": RINGREDUCE_TUNING_FILE '" + path +
                            "' line " + std::to_string(lineno) + ": unknown entry '" + what + "'");
    }
  }
  if (found && gamma > 0) found->gamma = gamma;
  return found;
}

void CommImpl::probe_links(const core::Deadline& deadline) {
  transport::OpTag zero;  // as in probe_network: no op has it, and op lines show it
  zero.root = 0;
  transport_->begin_op(zero);
  const int pos = ring_pos_[static_cast<size_t>(rank_)];
  auto& right = transport_->link(ring_[static_cast<size_t>((pos + 1) % size_)], 0);
  auto& left = transport_->link(ring_[static_cast<size_t>((pos + size_ - 1) % size_)], 0);
  // Rank 0's values go around the ring, rank 0 first: {from file, alpha, beta, gamma, pi}.
  auto pass = [&](double(&v)[5]) {
    transport::Completion c;
    if (rank_ == 0) {
      right.send(v, sizeof v, &c);
      left.recv(v, sizeof v, &c);
    } else {
      left.recv(v, sizeof v, &c);
      transport_->wait(c, deadline);
      right.send(v, sizeof v, &c);
    }
    transport_->wait(c, deadline);
  };
  double v[5] = {0, 0, 0, 0, 0};
  if (rank_ == 0) {
    try {
      if (auto file = tuning_file_costs(link_kind_))
        v[0] = 1, v[1] = file->link.alpha, v[2] = file->link.beta, v[3] = file->gamma,
        v[4] = file->pi;
    } catch (const InvalidArgument&) {
      // The others wait for rank 0's values: tell them to fail too, then fail with the reason.
      v[0] = -1;
      pass(v);
      throw;
    }
  }
  pass(v);
  if (v[0] < 0)
    throw InvalidArgument("rank " + std::to_string(rank_) + ": RINGREDUCE_TUNING_FILE '" +
                          config_.str("RINGREDUCE_TUNING_FILE") +
                          "' could not be used on rank 0 (rank 0's error says why)");
  const bool from_file = v[0] > 0;
  if (!from_file) {
    // The probe runs three of the algorithms themselves, on the op-less zero tag: recursive
    // doubling on 8 bytes is lg N dependent exchange steps and nothing else (alpha: the time of
    // a step as the algorithms see it, every rank stepping, scheduler rounds included where
    // ranks outnumber cores); the ring on 1 MiB is the bandwidth term 2(N-1)/N K beta on top of
    // its 2(N-1) alphas and (N-1)/N K gammas, which gives beta; Rabenseifner on 1 MiB gives pi.
    std::vector<float> small(2, 1.0f), bulk(kProbeBulk / sizeof(float), 1.0f);
    auto run = [&](algorithms::RunFn fn, std::vector<float>& buf, int reps) {
      return time_probe_allreduce(fn, buf.data(), buf.size(), reps, deadline);
    };
    // The first runs wake every rank and touch every FIFO slot and the scratch space.
    run(algorithms::recursive_doubling_allreduce, small, 4);
    run(algorithms::ring_allreduce, bulk, 2);
    run(algorithms::rabenseifner_allreduce, bulk, 1);
    double rd = 1e9, ring = 1e9, rab = 1e9;
    const size_t batches = std::max<size_t>(1, config_.size("RINGREDUCE_PROBE_BATCHES"));
    for (size_t b = 0; b < batches; ++b) {
      rd = std::min(rd, run(algorithms::recursive_doubling_allreduce, small, kProbeSmallRounds));
      ring = std::min(ring, run(algorithms::ring_allreduce, bulk, kProbeBulkRounds));
      rab = std::min(rab, run(algorithms::rabenseifner_allreduce, bulk, kProbeBulkRounds));
    }
    // Only rank 0's numbers count (they go round the ring): the others only ran.
    if (rank_ == 0) {
      const double gamma = measure_gamma();
      const double alpha = std::max(rd / tuner::rd_steps(size_), 1e-8);
      const double n = size_, k = static_cast<double>(kProbeBulk);
      const double wire = 2 * (n - 1) / n * k;
      const double beta =
          std::max(ring - 2 * (n - 1) * alpha - (n - 1) / n * k * gamma, 0.05 * ring) / wire;
      // Rabenseifner moves the ring's bytes in fewer steps, but each step's result goes through
      // the output before it is sent on: what it takes beyond the model without that is pi.
      tuner::Costs probe_costs;
      probe_costs.link = {alpha, beta, false};
      probe_costs.gamma = gamma;
      const int pof2 = algorithms::largest_power_of_two(size_);
      const double stepped = 2.0 * (pof2 - 1) / pof2 * k + (pof2 == size_ ? 0 : 2 * k);
      const double pi =
          std::max(0.0, rab - tuner::rabenseifner_allreduce_cost(probe_costs, size_, k)) / stepped;
      v[1] = alpha;
      v[2] = beta;
      v[3] = gamma;
      v[4] = pi;
    }
    pass(v);
  }
  tuner::Costs costs = tuner::Tuner::default_costs(link_kind_);
  costs.link.alpha = v[1];
  costs.link.beta = v[2];
  if (v[3] > 0) costs.gamma = v[3];
  costs.pi = v[4];
  tuner_->set_costs(costs);
  cost_kind_ = link_kind_;
  RR_LOG(info, rank_, "links (", link_kind_, ", ",
         from_file ? "from RINGREDUCE_TUNING_FILE" : "measured", "): step latency ",
         costs.link.alpha * 1e6, " us, ", 1e-9 / costs.link.beta, " GB/s per link; reduce ",
         1e-9 / costs.gamma, " GB/s; unfused steps +", costs.pi * 1e12, " ps/B");
}

std::string CommImpl::tuning() const {
  const tuner::Costs& c = tuner_->costs();
  std::ostringstream out;
  out.precision(6);
  out << "link " << (cost_kind_.empty() ? link_kind_ : cost_kind_) << " " << size_ << " "
      << c.link.alpha << " " << c.link.beta << " " << c.pi << "\n"
      << "gamma " << c.gamma << "\n";
  return out.str();
}

CommImpl::~CommImpl() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    // A running op is interrupted; the progress thread then leaves without starting another.
    if (driving_)
      transport_->interrupt("communicator destroyed", static_cast<int>(ErrorCode::aborted));
    progress_cv_.notify_all();
  }
  if (progress_thread_.joinable()) progress_thread_.join();
  // Ops nobody will run any more fail, so that their Work returns instead of waiting forever.
  std::vector<std::shared_ptr<OpState>> failed;
  std::unique_lock<std::mutex> lk(mu_);
  if (!queue_.empty()) {
    const std::string msg = "rank " + std::to_string(rank_) + ": communicator destroyed with " +
                            std::to_string(queue_.size()) + " op(s) pending";
    auto err = std::make_exception_ptr(Error(msg, ErrorCode::aborted));
    for (auto& op : queue_) {
      op->error = err;
      op->finished.store(true);
      failed.push_back(op);
    }
    queue_.clear();
    // The peers are waiting for those ops: tell them why they will not happen.
    if (!driving_) transport_->abort(static_cast<int>(ErrorCode::aborted), -1, msg);
    done_cv_.notify_all();
  }
  lk.unlock();
  for (auto& op : failed) fire_callback(*op);
}

std::string CommImpl::describe(const transport::OpTag& t) const {
  const auto kind = static_cast<Collective>(t.kind);
  std::ostringstream s;
  s << algorithms::collective_name(kind) << " #" << t.seq;
  if (kind != Collective::barrier) {
    s << " (" << dtype_name(static_cast<DataType>(t.dtype)) << " x " << t.count;
    if (has_op(kind)) s << ", " << op_name(static_cast<ReduceOp>(t.op));
    if (has_root(kind)) s << ", root " << t.root;
    s << ")";
  }
  return s.str();
}

void CommImpl::validate(const OpState& op) const {
  const algorithms::Args& a = op.args;
  auto bad = [&](const std::string& why) {
    throw InvalidArgument("rank " + std::to_string(rank_) + ": " + describe(op.tag) + ": " + why);
  };
  if (static_cast<int>(a.dtype) >= kNumDataTypes) bad("unknown data type");
  if (static_cast<int>(a.op) >= kNumReduceOps) bad("unknown reduce op");
  if (has_root(a.kind) && (a.root < 0 || a.root >= size_))
    bad("root " + std::to_string(a.root) + " is not a rank of this communicator (0.." +
        std::to_string(size_ - 1) + ")");
  const size_t elem = dtype_size(a.dtype);
  if (a.count > (SIZE_MAX / elem) / static_cast<size_t>(size_)) bad("count is too large");
  if (a.count > 0 && a.kind != Collective::barrier) {
    const bool needs_send = a.kind != Collective::broadcast || a.root == rank_;
    const bool needs_recv = a.kind != Collective::reduce || a.root == rank_;
    if (needs_send && a.send == nullptr) bad("send buffer is null");
    if (needs_recv && a.recv == nullptr) bad("receive buffer is null");
  }
  if (a.kind == Collective::alltoall && size_ > 1 && a.count > 0 && a.send == a.recv)
    bad("alltoall cannot run in place (send and receive buffers are the same)");
  // In place means recv = send + rank * count (NCCL's convention); recv == send would overwrite
  // block 0 while it may still be on its way to the next rank.
  if (a.kind == Collective::reduce_scatter && size_ > 1 && a.count > 0 && a.send == a.recv &&
      rank_ != 0)
    bad("reduce_scatter in place needs recv = send + rank * recv_count, not recv = send");
}

void CommImpl::prepare(OpState& op, const algorithms::Args& args, const CallOptions& call,
                       bool async) {
  op.args = args;
  op.async = async;
  op.comm = this;
  op.timeout = call.timeout.value_or(timeout_);
  op.plan = tuner_->choose(args);
  auto& t = op.tag;
  t.count = args.count;
  t.kind = static_cast<uint8_t>(args.kind);
  t.dtype = static_cast<uint8_t>(args.dtype);
  t.op = has_op(args.kind) ? static_cast<uint8_t>(args.op) : 0;
  t.root = has_root(args.kind) ? args.root : -1;
  t.algo = op.plan.algorithm->id;
  t.segment_bytes = op.plan.segment_bytes;
  t.channels = static_cast<uint16_t>(op.plan.channels);
  t.flags = op.plan.sliced ? transport::kTagSliced : 0;
}

void CommImpl::number(OpState& op) {
  op.tag.seq = next_seq_++;
  try {
    validate(op);
  } catch (...) {
    // A bad argument fails this call only, and the call is not issued: the sequence numbers stay
    // aligned with the other ranks, whose matching call then reports a mismatch naming this rank
    // or times out.
    --next_seq_;
    throw;
  }
}

void CommImpl::call(const algorithms::Args& args, const CallOptions& call) {
  OpState op;
  prepare(op, args, call, /*async=*/false);
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (driving_ || !queue_.empty()) {
      // Earlier async ops are queued or running: this one takes its turn after them.
      lk.unlock();
      auto queued = submit(args, call, /*async=*/false);
      wait(*queued, std::nullopt);
      return;
    }
    number(op);
    if (aborted_.load()) std::rethrow_exception(abort_error_);
    driving_ = true;
  }
  const std::exception_ptr error = execute(op);
  {
    std::lock_guard<std::mutex> lk(mu_);
    release_driver();
  }
  if (error) std::rethrow_exception(error);
}

std::shared_ptr<OpState> CommImpl::submit(const algorithms::Args& args, const CallOptions& call,
                                          bool async) {
  auto op = std::make_shared<OpState>();
  prepare(*op, args, call, async);
  std::unique_lock<std::mutex> lk(mu_);
  try {
    number(*op);
  } catch (...) {
    op->error = std::current_exception();
    op->finished.store(true);
    op->fired = true;  // nobody else has op yet: a later then() runs at once
    return op;
  }
  if (aborted_.load()) {
    op->error = abort_error_;
    op->finished.store(true);
    op->fired = true;
    return op;
  }
  queue_.push_back(op);
  if (async) {
    if (!progress_thread_.joinable()) progress_thread_ = std::thread([this] { progress_loop(); });
    if (!driving_) progress_cv_.notify_one();
  }
  return op;
}

bool CommImpl::wait(OpState& op, std::optional<std::chrono::milliseconds> timeout) {
  const auto until = timeout ? core::Clock::now() + *timeout : core::Clock::time_point::max();
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (op.finished.load()) {
      if (op.error) std::rethrow_exception(op.error);
      return true;
    }
    // A bounded wait must not start running an op it cannot stop; it leaves that to the progress
    // thread.
    if (!driving_ && !timeout) {
      driving_ = true;
      lk.unlock();
      drive(&op);
      lk.lock();
      release_driver();
      continue;
    }
    if (!driving_ && timeout) {
      if (!progress_thread_.joinable()) progress_thread_ = std::thread([this] { progress_loop(); });
      progress_cv_.notify_one();  // make sure the progress thread looks at the queue
    }
    ++waiters_;
    if (timeout) {
      const bool expired = done_cv_.wait_until(lk, until) == std::cv_status::timeout;
      --waiters_;
      if (expired && !op.finished.load()) return false;
    } else {
      done_cv_.wait(lk);
      --waiters_;
    }
  }
}

void CommImpl::release_driver() {
  driving_ = false;
  if (waiters_ > 0) done_cv_.notify_all();
  if (progress_thread_.joinable() && !queue_.empty() && queue_.front()->async)
    progress_cv_.notify_one();
}

void CommImpl::drive(OpState* target) {
  for (;;) {
    std::shared_ptr<OpState> op;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (target && target->finished.load()) return;
      if (queue_.empty() || stop_) return;
      op = queue_.front();
      if (!target && !op->async) return;  // its caller drives it
    }
    run(*op);
  }
}

void CommImpl::run(OpState& op) {
  finish(op, execute(op));
}

std::exception_ptr CommImpl::execute(OpState& op) {
  std::exception_ptr error;
  if (aborted_.load()) {
    std::string what;
    {
      std::lock_guard<std::mutex> lk(mu_);
      error = abort_error_;
    }
    // abort() from another thread only interrupts a driver inside the transport; one that was
    // between ops arrives here, and the transport must still fail and tell the peers.
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      transport_->abort(static_cast<int>(e.code()), blamed_rank(e), e.what());
    }
  } else {
    // Built only when needed: a small allreduce must not pay for formatting its description.
    auto prefix = [&] { return "rank " + std::to_string(rank_) + ": " + describe(op.tag) + ": "; };
    if (stall_) stall_->op_started(op.tag);
    try {
      transport_->begin_op(op.tag, op.plan.stream_output);
      algorithms::Context ctx{*transport_,
                              rank_,
                              size_,
                              core::Deadline::after_first_use(op.timeout),
                              op.plan.segment_bytes,
                              op.plan.channels,
                              op.plan.sliced,
                              op.tag.seq,
                              [this](size_t bytes) { return scratch(bytes); },
                              ring_.data(),
                              ring_pos_.data(),
                              host_size_};
      if (core::log_enabled(core::LogLevel::trace)) {
        const auto started = core::Clock::now();
        RR_LOG(trace, rank_, describe(op.tag), ": ", op.plan.algorithm->name, ", segments of ",
               op.plan.segment_bytes, " B, ", op.plan.channels, " channel(s)");
        op.plan.algorithm->run(ctx, op.args);
        RR_LOG(trace, rank_, describe(op.tag), ": done in ",
               static_cast<int64_t>(core::seconds_since(started) * 1e6), " us");
      } else {
        op.plan.algorithm->run(ctx, op.args);
      }
    } catch (const Error& e) {
      std::string suffix;
      // A peer's timeout notice already says which deadline ran out.
      if (e.code() == ErrorCode::timeout &&
          std::string_view(e.what()).find(" (timeout ") == std::string_view::npos) {
        std::ostringstream s;
        s << " (timeout " << static_cast<double>(op.timeout.count()) / 1000.0 << " s)";
        suffix = s.str();
      }
      error = with_prefix(e, prefix(), suffix);
      if (stall_) {
        std::ostringstream how;
        if (e.code() == ErrorCode::timeout)
          how << "timed out after " << static_cast<double>(op.timeout.count()) / 1000.0 << " s";
        else
          how << "failed (" << e.what() << ")";
        stall_->op_failed(op.tag, e.code() == ErrorCode::timeout, how.str());
      }
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(Error(prefix() + e.what()));
    }
    if (stall_) stall_->op_ended();
    if (error) {
      // After a failure the links are in an unknown state: fail the communicator for good, and
      // tell the peers why so that they report this cause rather than a closed connection.
      std::string what;
      int code = static_cast<int>(ErrorCode::internal);
      int blamed = -1;
      try {
        std::rethrow_exception(error);
      } catch (const Error& e) {
        what = e.what();
        code = static_cast<int>(e.code());
        blamed = blamed_rank(e);
      }
      if (code == static_cast<int>(ErrorCode::peer)) {
        // A neighbour that went away may have been failed by a mismatch or an abort elsewhere
        // that it could not pass on; if another peer tells us, that cause is the error.
        if (auto cause = transport_->find_cause(kCauseGrace, blamed)) {
          try {
            std::rethrow_exception(cause);
          } catch (const Error& e) {
            error = with_prefix(e, prefix(), "");
            what = prefix() + e.what();
            code = static_cast<int>(e.code());
            blamed = blamed_rank(e);
          }
        }
      }
      RR_LOG(warn, rank_, what);
      transport_->abort(code, blamed, what);
      std::lock_guard<std::mutex> lk(mu_);
      if (!abort_error_) abort_error_ = error;
      aborted_.store(true);
    }
  }
  return error;
}

void CommImpl::finish(OpState& op, std::exception_ptr error) {
  std::shared_ptr<OpState> keep;  // op lives until its callback has run
  {
    std::lock_guard<std::mutex> lk(mu_);
    op.error = error;
    op.finished.store(true);
    if (!queue_.empty() && queue_.front().get() == &op) {
      keep = std::move(queue_.front());
      queue_.pop_front();
    }
    if (waiters_ > 0) done_cv_.notify_all();
  }
  // Outside mu_: a callback may issue the next op (a torch future's continuation does).
  fire_callback(op);
}

void fire_callback(OpState& op) {
  std::function<void(std::exception_ptr)> fn;
  {
    std::lock_guard<std::mutex> lk(op.callback_mu);
    if (op.fired) return;
    op.fired = true;
    fn = std::move(op.callback);
  }
  if (fn) fn(op.error);
}

void CommImpl::progress_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    if (!driving_ && !queue_.empty() && queue_.front()->async) {
      driving_ = true;
      lk.unlock();
      drive(nullptr);
      lk.lock();
      release_driver();
      continue;
    }
    progress_cv_.wait(lk);
  }
}

void CommImpl::abort(const std::string& reason) {
  const std::string msg = "rank " + std::to_string(rank_) + ": aborted: " + reason;
  std::unique_lock<std::mutex> lk(mu_);
  if (aborted_.load()) return;
  abort_error_ = std::make_exception_ptr(Error(msg, ErrorCode::aborted));
  aborted_.store(true);
  // Queued ops that have not started fail now; the running one is interrupted and fails when
  // its driver notices (the transport wakes it).
  std::shared_ptr<OpState> running = driving_ && !queue_.empty() ? queue_.front() : nullptr;
  std::vector<std::shared_ptr<OpState>> failed;
  for (auto& op : queue_) {
    if (op == running) continue;
    op->error = abort_error_;
    op->finished.store(true);
    failed.push_back(op);
  }
  queue_.clear();
  if (running) queue_.push_back(running);
  if (driving_) {
    transport_->interrupt(msg, static_cast<int>(ErrorCode::aborted));
  } else {
    driving_ = true;
    lk.unlock();
    transport_->abort(static_cast<int>(ErrorCode::aborted), -1, msg);
    lk.lock();
    release_driver();
  }
  done_cv_.notify_all();
  lk.unlock();
  for (auto& op : failed) fire_callback(*op);
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

void* CommImpl::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_ = std::make_unique_for_overwrite<char[]>(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

}  // namespace ringreduce::detail
