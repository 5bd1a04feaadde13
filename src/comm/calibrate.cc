// Calibration at start-up: the link probe (one host) and the network probe (several hosts) that
// give the tuner its costs, or RINGREDUCE_TUNING_FILE's costs in their place; and tuning(), which
// writes them in that file's format.
#include <fstream>
#include <sstream>

#include "comm/comm_impl.h"
#include "core/log.h"
#include "reduce/reduce.h"
#include "reduce/wire.h"
#include "rendezvous/join.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {
namespace {

// probe_network's bulk transfer: long enough to see a 1 Gbit/s link's rate (4.4 ms there), short
// enough to cost little at start-up.
constexpr size_t kProbeBytes = 512 << 10;

// probe_links: calls per batch of recursive doubling on 8 bytes and of the ring on kProbeBulk.
constexpr int kProbeSmallRounds = 16;
constexpr size_t kProbeBulk = 1 << 20;
constexpr int kProbeBulkRounds = 2;
// Above this many ranks the bandwidth probe is a shift (each rank sends kProbeBulk to the next
// in the ring, one step) instead of a ring allreduce (2(N-1) steps): at 256 ranks on two cores
// the ring probe alone took minutes, every step waiting for every rank to be scheduled.
constexpr int kRingProbeMaxRanks = 32;
// Ranks per core from which a wide communicator's bandwidth probe is skipped (probe_links).
constexpr long kCrowdedRanksPerCore = 8;

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

// Seconds per float32 byte to code it as bf16 and decode it again added to a sum (what a coded
// collective pays per byte beyond its links: Costs::codec), on cached data as measure_gamma.
double measure_codec() {
  constexpr size_t kCount = 8192;
  constexpr int kReps = 16;
  std::vector<float> a(kCount, 1.5f), sum(kCount, 0.0f);
  std::vector<uint8_t> coded(reduce::wire_bytes(Wire::bf16, kCount));
  double best = 1e9;
  for (int i = 0; i < 4; ++i) {
    const auto t0 = core::Clock::now();
    for (int k = 0; k < kReps; ++k) {
      reduce::wire_encode(coded.data(), a.data(), kCount, Wire::bf16);
      reduce::wire_decode(sum.data(), sum.data(), coded.data(), kCount, Wire::bf16);
    }
    best = std::min(best, std::chrono::duration<double>(core::Clock::now() - t0).count() / kReps);
  }
  return best / static_cast<double>(kCount * sizeof(float));
}

}  // namespace

double CommImpl::time_probe_allreduce(algorithms::RunFn fn, float* buf, size_t count, int reps,
                                      const core::Deadline& deadline) {
  algorithms::Args args;
  args.send = args.recv = buf;
  args.count = count;
  return time_probe_op(fn, args, reps, deadline);
}

double CommImpl::time_probe_op(algorithms::RunFn fn, algorithms::Args args, int reps,
                               const core::Deadline& deadline) {
  const transport::KindTraits& traits = transport_->traits();
  // The probes are allreduces: a ring step carries K / N, ordered as a call of that size would be.
  const size_t step_bytes = args.count * dtype_size(args.dtype) / static_cast<size_t>(size_);
  algorithms::Context ctx{*transport_,
                          rank_,
                          size_,
                          deadline,
                          traits.segment_bytes,
                          1,
                          traits.sliced(step_bytes),
                          0,
                          scratch_fn(),
                          ring_.data(),
                          ring_pos_.data(),
                          host_size_};
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
  // Rank 0 decides whether a calibration file replaces the measurement, and how many calls of
  // recursive doubling every rank times, and tells them all: the counts must agree on every
  // rank, and only rank 0's crowding is known to all alike. Wide communicators time fewer calls,
  // as on one host (probe_links); where ranks crowd rank 0's cores, one: there a call of 8 bytes
  // is lg N scheduler rounds, ~1.3 s at 1,024 ranks over 8 emulated hosts on two cores, and the
  // 52 calls of a narrow probe took 70 s of start-up.
  std::optional<tuner::Costs> file;
  int warmups = 4, rounds = kProbeSmallRounds;
  size_t batches = std::max<size_t>(1, config_.size("RINGREDUCE_PROBE_BATCHES"));
  if (rank_ == 0) {
    file = tuning_file_costs("net");
    if (size_ > kRingProbeMaxRanks) {
      warmups = 1;
      rounds = local_size_ >= kCrowdedRanksPerCore * cores_ ? 1 : kProbeSmallRounds / 4;
      if (!config_.has("RINGREDUCE_PROBE_BATCHES")) batches = 1;
    }
    const std::string plan = file ? "file"
                                  : "probe " + std::to_string(warmups) + " " +
                                        std::to_string(batches) + " " + std::to_string(rounds);
    startup_store_->set("net_plan", std::vector<uint8_t>(plan.begin(), plan.end()));
  }
  bool probe = !file;
  if (rank_ != 0) {
    auto v = startup_store_->get("net_plan", std::chrono::milliseconds(deadline.remaining_ms()));
    std::istringstream plan(std::string(v.begin(), v.end()));
    std::string what;
    plan >> what >> warmups >> batches >> rounds;
    probe = what == "probe";
  }
  double alpha = 0, bandwidth = 0, gamma = 0, codec = 0;
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
    if (rank_ == 0) gamma = measure_gamma(), codec = measure_codec();  // only rank 0's are shared
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
    time_probe_allreduce(algorithms::recursive_doubling_allreduce, small, 2, warmups, deadline);
    double rd = 1e9;
    for (size_t b = 0; b < batches; ++b)
      rd = std::min(rd, time_probe_allreduce(algorithms::recursive_doubling_allreduce, small, 2,
                                             rounds, deadline));
    alpha = std::max(alpha, rd / algorithms::rd_steps(size_));
  }
  if (rank_ == 0) {
    std::ostringstream v;
    v.precision(17);
    v << alpha << " " << bandwidth << " " << gamma << " " << codec;
    const std::string text = v.str();
    startup_store_->set("net_probe", std::vector<uint8_t>(text.begin(), text.end()));
  } else {
    auto v = startup_store_->get("net_probe", std::chrono::milliseconds(deadline.remaining_ms()));
    std::istringstream in(std::string(v.begin(), v.end()));
    in >> alpha >> bandwidth >> gamma >> codec;
  }
  tuner::Costs costs = tuner::Tuner::default_costs(transport_->traits());
  costs.link = {alpha, 1.0 / bandwidth, /*overlap=*/true};
  if (gamma > 0) costs.gamma = gamma;
  costs.codec = codec > 0 ? codec : 2 * costs.gamma;
  tuner_->set_costs(costs);
  RR_LOG(info, tune, rank_, "network between hosts (rank 0 <-> rank ", partner, "): latency ",
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
        found = tuner::Tuner::default_costs(transport_->traits());
        // Across hosts the kernel overlaps a step's latency with the last one's transfer.
        found->link = {alpha, beta, /*overlap=*/kind == "net"};
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
  const tuner::Costs defaults = tuner::Tuner::default_costs(transport_->traits());
  transport::OpTag zero;  // as in probe_network: no op has it, and op lines show it
  zero.root = 0;
  transport_->begin_op(zero);
  const int pos = ring_pos_[static_cast<size_t>(rank_)];
  auto& right = transport_->link(ring_[static_cast<size_t>((pos + 1) % size_)], 0);
  auto& left = transport_->link(ring_[static_cast<size_t>((pos + size_ - 1) % size_)], 0);
  // Rank 0's values reach every rank: {from file, alpha, beta, gamma, pi}, summed by recursive
  // doubling with every other rank's zeros (exact), lg N steps. (They went around the ring
  // first: N steps one after another, each waiting for its rank to be scheduled.)
  auto pass = [&](double(&v)[6]) {
    if (rank_ != 0) std::fill(std::begin(v), std::end(v), 0.0);
    algorithms::Args a;
    a.send = a.recv = v;
    a.count = 6;
    a.dtype = DataType::f64;
    time_probe_op(algorithms::recursive_doubling_allreduce, a, 1, deadline);
  };
  double v[6] = {0, 0, 0, 0, 0, 0};
  if (rank_ == 0) {
    try {
      if (auto file = tuning_file_costs(transport_->traits().name))
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
  bool crowded = false;  // beta was not measured (below)
  if (!from_file) {
    // The probe runs three of the algorithms themselves, on the op-less zero tag: recursive
    // doubling on 8 bytes is lg N dependent exchange steps and nothing else (alpha: the time of
    // a step as the algorithms see it, every rank stepping, scheduler rounds included where
    // ranks outnumber cores); the ring on 1 MiB is the bandwidth term 2(N-1)/N K beta on top of
    // its 2(N-1) alphas and (N-1)/N K gammas, which gives beta; Rabenseifner on 1 MiB gives pi.
    const bool wide = size_ > kRingProbeMaxRanks;
    // Where many ranks share each core a step waits for a scheduler round (ms), and a shift of
    // 1 MiB, ~0.1 ms of copying, shows nothing but that: at 256 ranks on two cores it measured
    // 20 ms a shift, so beta was its 5% floor, and its three shifts (first touches of every
    // rank's ring FIFO among them) took 2-3 s of start-up. Such communicators keep the kind's
    // default beta. (The probe runs on one host: every rank counts the same ranks and cores.)
    crowded = wide && size_ >= kCrowdedRanksPerCore * cores_;
    // The ring and Rabenseifner reduce their inputs, which must be numbers; a shift only moves
    // bytes, so it sends from and receives into one buffer left as the allocator gives it: at 256
    // ranks on two cores filling 2 MiB per rank (and the page faults behind it) took ~1 s.
    std::vector<float> small(2, 1.0f), bulk(wide ? 0 : kProbeBulk / sizeof(float), 1.0f);
    auto run = [&](algorithms::RunFn fn, std::vector<float>& buf, int reps) {
      return time_probe_allreduce(fn, buf.data(), buf.size(), reps, deadline);
    };
    std::unique_ptr<char[]> shifted(wide && !crowded ? new char[kProbeBulk] : nullptr);
    // Seconds per shift of kProbeBulk bytes to the right neighbour (wide communicators).
    auto shift = [&](int reps) {
      const size_t seg = transport_->traits().segment_bytes;
      const auto t0 = core::Clock::now();
      for (int i = 0; i < reps; ++i) {
        transport::Completion c;
        for (size_t at = 0; at < kProbeBulk; at += seg) {
          const size_t n = std::min(seg, kProbeBulk - at);
          right.send(shifted.get() + at, n, &c);
          left.recv(shifted.get() + at, n, &c);
        }
        transport_->wait(c, deadline);
      }
      return std::chrono::duration<double>(core::Clock::now() - t0).count() / reps;
    };
    // Wide communicators skip Rabenseifner (pi keeps its default) and run a quarter of the
    // small calls: at 128 ranks on two cores its bulk runs took seconds (mostly first touches
    // of 1 MiB FIFOs to lg N partners), and no pi the probe could find there changes a choice
    // much (on shared memory the allreduce candidates are flat, direct and the ring).
    const int small_rounds = wide ? kProbeSmallRounds / 4 : kProbeSmallRounds;
    // The first runs wake every rank and touch every FIFO slot and the scratch space.
    run(algorithms::recursive_doubling_allreduce, small, wide ? 1 : 4);
    if (wide && !crowded)
      shift(1);
    else if (!wide)
      run(algorithms::ring_allreduce, bulk, 2);
    if (!wide) run(algorithms::rabenseifner_allreduce, bulk, 1);
    double rd = 1e9, ring = 1e9, rab = 1e9;
    // Wide communicators take one batch unless told otherwise: at 256 ranks on two cores each
    // batch took ~0.9 s (every step waits for every rank to be scheduled), and what the probe
    // tells there, steps of milliseconds rather than microseconds, one batch tells as well.
    const size_t batches = wide && !config_.has("RINGREDUCE_PROBE_BATCHES")
                               ? 1
                               : std::max<size_t>(1, config_.size("RINGREDUCE_PROBE_BATCHES"));
    for (size_t b = 0; b < batches; ++b) {
      rd = std::min(rd, run(algorithms::recursive_doubling_allreduce, small, small_rounds));
      if (!crowded)
        ring = std::min(ring, wide ? shift(kProbeBulkRounds)
                                   : run(algorithms::ring_allreduce, bulk, kProbeBulkRounds));
      if (!wide)
        rab = std::min(rab, run(algorithms::rabenseifner_allreduce, bulk, kProbeBulkRounds));
    }
    // Only rank 0's numbers count (pass() hands them to every rank): the others only ran.
    if (rank_ == 0) {
      const double gamma = measure_gamma();
      const double alpha = std::max(rd / algorithms::rd_steps(size_), 1e-8);
      const double n = size_, k = static_cast<double>(kProbeBulk);
      const double wire = 2 * (n - 1) / n * k;
      // The ring: its bandwidth term on top of its alphas and its reductions; a shift: one step.
      const double beta =
          crowded ? defaults.link.beta
          : wide
              ? std::max(ring - alpha, 0.05 * ring) / k
              : std::max(ring - 2 * (n - 1) * alpha - (n - 1) / n * k * gamma, 0.05 * ring) / wire;
      // Rabenseifner moves the ring's bytes in fewer steps, but each step's result goes through
      // the output before it is sent on: what it takes beyond the model without that is pi.
      tuner::Costs probe_costs;
      probe_costs.link = {alpha, beta, false};
      probe_costs.gamma = gamma;
      const int pof2 = algorithms::largest_power_of_two(size_);
      const double stepped = 2.0 * (pof2 - 1) / pof2 * k + (pof2 == size_ ? 0 : 2 * k);
      algorithms::CostInputs model;
      model.costs = probe_costs;
      model.n = size_;
      const double pi =
          wide
              ? defaults.pi
              : std::max(0.0, rab - algorithms::rabenseifner_allreduce_cost(model, k, 0)) / stepped;
      v[1] = alpha;
      v[2] = beta;
      v[3] = gamma;
      v[4] = pi;
      v[5] = measure_codec();
    }
    pass(v);
  }
  tuner::Costs costs = defaults;
  costs.link.alpha = v[1];
  costs.link.beta = v[2];
  if (v[3] > 0) costs.gamma = v[3];
  costs.pi = v[4];
  costs.codec = v[5] > 0 ? v[5] : 2 * costs.gamma;
  tuner_->set_costs(costs);
  cost_kind_ = transport_->traits().name;
  RR_LOG(info, tune, rank_, "links (", cost_kind_, ", ",
         from_file ? "from RINGREDUCE_TUNING_FILE"
         : crowded ? "measured; beta the default, as ranks crowd the cores"
                   : "measured",
         "): step latency ", costs.link.alpha * 1e6, " us, ", 1e-9 / costs.link.beta,
         " GB/s per link; reduce ", 1e-9 / costs.gamma, " GB/s; unfused steps +", costs.pi * 1e12,
         " ps/B; bf16 code and decode ", 1e-9 / costs.codec, " GB/s");
}

std::string CommImpl::tuning() const {
  const tuner::Costs& c = tuner_->costs();
  std::ostringstream out;
  out.precision(6);
  out << "link " << (cost_kind_.empty() ? transport_->traits().name : cost_kind_) << " " << size_
      << " " << c.link.alpha << " " << c.link.beta << " " << c.pi << "\n"
      << "gamma " << c.gamma << "\n";
  return out.str();
}

}  // namespace ringreduce::detail
