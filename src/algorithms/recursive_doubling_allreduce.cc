// Recursive-doubling allreduce for small buffers: lg N exchange steps of the whole buffer instead
// of the ring's 2(N-1) steps of 1/N of it, so latency, not bandwidth, sets its time.
//
// Step k pairs rank v with v XOR 2^k; both send their partial result and combine the other's, so
// every rank applies the same additions in the same tree (operands swapped, which IEEE addition
// and multiplication do not notice): all ranks end bitwise identical. A world that is not a power
// of two is folded first, as MPICH does: of the first 2*rem ranks (rem = N - 2^floor(lg N)), each
// even rank hands its buffer to the odd rank above it and sits out; the odd rank gets the result
// back at the end.
#include <cstring>

#include "algorithms/algorithm.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

// Cost: lg p exchanges of the whole buffer, each followed by a combine; folding adds a send and a
// combine before and a send after. Every step's result goes through the output (pi).
double rd_allreduce_cost(const CostInputs& in, double k, double /*segment*/) {
  const int n = in.n;
  if (n <= 1) return 0;
  const Costs& c = in.costs;
  const int lg = floor_lg(n), f = folds(n);
  return (lg + 2 * f) * (c.link.step(k) + k * c.pi) + (lg + f) * k * c.gamma;
}

void recursive_doubling_allreduce(Context& ctx, const Args& a) {
  const size_t bytes = a.count * dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int n = ctx.size, r = ctx.rank;
  if (in != out && bytes > 0) std::memcpy(out, in, bytes);
  if (n == 1 || bytes == 0) return;
  // The partner's partial result lands here; combining into `out` waits until our own send of
  // `out` has left, so the two never overlap.
  char* incoming = static_cast<char*>(ctx.scratch(bytes));
  auto exchange = [&](int peer) {
    transport::Completion done;
    ctx.link(peer).send(out, bytes, &done);
    ctx.link(peer).recv(incoming, bytes, &done);
    ctx.wait(done);
    reduce::combine(out, out, incoming, a.count, a.dtype, a.op);
  };

  const int pof2 = largest_power_of_two(n);
  const int rem = n - pof2;
  // Fold: ranks below 2*rem pair up (even -> odd); the rest shift down by rem.
  int vrank;
  if (r < 2 * rem) {
    if (r % 2 == 0) {
      transport::Completion done;
      ctx.link(r + 1).send(out, bytes, &done);
      ctx.wait(done);
      vrank = -1;
    } else {
      transport::Completion done;
      ctx.link(r - 1).recv(incoming, bytes, &done);
      ctx.wait(done);
      reduce::combine(out, out, incoming, a.count, a.dtype, a.op);
      vrank = r / 2;
    }
  } else {
    vrank = r - rem;
  }
  if (vrank >= 0) {
    for (int mask = 1; mask < pof2; mask <<= 1) {
      const int vpeer = vrank ^ mask;
      exchange(vpeer < rem ? vpeer * 2 + 1 : vpeer + rem);
    }
  }
  if (a.op == ReduceOp::avg) {
    // Only ranks holding the result divide; folded-out ranks receive it already divided.
    if (vrank >= 0) reduce::divide(out, out, a.count, a.dtype, static_cast<uint64_t>(n));
  }
  // Unfold: odd ranks return the result to the even rank they absorbed.
  if (r < 2 * rem) {
    transport::Completion done;
    if (r % 2 == 1)
      ctx.link(r - 1).send(out, bytes, &done);
    else
      ctx.link(r + 1).recv(out, bytes, &done);
    ctx.wait(done);
  }
}

}  // namespace ringreduce::algorithms
