// The bandwidth-optimal ring allreduce of the seeds: a reduce-scatter then an allgather, each
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

  transport::Completion done;
  for (int ch = 0; ch < ctx.channels; ++ch) {
    const Range part = split(a.count, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
    transport::Link& right = ctx.link(ctx.right(), ch);
    transport::Link& left = ctx.link(ctx.left(), ch);
    const RingCuts cuts = RingCuts::split_chunks(part, n, elem, ctx.segment_bytes);
    // Steps: 0 sends our own contribution to the first chunk; 1..n-1 are reduce-scatter steps
    // 0..n-2 (receive a chunk, reduce our contribution into it, pass it on); n..2n-2 are the
    // allgather steps. At reduce-scatter step n-2 the chunk is complete ((r + 1) mod n, the one
    // we own) and passing it on is the first step of the allgather.
    post_ring_steps(ctx.sliced, 2 * n - 1, cuts.slices(), [&](int step_index, size_t s) {
      if (step_index == 0) {
        cuts.slice(reduce_scatter_step(r, n, 0).send_chunk, s,
                   [&](size_t off, size_t bytes) { right.send(in + off, bytes, &done); });
      } else if (step_index < n) {
        const int t = step_index - 1;
        const transport::Reduction& red = t == n - 2 ? last : step;
        cuts.slice(reduce_scatter_step(r, n, t).recv_chunk, s, [&](size_t off, size_t bytes) {
          // Only the chunk completed at the last step stays in out; the others are overwritten
          // by the allgather, so their partial sums need not touch it.
          left.recv_reduce_send(out + off, in + off, bytes, red, right, t == n - 2, &done);
        });
      } else {
        post_ring_gather_step(left, right, cuts, r, n, 0, step_index - n, s, out, &done);
      }
    });
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
