// Allgather with a narrow wire format (wire_phases.h): each rank rounds its contribution once,
// keeps the rounded values in its own block of the output (so that every rank holds the same
// output) and sends them coded to every peer, whose blocks it decodes as they arrive.
//
// Cost: N-1 messages, (N-1) K coded through the links (K each rank's contribution).
#include "algorithms/wire_phases.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

void wire_allgather(Context& ctx, const Args& a) {
  const size_t count = a.count;  // per rank
  const auto* in = static_cast<const float*>(a.send);
  auto* out = static_cast<float*>(a.recv);
  const auto block = [count](int rank) { return Range{static_cast<size_t>(rank) * count, count}; };
  float* own = out + static_cast<size_t>(ctx.rank) * count;
  reduce::wire_round(own, in, count, a.wire);  // in place when the input is our block
  if (ctx.size == 1 || count == 0) return;
  transport::Completion done;
  post_coded_sends(
      ctx, out, a.wire, [&](int) { return block(ctx.rank); }, &done);
  post_coded_recvs(ctx, out, /*add=*/false, a.wire, block, &done);
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
