// The bandwidth-optimal ring allreduce (ring_schedule.h): a reduce-scatter then an allgather, each
// N-1 steps, every rank sending and receiving 2(N-1)/N of the buffer.
//
// The whole schedule is posted at once and the transport runs it as a pipeline: each chunk is cut
// into slices, and a slice is forwarded as soon as it has been received and reduced, while the
// next one is still arriving. Per link, messages leave in posting order, which is the order the
// neighbour receives them (post_ring_steps: step by step, or slice by slice).
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_phases.h"

namespace ringreduce::algorithms {

// Cost: 2(N-1) steps of K/N bytes; N-1 of them combine K/N bytes.
double ring_allreduce_cost(const CostInputs& in, double k, double /*segment*/) {
  const int n = in.n;
  if (n <= 1) return 0;
  const Costs& c = in.costs;
  const double chunk = k / n;
  return 2.0 * (n - 1) * c.link.step(chunk) + (n - 1) * chunk * c.gamma;
}

void ring_allreduce(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  // The schedule runs over ring positions: chunks of an allreduce belong to no rank in particular.
  const int n = ctx.size, r = ctx.pos();
  if (n == 1) {
    if (in != out && a.count > 0) std::memcpy(out, in, a.count * elem);
    return;
  }
  transport::Reduction step{a.dtype, a.op, 1};
  // avg: sum along the ring, divide once on the step that completes each chunk.
  transport::Reduction last{a.dtype, a.op, a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1};

  // The halves are fused (a chunk completed by the reduce-scatter leaves at once as the first
  // allgather step), but counted apart: the reduce-scatter is over when `scattered` is done.
  ctx.phase("reduce-scatter");
  transport::Completion scattered, gathered;
  for (int ch = 0; ch < ctx.channels; ++ch) {
    const Range part = split(a.count, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
    const RingView ring{n, r, &ctx.link(ctx.left(), ch), &ctx.link(ctx.right(), ch)};
    post_ring_allreduce(ring, in, out, part, elem, ctx.segment_bytes, ctx.sliced, step, last,
                        RingPhases::both, &scattered, &gathered);
  }
  ctx.wait(scattered);
  ctx.phase("allgather");
  ctx.wait(gathered);
}

}  // namespace ringreduce::algorithms
