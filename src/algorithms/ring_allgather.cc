// Ring allgather as a collective of its own: the second half of the ring allreduce, rotated
// (shift -1) so that rank r starts from its own block r. allgatherv's blocks of their own sizes
// go the same way (RingCuts::uneven_blocks: every block cut into as many slices).
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_phases.h"

namespace ringreduce::algorithms {

void ring_allgather(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const bool uneven = !a.counts.empty();
  const std::vector<size_t> offsets = uneven ? offsets_of(a.counts) : std::vector<size_t>{};
  const size_t block = a.count;  // elements per rank (even blocks)
  const auto me = static_cast<size_t>(ctx.rank);
  const size_t mine_bytes = (uneven ? a.counts[me] : block) * elem;
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  // The schedule runs over ring positions; position p's chunk is the block of rank at(p).
  const int n = ctx.size, r = ctx.pos();
  constexpr int kShift = -1;
  char* mine = out + (uneven ? offsets[me] : me * block) * elem;
  if (in != mine && mine_bytes > 0) std::memmove(mine, in, mine_bytes);
  if (n == 1) return;

  transport::Completion done;
  for (int ch = 0; ch < ctx.channels; ++ch) {
    const Range part = split(block, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
    transport::Link& right = ctx.link(ctx.right(), ch);
    transport::Link& left = ctx.link(ctx.left(), ch);
    const RingCuts cuts = uneven
                              ? RingCuts::uneven_blocks(a.counts, offsets, ctx.channels, ch, n,
                                                        elem, ctx.segment_bytes, ctx.ring)
                              : RingCuts::blocks(part, block, n, elem, ctx.segment_bytes, ctx.ring);
    // Step 0 sends our own block; steps 1..n-1 are the allgather steps 0..n-2.
    post_ring_steps(ctx.sliced, n, cuts.slices(), [&](int step_index, size_t s) {
      if (step_index == 0)
        cuts.slice(allgather_step(r, n, 0, kShift).send_chunk, s,
                   [&](size_t off, size_t bytes) { right.send(out + off, bytes, &done); });
      else
        post_ring_gather_step(left, right, cuts, r, n, kShift, step_index - 1, s, out, &done);
    });
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
