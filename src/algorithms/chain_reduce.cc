// Pipelined chain reduce: root+1 -> root+2 -> ... -> root, each rank adding its contribution to a
// segment and passing it on while the next segment arrives. Every rank sends K bytes once.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {

// Cost: as the chain broadcast, each hop also combining its segment.
double chain_reduce_cost(const CostInputs& in, double k, double segment) {
  const int n = in.n;
  if (n <= 1) return 0;
  const Costs& c = in.costs;
  const double seg = std::max(1.0, std::min(segment, k));
  const double m = std::ceil(k / seg);
  return (n - 1 + m - 1) * (c.link.step(seg) + seg * c.gamma);
}

void chain_reduce(Context& ctx, const Args& a) {
  if (trivial_reduction(ctx, a)) return;
  const int n = ctx.size;
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  // Position along the chain: the rank after the root starts (0), the root ends (n-1).
  const int pos = (ctx.pos() - ctx.pos_of(a.root) - 1 + 2 * n) % n;
  transport::Reduction step{a.dtype, a.op, 1};
  transport::Reduction last{a.dtype, a.op, a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1};
  // Ranks in the middle keep partial results in scratch: their output buffer is not theirs to use
  // (non-root ranks may pass none).
  char* partial =
      pos > 0 && pos < n - 1 ? static_cast<char*>(ctx.scratch(a.count * elem)) : nullptr;

  transport::Completion done;
  for (int ch = 0; ch < ctx.channels; ++ch) {
    const Range part = split(a.count, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
    for_each_segment(part.offset, part.count, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
      const size_t o = off * elem, bytes = cnt * elem;
      if (pos == 0)
        ctx.link(ctx.right(), ch).send(in + o, bytes, &done);
      else if (pos < n - 1)
        ctx.link(ctx.left(), ch)
            .recv_reduce_send(partial + o, in + o, bytes, step, ctx.link(ctx.right(), ch),
                              /*keep=*/false, &done);
      else
        ctx.link(ctx.left(), ch).recv_reduce(out + o, in + o, bytes, last, &done);
    });
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
