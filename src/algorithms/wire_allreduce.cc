// Allreduce with a narrow wire format (wire_phases.h): a direct reduce-scatter, each rank
// receiving every peer's coded share of its block and summing in float32, then the block
// rounded once and a direct allgather of it, coded.
//
// Cost: per phase N-1 messages and (N-1)/N of the buffer, coded, through the links (the ring's
// bytes times the format's ratio); N-1 decodes-and-adds of K/N; the coding itself, which the
// links do piece by piece as the wire takes them. The tuner runs it only when a call asks for a
// wire format (or auto predicts that it pays: Tuner::resolve_wire).
#include <cstring>

#include "algorithms/wire_phases.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

void wire_allreduce(Context& ctx, const Args& a) {
  if (trivial_reduction(ctx, a)) return;
  const int n = ctx.size;
  const auto* in = static_cast<const float*>(a.send);
  auto* out = static_cast<float*>(a.recv);
  const auto block = [&](int rank) {
    return split(a.count, static_cast<size_t>(n), static_cast<size_t>(rank));
  };
  const Range mine = block(ctx.rank);
  // Our block starts as our own input, exact; every peer's share is added to it as it arrives.
  if (in != out) std::memcpy(out + mine.offset, in + mine.offset, mine.count * sizeof(float));

  ctx.phase("reduce-scatter");
  transport::Completion sent, summed, gathered;
  post_coded_sends(ctx, in, a.wire, block, &sent);
  // Every peer's share of our block, added to it.
  post_coded_recvs(
      ctx, out, /*add=*/true, a.wire, [&](int) { return mine; }, &summed);
  ctx.wait(summed);
  float* own = out + mine.offset;
  if (a.op == ReduceOp::avg)
    reduce::divide(own, own, mine.count, DataType::f32, static_cast<uint64_t>(n));
  // Rounded once, here: every rank, this one included, then holds the same values.
  reduce::wire_round(own, own, mine.count, a.wire);

  ctx.phase("allgather");
  // In place, a peer's block is overwritten while our coded send of it may still be queued: but
  // the peer sends its block only once it has received all of ours, which the link coded (read)
  // before it could arrive.
  post_coded_sends(
      ctx, out, a.wire, [&](int) { return mine; }, &gathered);
  post_coded_recvs(ctx, out, /*add=*/false, a.wire, block, &gathered);
  ctx.wait(gathered);
  ctx.wait(sent);
}

}  // namespace ringreduce::algorithms
