// Flat allreduce for small buffers on one host: every rank publishes its input in the shared
// window (flat_window.h) and reduces all N inputs itself. One step instead of lg N exchanges
// (recursive doubling) or 2(N-1) (ring): a rank waits only until every peer has written, which on
// a host whose ranks share cores is one turn of each. It reads N inputs where recursive doubling
// combines lg N, so it suits buffers of a few KiB, which the tuner keeps it to.
//
// Every rank combines the inputs in rank order (in_0 op in_1 op ... in_{N-1}), so all ranks get
// the same bits; avg divides once at the end.

#include "algorithms/algorithm.h"
#include "algorithms/flat_window.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {

// Cost: every rank publishes its input in its window, waits until all have (one step) and reads
// and combines the N inputs. A message's byte is copied twice (into a FIFO slot and out of it) and
// beta prices that; the publish is one copy and each peer's byte is read once from another core's
// cache (flat's few KiB stay cached), so both cost beta / 2; and N-1 combines.
double flat_allreduce_cost(const CostInputs& in, double k, double /*segment*/) {
  const int n = in.n;
  if (n <= 1) return 0;
  const Costs& c = in.costs;
  return c.link.alpha + k * c.link.beta / 2 + (n - 1) * k * (c.link.beta / 2 + c.gamma);
}

void flat_allreduce(Context& ctx, const Args& a) {
  const size_t bytes = a.count * dtype_size(a.dtype);
  char* out = static_cast<char*>(a.recv);
  if (ctx.size == 1 || bytes == 0) {
    if (out != a.send) reduce::copy(out, a.send, bytes, /*stream=*/false);
    return;
  }
  transport::Window& w = *ctx.transport.window();
  flat::publish(ctx, w, a.send, bytes);
  flat::wait_for_all(ctx, w);
  // Our own input: ranks 0 and 1 read it from `send` (the first combine reads each element before
  // writing it, so in place is safe there, and it is in cache, where our window copy may still
  // wait in the store buffer for its cache line); later ranks from the window copy, because in
  // place `out` is overwritten as we go.
  auto input = [&](int q) -> const void* {
    if (q == ctx.rank && q <= 1) return a.send;
    return flat::area(w, q, ctx.rank, ctx.seq).payload(bytes);
  };
  reduce::combine(out, input(0), input(1), a.count, a.dtype, a.op);
  for (int q = 2; q < ctx.size; ++q) reduce::combine(out, out, input(q), a.count, a.dtype, a.op);
  if (a.op == ReduceOp::avg)
    reduce::divide(out, out, a.count, a.dtype, static_cast<uint64_t>(ctx.size));
}

}  // namespace ringreduce::algorithms
