// Pipelined chain broadcast: root -> root+1 -> ... -> root-1. Each rank forwards a segment as soon
// as it has it, so the time is about K/B plus (N-1) segment latencies instead of (N-1)K/B.
#include <algorithm>
#include <cmath>

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

// Cost: the chain forwards each of m segments: N-1 hops to fill, m-1 more to drain.
double chain_broadcast_cost(const CostInputs& in, double k, double segment) {
  const int n = in.n;
  if (n <= 1) return 0;
  const double seg = std::max(1.0, std::min(segment, k));
  const double m = std::ceil(k / seg);
  return (n - 1 + m - 1) * in.costs.link.step(seg);
}

size_t quarter_segment(const CostInputs& /*in*/, size_t bytes) {
  return std::clamp<size_t>(bytes / 4, 64 << 10, 512 << 10);
}

void chain_broadcast(Context& ctx, const Args& a) {
  const int n = ctx.size;
  const size_t elem = dtype_size(a.dtype);
  char* buf = static_cast<char*>(a.recv);
  const char* src = static_cast<const char*>(a.send);
  // Distance from the root along the chain (the communicator's ring).
  const int pos = (ctx.pos() - ctx.pos_of(a.root) + n) % n;
  // Out of place, the root sends from its send buffer and keeps a copy in its receive buffer.
  if (pos == 0 && src != buf) reduce::copy(buf, src, a.count * elem, /*stream=*/false);
  if (n == 1 || a.count == 0) return;

  transport::Completion done;
  for (int ch = 0; ch < ctx.channels; ++ch) {
    const Range part = split(a.count, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
    for_each_segment(part.offset, part.count, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
      char* p = buf + off * elem;
      const size_t bytes = cnt * elem;
      if (pos == 0)
        ctx.link(ctx.right(), ch).send(src + off * elem, bytes, &done);
      else if (pos < n - 1)
        ctx.link(ctx.left(), ch).recv_copy_send(p, bytes, ctx.link(ctx.right(), ch), &done);
      else
        ctx.link(ctx.left(), ch).recv(p, bytes, &done);
    });
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
