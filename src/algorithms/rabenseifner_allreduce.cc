// Rabenseifner's allreduce for the middle sizes: a reduce-scatter by recursive halving followed by
// an allgather by recursive doubling. 2 lg N steps (against the ring's 2(N-1)) while every rank
// still sends and receives only 2(N-1)/N of the buffer, the ring's bandwidth term.
//
// The buffer is cut into P = 2^floor(lg N) blocks (split(), the ring's chunk rule). Reduce-scatter
// step with distance m = P/2, P/4, .., 1: virtual rank v and v ^ m hold the same 2m blocks; the one
// with bit m clear keeps the lower m blocks and sends the upper ones, the other keeps the upper;
// each combines the partner's copy of the half it keeps. After lg P steps v owns block v, fully
// reduced. The allgather runs the steps backwards, m = 1, 2, .., P/2, exchanging owned ranges,
// which double each step. A world that is not a power of two folds first, as recursive doubling
// does (recursive_doubling_allreduce.cc): of the first 2(N-P) ranks each even one hands its input
// to the odd one above it, sits out, and gets the result back at the end.
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {

// Cost: recursive halving, steps of K/2, K/4, .., K/p bytes, each combined; recursive doubling
// back up with the same sizes, not combined. Bytes per rank 2(p-1)/p K, the ring's for N = p.
double rabenseifner_allreduce_cost(const CostInputs& in, double k, double /*segment*/) {
  const int n = in.n;
  if (n <= 1) return 0;
  const Costs& c = in.costs;
  const int lg = floor_lg(n), f = folds(n);
  double t = 0, part = k;
  for (int i = 0; i < lg; ++i) {
    part /= 2;
    t += 2 * (c.link.step(part) + part * c.pi) + part * c.gamma;
  }
  return t + f * (2 * (c.link.step(k) + k * c.pi) + k * c.gamma);
}

void rabenseifner_allreduce(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int n = ctx.size, r = ctx.rank;
  if (trivial_reduction(ctx, a)) return;
  const int pof2 = largest_power_of_two(n);
  const int rem = n - pof2;
  auto real = [&](int vr) { return vr < rem ? vr * 2 + 1 : vr + rem; };
  // First element of block b (b = pof2: the end of the buffer).
  auto begin = [&](int b) {
    return b == pof2 ? a.count
                     : split(a.count, static_cast<size_t>(pof2), static_cast<size_t>(b)).offset;
  };
  const transport::Reduction plain{a.dtype, a.op, 1};
  // Posts, segment by segment, a send of elements [from, to) of `src` to `peer`.
  auto send = [&](int peer, const char* src, size_t from, size_t to, transport::Completion* c) {
    for_each_segment(from, to - from, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
      ctx.link(peer).send(src + off * elem, cnt * elem, c);
    });
  };

  // Until this rank has combined something into `out`, its data is the caller's input: reading it
  // from there saves copying the input out of place first.
  const char* cur = in;
  int v;
  if (r < 2 * rem) {
    ctx.phase("fold");
    transport::Completion done;
    if (r % 2 == 0) {
      send(r + 1, in, 0, a.count, &done);
      v = -1;
    } else {
      for_each_segment(0, a.count, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
        ctx.link(r - 1).recv_reduce(out + off * elem, in + off * elem, cnt * elem, plain, &done);
      });
      cur = out;
      v = r / 2;
    }
    ctx.wait(done);
  } else {
    v = r - rem;
  }

  if (v >= 0) {
    // Reduce-scatter by recursive halving: [lo, hi) are the blocks this rank still reduces.
    int lo = 0, hi = pof2;
    ctx.phase("reduce-scatter");
    for (int m = pof2 / 2; m >= 1; m /= 2) {
      const int peer = real(v ^ m);
      const int mid = lo + m;
      const bool upper = (v & m) != 0;
      const int keep_lo = upper ? mid : lo, keep_hi = upper ? hi : mid;
      const int give_lo = upper ? lo : mid, give_hi = upper ? mid : hi;
      // The last step completes this rank's block: avg divides there, once.
      const transport::Reduction red{
          a.dtype, a.op, m == 1 && a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1};
      transport::Completion done;
      send(peer, cur, begin(give_lo), begin(give_hi), &done);
      const size_t k0 = begin(keep_lo), k1 = begin(keep_hi);
      for_each_segment(k0, k1 - k0, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
        ctx.link(peer).recv_reduce(out + off * elem, cur + off * elem, cnt * elem, red, &done);
      });
      ctx.wait(done);
      cur = out;
      lo = keep_lo, hi = keep_hi;
    }
    // Allgather by recursive doubling: this rank's reduced range [lo, hi) doubles each step.
    ctx.phase("allgather");
    for (int m = 1; m < pof2; m *= 2) {
      const int peer = real(v ^ m);
      const bool upper = (v & m) != 0;
      const int other_lo = upper ? lo - m : hi, other_hi = upper ? lo : hi + m;
      transport::Completion done;
      send(peer, out, begin(lo), begin(hi), &done);
      const size_t o0 = begin(other_lo), o1 = begin(other_hi);
      for_each_segment(o0, o1 - o0, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
        ctx.link(peer).recv(out + off * elem, cnt * elem, &done);
      });
      ctx.wait(done);
      lo = upper ? other_lo : lo, hi = upper ? hi : other_hi;
    }
  }

  // Unfold: odd ranks return the result to the even rank they absorbed.
  if (r < 2 * rem) {
    ctx.phase("unfold");
    transport::Completion done;
    if (r % 2 == 1) {
      send(r - 1, out, 0, a.count, &done);
    } else {
      for_each_segment(0, a.count, elem, ctx.segment_bytes, [&](size_t off, size_t cnt) {
        ctx.link(r + 1).recv(out + off * elem, cnt * elem, &done);
      });
    }
    ctx.wait(done);
  }
}

}  // namespace ringreduce::algorithms
