// Ring reduce-scatter as a collective of its own: the first half of the ring allreduce, with the
// schedule rotated (shift -1) so that rank r ends with chunk r, as MPI and NCCL define it.
// reduce_scatterv's blocks of their own sizes go the same way (RingCuts::uneven_blocks).
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_phases.h"

namespace ringreduce::algorithms {

void ring_reduce_scatter(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const bool uneven = !a.counts.empty();
  const std::vector<size_t> offsets = uneven ? offsets_of(a.counts) : std::vector<size_t>{};
  const size_t block = a.count;  // elements per rank (even blocks)
  const size_t total = uneven ? a.count : static_cast<size_t>(ctx.size) * block;
  const auto me = static_cast<size_t>(ctx.rank);
  // Where this rank's block starts in the input (its output is that block, reduced).
  const size_t mine_offset = (uneven ? offsets[me] : me * block) * elem;
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  // The schedule runs over ring positions; position p's chunk is the block of rank at(p).
  const int n = ctx.size, r = ctx.pos();
  constexpr int kShift = -1;
  if (n == 1) {
    const size_t bytes = (uneven ? a.counts[0] : block) * elem;
    if (in != out && bytes > 0) std::memmove(out, in, bytes);
    return;
  }
  transport::Reduction step{a.dtype, a.op, 1};
  transport::Reduction last{a.dtype, a.op, a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1};
  // Partial sums travel through scratch: the output holds only this rank's block, and the input
  // must not be modified.
  char* partial = static_cast<char*>(ctx.scratch(total * elem));

  transport::Completion done;
  for (int ch = 0; ch < ctx.channels; ++ch) {
    // Channels split every block the same way, so each channel is a complete smaller ring.
    const Range part = split(block, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
    transport::Link& right = ctx.link(ctx.right(), ch);
    transport::Link& left = ctx.link(ctx.left(), ch);
    const RingCuts cuts = uneven
                              ? RingCuts::uneven_blocks(a.counts, offsets, ctx.channels, ch, n,
                                                        elem, ctx.segment_bytes, ctx.ring)
                              : RingCuts::blocks(part, block, n, elem, ctx.segment_bytes, ctx.ring);
    // Step 0 sends our contribution to the first block; steps 1..n-1 are reduce-scatter steps
    // 0..n-2.
    post_ring_steps(ctx.sliced, n, cuts.slices(), [&](int step_index, size_t s) {
      if (step_index == 0) {
        cuts.slice(reduce_scatter_step(r, n, 0, kShift).send_chunk, s,
                   [&](size_t off, size_t bytes) { right.send(in + off, bytes, &done); });
        return;
      }
      const int t = step_index - 1;
      const int chunk = reduce_scatter_step(r, n, t, kShift).recv_chunk;
      cuts.slice(chunk, s, [&](size_t off, size_t bytes) {
        if (t < n - 2) {
          left.recv_reduce_send(partial + off, in + off, bytes, step, right, /*keep=*/false, &done);
        } else {
          // chunk == r, our own block: the finished block lands in the output.
          left.recv_reduce(out + off - mine_offset, in + off, bytes, last, &done);
        }
      });
    });
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
