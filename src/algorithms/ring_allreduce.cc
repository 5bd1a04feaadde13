// The bandwidth-optimal ring allreduce of the seeds: a reduce-scatter then an allgather, each
// N-1 steps, every rank sending and receiving 2(N-1)/N of the buffer.
//
// The whole schedule is posted at once and the transport runs it as a pipeline: each chunk is cut
// into segments, and a segment is forwarded as soon as it has been received and reduced, while
// the next one is still arriving. Per link, messages keep their posting order, which is the
// order the neighbour sends them: first the segments of step 0 (straight from the input), then
// each forward in the order its receive completes.
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_phases.h"

namespace ringreduce::algorithms {

void ring_allreduce(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int n = ctx.size, r = ctx.rank;
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
    auto segments = [&](int chunk, auto&& fn) {
      const Range c = split(part.count, static_cast<size_t>(n), static_cast<size_t>(chunk));
      for_each_segment(part.offset + c.offset, c.count, elem, ctx.segment_bytes,
                       [&](size_t off, size_t cnt) { fn(off * elem, cnt * elem); });
    };

    // Reduce-scatter, step 0: send our own contribution to the first chunk.
    segments(reduce_scatter_step(r, n, 0).send_chunk,
             [&](size_t off, size_t bytes) { right.send(in + off, bytes, &done); });
    // Steps 0..n-2: receive a chunk, reduce our contribution into it, pass it on. At step n-2
    // the chunk is complete ((r + 1) mod n, the one we own) and passing it on is the first step
    // of the allgather.
    for (int t = 0; t < n - 1; ++t) {
      const transport::Reduction& red = t == n - 2 ? last : step;
      segments(reduce_scatter_step(r, n, t).recv_chunk, [&](size_t off, size_t bytes) {
        // Only the chunk completed at the last step stays in out; the others are overwritten by the
        // allgather, so their partial sums need not touch it.
        left.recv_reduce_send(out + off, in + off, bytes, red, right, t == n - 2, &done);
      });
    }
    // Allgather: receive finished chunks and pass them on.
    post_ring_allgather_receives(left, right, r, n, 0, out, segments, &done);
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
