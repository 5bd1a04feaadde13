#include "tuner/tuner.h"

#include <algorithm>
#include <sstream>

#include "reduce/reduce.h"
#include "ringreduce/error.h"
#include "transport/shm/shm_layout.h"

namespace ringreduce::tuner {

using algorithms::Collective;

namespace {

// Largest allreduce that recursive doubling takes. Measured on loopback TCP at N=2 and 4
// (docs/PERFORMANCE.md): rd wins up to 512 KiB (N=4: 421 us against the ring's 582 us), the ring
// from 1 MiB (1.1 ms against 1.5 ms).
constexpr size_t kRecursiveDoublingMaxBytes = 512 << 10;
constexpr size_t kSegmentBytes = 512 << 10;
// Smallest allreduce the hierarchical algorithm takes on several hosts: below, recursive doubling
// (up to 512 KiB) and the ring's pipelining are as good and it only adds two waits.
constexpr size_t kHierarchicalMinBytes = 1 << 20;
// Allreduce on one host, from two sweeps of forced algorithms (median us of 3 interleaved rounds,
// in place; docs/PERFORMANCE.md, "Algorithm choice on one host"):
//   flat / rd / ring         N=2  8K 1.6/1.5/1.5  16K 3.4/3.2/2.9
//                            N=4  4K 4.8/9.4/10.9 8K 14.0/14.4/13.1
//                            N=8  16K 27/32/65    64K 76/76/117    128K -/170/192
//   flat / direct / ring     N=2  16K 3.1/3.1/4.8 32K 6.3/6.4/6.1  256K -/36.9/30.1
//                            N=4  8K 7.6/8.2/13.3 32K 19/15/23     256K -/50/81  1M -/175/197
//                                 2M -/432/421
//                            N=8  16K 35/58/140   32K 107/36/207   64K 284/141/137
//                                 128K -/258/194
// So: flat up to 8 KiB (N <= 4) or 16 KiB; direct above that up to 1 MiB at N = 3..4 and up to
// 64 KiB beyond (not at N=2, where the ring ties it); the ring above. Recursive doubling never
// wins by more than noise on shared memory and loses up to 7x from 128 KiB at N=4 (whole-buffer
// exchanges queue behind 4-slot FIFOs), so shared memory skips it.
size_t flat_allreduce_max_bytes(int world_size) {
  return world_size <= 4 ? size_t{8} << 10 : size_t{16} << 10;
}
size_t direct_allreduce_max_bytes(int world_size) {
  if (world_size <= 2) return 0;
  return world_size <= 4 ? size_t{1} << 20 : size_t{64} << 10;
}
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
  rd_ = algorithms::find_algorithm(Collective::allreduce, "rd");
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
}

const algorithms::Algorithm* Tuner::pick(const algorithms::Args& args) const {
  const size_t bytes = args.count * dtype_size(args.dtype);
  if (auto it = forced_.find(args.kind); it != forced_.end())
    for (const auto* a : it->second)
      if (bytes <= a->max_bytes) return a;
  if (args.kind == Collective::allreduce && size_ > 1) {
    // One host: every rank reads every peer's input in place, one step (flat_allreduce.cc).
    if (shared_memory_) {
      if (bytes <= flat_allreduce_max_bytes(size_) && bytes <= flat_allreduce_->max_bytes)
        return flat_allreduce_;
      // Two synchronisations per round instead of 2(N-1) hops (direct_allreduce.cc).
      if (bytes <= direct_allreduce_max_bytes(size_)) return direct_;
      return first_.at(Collective::allreduce);
    }
    // Small buffers: lg N simultaneous exchanges beat the ring's 2(N-1) sequential steps when
    // latency dominates (at N=2: one exchange against two hops).
    if (bytes <= kRecursiveDoublingMaxBytes && rd_beats_ring(bytes)) return rd_;
    // Several hosts with L >= 2 ranks each: two levels (hierarchical_allreduce.cc) cross the
    // network with the ring's bytes per host but over L connections at once, in 2(L-1)+2(H-1)
    // steps instead of 2(N-1). Emulated hosts on this 2-core machine (TCP loopback between
    // them) could not tell the two apart within their noise (docs/PERFORMANCE.md); the choice
    // rests on that count and is for the emulated cluster (issue 4) to confirm or move.
    if (host_size_ >= 2 && host_size_ < size_ && bytes >= kHierarchicalMinBytes)
      return hierarchical_;
  }
  if (args.kind == Collective::barrier && shared_memory_) return flat_barrier_;
  return first_.at(args.kind);
}

// Recursive doubling against the ring, for an allreduce of `bytes` over the measured network.
// Each step costs the larger of the message latency and the transfer (measured on the emulated
// cluster, 4 hosts, forced algorithms, docs/PERFORMANCE.md: at 1 Gbit/s the ring's 64 KiB took
// 6 x 138 us, its bandwidth term alone, and rd's 2 x 551 us; at 16 KiB the ring's steps cost their
// ~70 us latency, 6 x 71 us): rd takes lg N whole-buffer steps (two more when N is not a power of
// two, folding), the ring 2(N-1) steps of a 1/N chunk. At N=4 the crossover is 3 x latency x
// bandwidth: ~25 KiB at 1 Gbit/s, ~280 KiB at 10 Gbit/s, as measured. Without a measurement (one
// host) rd is taken up to kRecursiveDoublingMaxBytes, measured on loopback.
bool Tuner::rd_beats_ring(size_t bytes) const {
  if (net_bandwidth_ <= 0) return true;
  int lg = 0;
  while ((2 << lg) <= size_) ++lg;
  const int rd_steps = lg + ((1 << lg) == size_ ? 0 : 2);
  const double k = static_cast<double>(bytes), n = size_;
  const double rd = rd_steps * std::max(net_alpha_, k / net_bandwidth_);
  const double ring = 2 * (n - 1) * std::max(net_alpha_, k / (n * net_bandwidth_));
  return rd <= ring;
}

Plan Tuner::choose(const algorithms::Args& args) const {
  Plan plan;
  plan.algorithm = pick(args);
  // Bytes each rank moves per ring step.
  const size_t elem = dtype_size(args.dtype);
  size_t per_step = args.count * elem;
  if (args.kind == Collective::allreduce) per_step /= static_cast<size_t>(size_);
  // Channels only pay when there is enough data for every ring to stream.
  plan.channels = per_step >= (size_t{4} << 20) ? channels_ : 1;
  // 512 KiB segments; a step smaller than that is one segment. On loopback TCP every segment
  // costs a frame, a wake-up and a syscall or two, and cutting 1-8 MiB allreduces into quarter
  // steps (64-256 KiB) lost 10-45% against whole 512 KiB segments (docs/PERFORMANCE.md); above,
  // 512 KiB pipelines as well as 2 MiB.
  // The chains (broadcast, reduce) were not measured that way: their latency grows with the
  // segment, so they keep a quarter of the buffer, clamped to 64-512 KiB.
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
  if (forced_segment_ > 0)
    plan.segment_bytes = forced_segment_;
  else if (ring)
    plan.segment_bytes = shared_memory_ ? kShmSegmentBytes : kSegmentBytes;
  else
    plan.segment_bytes = std::clamp<size_t>(per_step / 4, 64 << 10, kSegmentBytes);
  return plan;
}

}  // namespace ringreduce::tuner
