// Pipelined double binary tree allreduce (NCCL's construction, tree_shape.h). The buffer is split
// in two halves; half t is reduced up tree t to its root and broadcast back down, segment by
// segment, so that a segment climbs while the one before it descends. Each tree has depth
// about lg N, so a small buffer costs about 2 lg N message latencies instead of the ring's
// 2(N-1); a large one streams at about the rate of one link, because every rank is an inner node
// (two children) in one tree and a leaf in the other: per rank 2K bytes cross each direction of
// its links, against the ring's 2(N-1)/N K.
//
// Messages on a link must match in order on both ends (transport/link.h), and a pair of ranks can
// be parent and child in both trees. So every rank walks the same sequence of stages:
// for each segment s: up(tree 0), up(tree 1), down(tree 0), down(tree 1); each stage posts at
// most one message per direction per link, and a rank finishes posting a stage before the next.
// No rank waits on anything a peer posts at a later stage (up stages need only children's up
// stages; down stages only the parent's down stage, which follows its up stages): no deadlock.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"
#include "algorithms/tree_shape.h"

namespace ringreduce::algorithms {

// Cost: each tree carries K/2 bytes in m segments. A segment climbs D levels and descends D;
// with the pipeline full, every cycle moves one segment of each tree, and a rank then receives
// four segments (two children's in the tree where it is inner, one from each parent) and combines
// two. So (2D + m - 1) cycles of one step of 4 segments' bytes (shared over up to four links, but
// on one host the copies share the rank's CPU) and 2 segments' combines.
double tree_allreduce_cost(const CostInputs& in, double k, double segment) {
  if (in.n <= 1) return 0;
  const Costs& c = in.costs;
  const double half = k / 2;
  const double seg = std::max(1.0, std::min(segment, half));
  const double m = std::ceil(half / seg);
  const int d = in.tree_depth;
  return (2 * d + m - 1) * (c.link.step(4 * seg) + 4 * seg * c.pi + 2 * seg * c.gamma);
}

// The segment that minimises the cost above (more segments add alphas, larger ones lengthen the
// pipeline's fill), a multiple of 4 KiB between 4 KiB and 1 MiB.
size_t tree_allreduce_segment(const CostInputs& in, size_t bytes) {
  constexpr double kMin = 4 << 10, kMax = 1 << 20;
  const Costs& c = in.costs;
  if (c.link.beta <= 0) return 256 << 10;
  // d/dS of (K/2S) alpha + 2D * 4 S beta = 0.
  const double k = static_cast<double>(bytes);
  const double best =
      std::sqrt(k / 2 * c.link.alpha / (8 * std::max(in.tree_depth, 1) * c.link.beta));
  const double s = std::clamp(best, kMin, kMax);
  return static_cast<size_t>(s / 4096) * 4096;
}

void tree_allreduce(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int n = ctx.size, r = ctx.rank;
  if (trivial_reduction(ctx, a)) return;
  // Tree t's nodes, as ranks.
  TreeNode node[2] = {binary_tree(n, r), binary_tree(n, second_tree_position(n, r))};
  auto to_rank = [&](int t, int p) { return p < 0 ? -1 : t == 0 ? p : second_tree_rank(n, p); };
  for (int t = 0; t < 2; ++t) {
    node[t].parent = to_rank(t, node[t].parent);
    node[t].child[0] = to_rank(t, node[t].child[0]);
    node[t].child[1] = to_rank(t, node[t].child[1]);
  }
  // Segments of each half; the two halves may have different numbers of them.
  std::vector<Range> segs[2];
  for (int t = 0; t < 2; ++t) {
    const Range half = split(a.count, 2, static_cast<size_t>(t));
    for_each_segment(half.offset, half.count, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
      segs[t].push_back({off, cnt});
    });
  }
  const size_t rounds = std::max(segs[0].size(), segs[1].size());
  // Everything a rank posts and does not wait for at once counts here.
  transport::Completion pending;
  // Up-stage completions of the roots, waited for before they send the result down.
  std::vector<transport::Completion> reduced[2] = {
      std::vector<transport::Completion>(segs[0].size()),
      std::vector<transport::Completion>(segs[1].size())};
  const uint64_t divide = a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1;

  auto up = [&](int t, size_t s) {
    const TreeNode& me = node[t];
    const size_t o = segs[t][s].offset * elem, bytes = segs[t][s].count * elem;
    const int kids = me.children();
    if (kids == 0) {
      ctx.link(me.parent).send(in + o, bytes, &pending);
      return;
    }
    // A partial result lives in the output: the result overwrites it on the way down (in place,
    // the input is consumed here and not read again).
    const char* local = in + o;
    int seen = 0;
    for (int c : me.child) {
      if (c < 0) continue;
      const bool last = ++seen == kids;
      const transport::Reduction red{a.dtype, a.op, last && me.parent < 0 ? divide : 1};
      if (last && me.parent >= 0) {
        ctx.link(c).recv_reduce_send(out + o, local, bytes, red, ctx.link(me.parent),
                                     /*keep=*/false, &pending);
      } else if (last) {
        ctx.link(c).recv_reduce(out + o, local, bytes, red, &reduced[t][s]);
      } else {
        transport::Completion first;
        ctx.link(c).recv_reduce(out + o, local, bytes, red, &first);
        ctx.wait(first);
      }
      local = out + o;
    }
  };
  auto down = [&](int t, size_t s) {
    const TreeNode& me = node[t];
    const size_t o = segs[t][s].offset * elem, bytes = segs[t][s].count * elem;
    if (me.parent < 0) {
      ctx.wait(reduced[t][s]);
    } else if (me.children() == 1) {
      const int c = me.child[0] >= 0 ? me.child[0] : me.child[1];
      ctx.link(me.parent).recv_copy_send(out + o, bytes, ctx.link(c), &pending);
      return;
    } else if (me.children() == 0) {
      // A leaf's receive is its last message of this segment: nothing later waits for it.
      ctx.link(me.parent).recv(out + o, bytes, &pending);
      return;
    } else {
      transport::Completion got;
      ctx.link(me.parent).recv(out + o, bytes, &got);
      ctx.wait(got);
    }
    for (int c : me.child)
      if (c >= 0) ctx.link(c).send(out + o, bytes, &pending);
  };

  for (size_t s = 0; s < rounds; ++s) {
    for (int t = 0; t < 2; ++t)
      if (s < segs[t].size()) up(t, s);
    for (int t = 0; t < 2; ++t)
      if (s < segs[t].size()) down(t, s);
  }
  ctx.wait(pending);
}

}  // namespace ringreduce::algorithms
