// Binomial-tree broadcast: ceil(lg N) rounds instead of the chain's N-1 hops, so for small buffers
// it is latency-bound at lg N message latencies. Each rank receives the buffer from its parent
// and sends it to each of its children, largest subtree first (tree_shape.h). Large buffers are
// cut into segments and a segment is forwarded the moment it has arrived, but every inner rank
// sends the whole buffer once per child (the root lg N times): the chain, which sends it once,
// is the bandwidth-bound choice.
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/tree_shape.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

// Cost: ceil(lg N) rounds, the root sending the whole buffer in each.
double binomial_broadcast_cost(const CostInputs& in, double k, double /*segment*/) {
  return ceil_lg(in.n) * in.costs.link.step(k);
}

void binomial_broadcast(Context& ctx, const Args& a) {
  const int n = ctx.size;
  const size_t elem = dtype_size(a.dtype);
  char* buf = static_cast<char*>(a.recv);
  const char* src = static_cast<const char*>(a.send);
  const int v = (ctx.rank - a.root + n) % n;  // virtual rank: the root is 0
  if (v == 0 && src != buf) reduce::copy(buf, src, a.count * elem, /*stream=*/false);
  if (n == 1 || a.count == 0) return;
  auto real = [&](int vr) { return (vr + a.root) % n; };
  // The root sends from its send buffer (the copy above may still be in cache, but the send
  // buffer is what the caller handed over); the others forward what they received.
  const char* out = v == 0 ? src : buf;

  std::vector<std::pair<size_t, size_t>> segs;  // (offset, count) in elements
  for_each_segment(0, a.count, elem, ctx.segment_bytes,
                   [&](size_t off, size_t cnt) { segs.emplace_back(off, cnt); });
  // One completion per segment's receive, all posted first: the parent's link carries nothing
  // else during this call, so they match its sends in order.
  std::vector<transport::Completion> arrived(segs.size());
  const int parent = binomial_parent(v);
  if (parent >= 0)
    for (size_t s = 0; s < segs.size(); ++s)
      ctx.link(real(parent)).recv(buf + segs[s].first * elem, segs[s].second * elem, &arrived[s]);
  transport::Completion sent;
  for (size_t s = 0; s < segs.size(); ++s) {
    if (parent >= 0) ctx.wait(arrived[s]);
    binomial_children(n, v, [&](int child) {
      ctx.link(real(child)).send(out + segs[s].first * elem, segs[s].second * elem, &sent);
    });
  }
  ctx.wait(sent);
}

}  // namespace ringreduce::algorithms
