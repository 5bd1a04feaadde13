#include "tuner/tuner.h"

#include <algorithm>
#include <sstream>

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
// Largest allreduce the flat algorithm takes on one host (measured: docs/PERFORMANCE.md).
constexpr size_t kFlatAllreduceMaxBytes = 4 << 10;
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

Tuner::Tuner(const core::Config& config, int world_size, int transport_channels, bool shared_memory)
    : size_(world_size), channels_(transport_channels), shared_memory_(shared_memory) {
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
    if (shared_memory_ && bytes <= kFlatAllreduceMaxBytes) return flat_allreduce_;
    // Small buffers: lg N simultaneous exchanges beat the ring's 2(N-1) sequential steps when
    // latency dominates (at N=2: one exchange against two hops).
    if (bytes <= kRecursiveDoublingMaxBytes) return rd_;
  }
  if (args.kind == Collective::barrier && shared_memory_) return flat_barrier_;
  return first_.at(args.kind);
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
  if (forced_segment_ > 0)
    plan.segment_bytes = forced_segment_;
  else if (ring)
    plan.segment_bytes = shared_memory_ ? kShmSegmentBytes : kSegmentBytes;
  else
    plan.segment_bytes = std::clamp<size_t>(per_step / 4, 64 << 10, kSegmentBytes);
  return plan;
}

}  // namespace ringreduce::tuner
