#include "tuner/tuner.h"

#include <algorithm>
#include <bit>
#include <limits>
#include <sstream>

#include "reduce/reduce.h"
#include "ringreduce/error.h"
#include "transport/shm/shm_layout.h"

namespace ringreduce::tuner {

using algorithms::Collective;

namespace {

constexpr size_t kSegmentBytes = 512 << 10;
// Smallest allreduce the hierarchical algorithm takes on several hosts: below, the one-level
// algorithms' pipelining is as good and it only adds two waits. (Not modelled: it runs two
// kinds of links at once; the threshold is from the emulated hosts, docs/PERFORMANCE.md.)
constexpr size_t kHierarchicalMinBytes = 1 << 20;
// Shared memory: one FIFO slot per message. Interleaved medians of 3 rounds at N=2, 4, 8 and
// 1-256 MiB (docs/PERFORMANCE.md): 4 slots of 256 KiB with 256 KiB messages were best or within
// noise of the best everywhere; 512 KiB messages (two slots each) lost 5-20% at N=4 and 8, and
// 8 or 16 slots per FIFO lost up to 2x at N=8 (more staging than two L2s hold).
constexpr size_t kShmSegmentBytes = transport::shm::kSlotBytes;

const Collective kAllCollectives[] = {
    Collective::allreduce, Collective::reduce_scatter, Collective::allgather, Collective::broadcast,
    Collective::reduce,    Collective::alltoall,       Collective::barrier};

Collective parse_collective(const std::string& s) {
  for (Collective c : kAllCollectives)
    if (s == algorithms::collective_name(c)) return c;
  throw InvalidArgument("RINGREDUCE_ALGO: unknown collective '" + s + "'");
}

}  // namespace

Tuner::Tuner(const core::Config& config, int world_size, int transport_channels, bool shared_memory,
             int host_size)
    : size_(world_size),
      channels_(transport_channels),
      shared_memory_(shared_memory),
      host_size_(host_size),
      stream_min_bytes_(reduce::stream_output_threshold()) {
  if (config.has("RINGREDUCE_SEGMENT_BYTES")) {
    forced_segment_ = config.size("RINGREDUCE_SEGMENT_BYTES");
    if (forced_segment_ == 0) throw InvalidArgument("RINGREDUCE_SEGMENT_BYTES must be > 0");
  }
  std::stringstream spec(config.str("RINGREDUCE_ALGO"));
  std::string item;
  // A bare name applies to every collective that has an algorithm of that name (the last one
  // named wins); "collective:name" items take precedence over bare names, and several of them
  // for one collective form a list in order ("allreduce:flat,allreduce:direct": a call runs the
  // first whose size limit admits it, here flat up to its limit and direct above).
  std::map<Collective, const algorithms::Algorithm*> bare;
  while (std::getline(spec, item, ',')) {
    if (item.empty()) continue;
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      bool any = false;
      for (Collective c : kAllCollectives) {
        if (const auto* a = algorithms::find_algorithm(c, item)) bare[c] = a, any = true;
      }
      if (!any) throw InvalidArgument("RINGREDUCE_ALGO: no algorithm named '" + item + "'");
    } else {
      Collective c = parse_collective(item.substr(0, colon));
      const auto* a = algorithms::find_algorithm(c, item.substr(colon + 1));
      if (!a)
        throw InvalidArgument("RINGREDUCE_ALGO: " + item.substr(0, colon) + " has no algorithm '" +
                              item.substr(colon + 1) + "'");
      forced_[c].push_back(a);
    }
  }
  for (const auto& [c, a] : bare)
    if (!forced_.contains(c)) forced_[c] = {a};
  for (const auto& [c, list] : forced_)
    for (const auto* a : list)
      if (a->needs_window && !shared_memory_ && size_ > 1)
        throw InvalidArgument(std::string("RINGREDUCE_ALGO: ") + algorithms::collective_name(c) +
                              ":" + a->name +
                              " reads peers' memory directly and needs every rank on one host "
                              "(with shared memory enabled)");
  costs_ = default_costs(shared_memory_ ? "shm" : "tcp");
  rd_ = algorithms::find_algorithm(Collective::allreduce, "rd");
  rabenseifner_ = algorithms::find_algorithm(Collective::allreduce, "rabenseifner");
  tree_ = algorithms::find_algorithm(Collective::allreduce, "tree");
  binomial_broadcast_ = algorithms::find_algorithm(Collective::broadcast, "binomial");
  binomial_reduce_ = algorithms::find_algorithm(Collective::reduce, "binomial");
  flat_allreduce_ = algorithms::find_algorithm(Collective::allreduce, "flat");
  flat_barrier_ = algorithms::find_algorithm(Collective::barrier, "flat");
  hierarchical_ = algorithms::find_algorithm(Collective::allreduce, "hierarchical");
  direct_ = algorithms::find_algorithm(Collective::allreduce, "direct");
  for (Collective c : kAllCollectives)
    for (const auto& a : algorithms::all_algorithms())
      if (a.kind == c) {
        first_[c] = &a;
        break;
      }
  tree_depth_ = tree_depth(size_);
  tabulate();
}

Costs Tuner::default_costs(const std::string& link_kind) {
  // Round values of what the start-up probe measures on this project's 2-core VM (docs/TUNING.md);
  // they decide only until set_costs(): a single rank, and tests of the tuner alone.
  Costs c;
  c.gamma = 1.0 / 8e9;
  if (link_kind == "shm") {
    c.link = {2e-6, 1.0 / 8e9, false};
  } else if (link_kind == "net") {
    c.link = {50e-6, 1.0 / 1e9, true};
  } else {
    c.link = {20e-6, 1.0 / 2e9, false};
  }
  return c;
}

double Tuner::predict(const algorithms::Algorithm& algorithm, Collective kind, size_t bytes) const {
  const double k = static_cast<double>(bytes);
  const int n = size_;
  const auto* a = &algorithm;
  const double seg = static_cast<double>(choose_segment(algorithm, kind, bytes));
  switch (kind) {
    case Collective::allreduce:
      if (a == first_.at(Collective::allreduce)) return ring_allreduce_cost(costs_, n, k);
      if (a == rd_) return rd_allreduce_cost(costs_, n, k);
      if (a == rabenseifner_) return rabenseifner_allreduce_cost(costs_, n, k);
      if (a == tree_) return tree_allreduce_cost(costs_, n, tree_depth_, k, seg);
      if (a == flat_allreduce_) return flat_allreduce_cost(costs_, n, k);
      if (a == direct_) return direct_allreduce_cost(costs_, n, k);
      break;
    case Collective::broadcast:
      if (a == first_.at(Collective::broadcast)) return chain_broadcast_cost(costs_, n, k, seg);
      if (a == binomial_broadcast_) return binomial_broadcast_cost(costs_, n, k);
      break;
    case Collective::reduce:
      if (a == first_.at(Collective::reduce)) return chain_reduce_cost(costs_, n, k, seg);
      if (a == binomial_reduce_) return binomial_reduce_cost(costs_, n, k);
      break;
    default:
      break;
  }
  return std::numeric_limits<double>::infinity();
}

std::vector<const algorithms::Algorithm*> Tuner::candidates(Collective kind) const {
  switch (kind) {
    case Collective::allreduce:
      // One host over shared memory: the window algorithms and the ring. Recursive doubling,
      // Rabenseifner and the tree were never within 10% of the best there at any size (every
      // algorithm forced at N = 2, 4, 8, 4 B - 256 MiB: docs/algorithms_shm.md), and where the
      // model would rank them close, its one beta misleads: from a few MiB their whole-half
      // steps write every intermediate result to memory and read it back (Rabenseifner moves
      // about 3.5 K bytes of DRAM per rank against the ring's 2 K, and measured 1.3-2x
      // slower), while the ring's fused forwards stay in the caches. On a tie the earlier
      // wins: a window step is a stamp and a cache line, a message step also a FIFO slot.
      if (shared_memory_) return {flat_allreduce_, direct_, first_.at(kind)};
      return {rd_, first_.at(kind), rabenseifner_, tree_};
    case Collective::broadcast:
      return {first_.at(kind), binomial_broadcast_};
    case Collective::reduce:
      return {first_.at(kind), binomial_reduce_};
    default:
      return {};
  }
}

const algorithms::Algorithm* Tuner::cheapest(Collective kind, size_t bytes) const {
  const algorithms::Algorithm* best = nullptr;
  double best_t = std::numeric_limits<double>::infinity();
  for (const auto* a : candidates(kind)) {
    if (a == nullptr || bytes > a->max_bytes) continue;
    const double t = predict(*a, kind, bytes);
    // Ties keep the earlier candidate (candidates() lists them in that order).
    if (best == nullptr || t < best_t) best = a, best_t = t;
  }
  return best;
}

size_t Tuner::size_class(size_t bytes) {
  if (bytes < 4) return bytes;
  const int e = std::bit_width(bytes) - 1;  // 2^e <= bytes < 2^(e+1), e >= 2
  return 4 * static_cast<size_t>(e) + ((bytes >> (e - 2)) & 3);
}

size_t Tuner::class_bytes(size_t cls) {
  if (cls < 4) return cls;
  // size_class() never gives 4..7 (4..7 bytes are classes 8..11); their table entries are filled
  // anyway, as 4 bytes, since the formula below would shift by e - 2 = -1.
  if (cls < 8) return 4;
  const size_t e = cls / 4;
  return (4 + cls % 4) << (e - 2);
}

void Tuner::tabulate() {
  const Collective kinds[3] = {Collective::allreduce, Collective::broadcast, Collective::reduce};
  for (size_t i = 0; i < 3; ++i)
    for (size_t cls = 0; cls < kClasses; ++cls)
      choice_[i][cls] = cheapest(kinds[i], class_bytes(cls));
}

void Tuner::set_costs(const Costs& costs) {
  costs_ = costs;
  tabulate();
}

const algorithms::Algorithm* Tuner::pick(const algorithms::Args& args) const {
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (auto it = forced_.find(args.kind); it != forced_.end())
    for (const auto* a : it->second)
      if (bytes <= a->max_bytes) return a;
  if (size_ <= 1) return first_.at(args.kind);
  int table = -1;
  switch (args.kind) {
    case Collective::allreduce:
      // Several hosts with L >= 2 ranks each: two levels (hierarchical_allreduce.cc) cross the
      // network with the ring's bytes per host but over L connections at once.
      if (host_size_ >= 2 && host_size_ < size_ && bytes >= kHierarchicalMinBytes)
        return hierarchical_;
      table = 0;
      break;
    case Collective::broadcast:
      table = 1;
      break;
    case Collective::reduce:
      table = 2;
      break;
    case Collective::barrier:
      return shared_memory_ ? flat_barrier_ : first_.at(args.kind);
    default:
      return first_.at(args.kind);
  }
  const auto* a = choice_[static_cast<size_t>(table)][size_class(bytes)];
  // A class's choice was made at its smallest size; one with a size limit inside the class (flat)
  // is checked against the call's own size.
  return bytes <= a->max_bytes ? a : cheapest(args.kind, bytes);
}

size_t Tuner::choose_segment(const algorithms::Algorithm& algorithm, Collective kind,
                             size_t bytes) const {
  if (forced_segment_ > 0) return forced_segment_;
  // 512 KiB segments; a step smaller than that is one segment. On loopback TCP every segment
  // costs a frame, a wake-up and a syscall or two, and cutting 1-8 MiB allreduces into quarter
  // steps (64-256 KiB) lost 10-45% against whole 512 KiB segments (docs/PERFORMANCE.md); above,
  // 512 KiB pipelines as well as 2 MiB. Shared memory: one FIFO slot per message.
  // The tree's segment trades its pipeline's fill against per-segment latency (cost_model.h).
  // The chains and binomial trees (broadcast, reduce) keep a quarter of the buffer, clamped to
  // 64-512 KiB: their latency grows with the segment.
  switch (kind) {
    case Collective::allreduce:
      if (&algorithm == tree_) return tree_segment(costs_, tree_depth_, static_cast<double>(bytes));
      [[fallthrough]];
    case Collective::reduce_scatter:
    case Collective::allgather:
      return shared_memory_ ? kShmSegmentBytes : kSegmentBytes;
    default:
      return std::clamp<size_t>(bytes / 4, 64 << 10, kSegmentBytes);
  }
}

Plan Tuner::choose(const algorithms::Args& args) const {
  Plan plan;
  plan.algorithm = pick(args);
  const size_t elem = dtype_size(args.dtype);
  // Bytes each rank moves per ring step.
  size_t per_step = args.count * elem;
  if (args.kind == Collective::allreduce) per_step /= static_cast<size_t>(size_);
  // Channels only pay when there is enough data for every ring to stream.
  plan.channels = per_step >= (size_t{4} << 20) ? channels_ : 1;
  const bool ring = args.kind == Collective::allreduce || args.kind == Collective::reduce_scatter ||
                    args.kind == Collective::allgather;
  // Shared memory forwards a slice the moment it arrives only if the schedule is posted slice by
  // slice (otherwise the forwards queue behind a whole chunk of first sends and go through DRAM).
  plan.sliced = ring && shared_memory_;
  // Out of place, a large output is not in cache and is not read again by this call: streaming
  // stores skip reading each line before writing it. Interleaved medians of 3 rounds, 64 and
  // 256 MiB, busbw GB/s, ordinary -> streaming: out of place N=2 5.2 -> 9.0, N=4 3.8 -> 6.0,
  // N=8 1.8 -> 2.7; in place (the output lines were just read as input, so they are cached)
  // within noise either way, so in place keeps ordinary stores (docs/PERFORMANCE.md).
  plan.stream_output = shared_memory_ && args.send != args.recv &&
                       args.count * dtype_size(args.dtype) >= stream_min_bytes_;
  plan.segment_bytes = choose_segment(*plan.algorithm, args.kind, args.count * elem);
  return plan;
}

}  // namespace ringreduce::tuner
