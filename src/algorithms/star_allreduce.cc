// Star allreduce: every rank sends its whole buffer to rank 0, which reduces and sends the result
// back. Rank 0's link carries (N-1) x K each way, so the time grows linearly with N where the
// ring's 2(N-1)/N x K stays flat (docs/scaling.md measures both). It exists for that
// comparison (bench/drivers/scaling.sh); the tuner never picks it, RINGREDUCE_ALGO=allreduce:star
// forces it.
//
// Rank 0 works segment by segment, so it needs (N-1) x 2 segments of scratch, not (N-1) x K: the
// receives of segment s+1 are posted before segment s is reduced, and each reduced segment goes
// back to every rank at once. The other ranks post their whole send and their whole receive up
// front, segment by segment. In place is safe on them: result segment s arrives only after rank 0
// has received segment s from them, so a receive never overwrites bytes still to be sent.
#include <cstring>
#include <vector>

#include "algorithms/algorithm.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

void star_allreduce(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int n = ctx.size;
  if (trivial_reduction(ctx, a)) return;
  // Segments of whole elements; a message is one segment (links match messages one to one).
  const size_t per = ctx.segment_bytes / elem > 0 ? ctx.segment_bytes / elem : 1;
  const size_t seg_bytes = per * elem;
  const size_t segments = (a.count + per - 1) / per;
  auto seg_count = [&](size_t s) { return s + 1 < segments ? per : a.count - s * per; };
  if (ctx.rank != 0) {
    transport::Completion done;
    for (size_t s = 0; s < segments; ++s)
      ctx.link(0).send(in + s * seg_bytes, seg_count(s) * elem, &done);
    for (size_t s = 0; s < segments; ++s)
      ctx.link(0).recv(out + s * seg_bytes, seg_count(s) * elem, &done);
    ctx.wait(done);
    return;
  }

  // Rank 0: scratch holds two sets of N-1 segments.
  const size_t set_bytes = static_cast<size_t>(n - 1) * seg_bytes;
  char* scratch = static_cast<char*>(ctx.scratch(2 * set_bytes));
  std::vector<transport::Completion> received(2);
  auto post_receives = [&](size_t s) {
    char* set = scratch + (s % 2) * set_bytes;
    for (int p = 1; p < n; ++p)
      ctx.link(p).recv(set + static_cast<size_t>(p - 1) * seg_bytes, seg_count(s) * elem,
                       &received[s % 2]);
  };

  transport::Completion sent;
  post_receives(0);
  for (size_t s = 0; s < segments; ++s) {
    if (s + 1 < segments) post_receives(s + 1);
    ctx.wait(received[s % 2]);
    const size_t off = s * seg_bytes, cnt = seg_count(s);
    const char* set = scratch + (s % 2) * set_bytes;
    // Rank order, the same on every call: out = in0 + in1 + ... + in(N-1).
    reduce::combine(out + off, in + off, set, cnt, a.dtype, a.op);
    for (int p = 2; p < n; ++p)
      reduce::combine(out + off, out + off, set + static_cast<size_t>(p - 1) * seg_bytes, cnt,
                      a.dtype, a.op);
    if (a.op == ReduceOp::avg)
      reduce::divide(out + off, out + off, cnt, a.dtype, static_cast<uint64_t>(n));
    for (int p = 1; p < n; ++p) ctx.link(p).send(out + off, cnt * elem, &sent);
  }
  ctx.wait(sent);
}

}  // namespace ringreduce::algorithms
