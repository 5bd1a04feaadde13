// Binomial-tree reduce: the mirror of binomial_broadcast. Each rank combines its children's
// partial results with its own input, smallest subtree first (its result is ready first), and
// sends the sum to its parent; the root ends with the total after ceil(lg N) rounds. Segments
// pipeline large buffers, but inner ranks receive the whole buffer once per child, so the chain
// is the bandwidth-bound choice.
#include <cstring>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/tree_shape.h"

namespace ringreduce::algorithms {

// Cost: ceil(lg N) rounds of the whole buffer, each combined, its result through a buffer.
double binomial_reduce_cost(const CostInputs& in, double k, double /*segment*/) {
  const Costs& c = in.costs;
  return ceil_lg(in.n) * (c.link.step(k) + k * c.pi + k * c.gamma);
}

void binomial_reduce(Context& ctx, const Args& a) {
  if (trivial_reduction(ctx, a)) return;
  const int n = ctx.size;
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int v = (ctx.rank - a.root + n) % n;
  auto real = [&](int vr) { return (vr + a.root) % n; };
  std::vector<int> children;
  binomial_children(n, v, [&](int c) { children.insert(children.begin(), c); });
  const int parent = binomial_parent(v);
  // Partial results accumulate in the output on the root and in scratch elsewhere: a non-root
  // rank's output is not its to use (it may pass none).
  char* acc = v == 0             ? out
              : children.empty() ? nullptr
                                 : static_cast<char*>(ctx.scratch(a.count * elem));

  transport::Completion sent;
  for_each_segment(0, a.count, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
    const size_t o = off * elem, bytes = cnt * elem;
    if (children.empty()) {
      ctx.link(real(parent)).send(in + o, bytes, &sent);
      return;
    }
    // Each child's contribution is combined into what the previous ones left, so they go one
    // after another; the later children's data waits in the transport meanwhile.
    const char* local = in + o;
    for (size_t i = 0; i < children.size(); ++i) {
      const bool last = i + 1 == children.size();
      transport::Reduction r{
          a.dtype, a.op, last && v == 0 && a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1};
      transport::Link& from = ctx.link(real(children[i]));
      if (last && parent >= 0) {
        from.recv_reduce_send(acc + o, local, bytes, r, ctx.link(real(parent)), /*keep=*/false,
                              &sent);
      } else {
        transport::Completion step;
        from.recv_reduce(acc + o, local, bytes, r, &step);
        ctx.wait(step);
      }
      local = acc + o;
    }
  });
  ctx.wait(sent);
}

}  // namespace ringreduce::algorithms
