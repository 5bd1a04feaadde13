// Reduce-scatter with a narrow wire format (wire_phases.h): each rank sends every peer its
// block coded and sums the peers' blocks into its own in float32. The result is not rounded
// again: it is only this rank's.
//
// Cost: N-1 messages, (N-1)/N of the input coded through the links, N-1 decodes-and-adds of K/N.
#include <cstring>

#include "algorithms/wire_phases.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

void wire_reduce_scatter(Context& ctx, const Args& a) {
  const size_t count = a.count;  // per rank
  const auto* in = static_cast<const float*>(a.send);
  auto* out = static_cast<float*>(a.recv);
  const auto block = [count](int rank) { return Range{static_cast<size_t>(rank) * count, count}; };
  const float* own_in = in + static_cast<size_t>(ctx.rank) * count;
  if (own_in != out && count > 0) std::memmove(out, own_in, count * sizeof(float));
  if (ctx.size == 1 || count == 0) return;
  transport::Completion sent, summed;
  post_coded_sends(ctx, in, a.wire, block, &sent);
  // Every peer's share lands on `out` (offset 0), not at its block in the input.
  post_coded_recvs(
      ctx, out, /*add=*/true, a.wire,
      [count](int) {
        return Range{0, count};
      },
      &summed);
  ctx.wait(summed);
  if (a.op == ReduceOp::avg)
    reduce::divide(out, out, count, DataType::f32, static_cast<uint64_t>(ctx.size));
  ctx.wait(sent);
}

}  // namespace ringreduce::algorithms
