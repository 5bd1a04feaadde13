// Hierarchical (two-level) allreduce for communicators that span hosts with L ranks on each:
//   1. reduce-scatter among the L ranks of each host (shared memory): local rank i ends with
//      chunk owned_chunk(i, L) of the host's sum;
//   2. ring allreduce of that chunk among the H ranks with local rank i, one per host (the
//      network): L independent rings run at once, each on 1/L of the buffer;
//   3. allgather among the ranks of each host.
// Against the flat ring over all N = H x L ranks it crosses the network with the same bytes per
// host, 2(H-1)/H x K, but over L connections at once instead of one, and takes 2(L-1) + 2(H-1)
// steps instead of 2(N-1) (Horovod's and NCCL's 2D scheme).
//
// Positions come from the communicator's ring, which lists the ranks host by host: host h holds
// positions h*L .. h*L+L-1. Without L ranks on every host (Context::host_size == 0), or with one
// host or one rank per host, it is the plain ring.
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_phases.h"

namespace ringreduce::algorithms {

// Not modelled (it runs two kinds of links at once): it takes allreduces from 1 MiB when several
// hosts have L >= 2 ranks each; below, the one-level algorithms' pipelining is as good and it only
// adds two waits (thresholds from the emulated hosts, docs/PERFORMANCE.md).
bool hierarchical_allreduce_applies(const CostInputs& in, size_t bytes) {
  constexpr size_t kMinBytes = 1 << 20;
  return in.host_size >= 2 && in.host_size < in.n && bytes >= kMinBytes;
}

void hierarchical_allreduce(Context& ctx, const Args& a) {
  const int n = ctx.size, L = ctx.host_size;
  if (L <= 1 || L >= n || n % L != 0) return ring_allreduce(ctx, a);
  const int H = n / L;
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int p = ctx.pos(), host = p / L, local = p % L;
  transport::Reduction none{a.dtype, a.op, 1};
  // avg divides once, by N, where each chunk completes: in the cross-host allreduce.
  transport::Reduction total{a.dtype, a.op, a.op == ReduceOp::avg ? static_cast<uint64_t>(n) : 1};
  auto local_ring = [&](int ch) {
    return RingView{L, local, &ctx.link(ctx.at(host * L + (local + L - 1) % L), ch),
                    &ctx.link(ctx.at(host * L + (local + 1) % L), ch)};
  };
  auto cross_ring = [&](int ch) {
    return RingView{H, host, &ctx.link(ctx.at(((host + H - 1) % H) * L + local), ch),
                    &ctx.link(ctx.at(((host + 1) % H) * L + local), ch)};
  };
  // Every channel splits the buffer alike; within a channel's part, local rank i owns chunk
  // owned_chunk(i, L) of split(part, L).
  auto owned = [&](const Range& part) {
    const Range c =
        split(part.count, static_cast<size_t>(L), static_cast<size_t>(owned_chunk(local, L)));
    return Range{part.offset + c.offset, c.count};
  };
  auto phase = [&](const char* name, auto&& post) {
    ctx.phase(name);
    transport::Completion done;
    for (int ch = 0; ch < ctx.channels; ++ch)
      post(ch, split(a.count, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch)), &done);
    ctx.wait(done);
  };
  phase("reduce-scatter (host)", [&](int ch, const Range& part, transport::Completion* done) {
    post_ring_allreduce(local_ring(ch), in, out, part, elem, ctx.segment_bytes, ctx.sliced, none,
                        none, RingPhases::reduce_scatter, done);
  });
  phase("allreduce (across hosts)", [&](int ch, const Range& part, transport::Completion* done) {
    post_ring_allreduce(cross_ring(ch), out, out, owned(part), elem, ctx.segment_bytes, ctx.sliced,
                        none, total, RingPhases::both, done);
  });
  phase("allgather (host)", [&](int ch, const Range& part, transport::Completion* done) {
    post_ring_allreduce(local_ring(ch), out, out, part, elem, ctx.segment_bytes, ctx.sliced, none,
                        none, RingPhases::allgather, done);
  });
}

}  // namespace ringreduce::algorithms
