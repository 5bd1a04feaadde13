// Flat barrier on one host: every rank stamps its area of the shared window (flat_window.h) and
// waits until every peer has stamped. One step, where the dissemination barrier takes lg N rounds
// of messages.
#include "algorithms/algorithm.h"
#include "algorithms/flat_window.h"

namespace ringreduce::algorithms {

void flat_barrier(Context& ctx, const Args& /*a*/) {
  if (ctx.size == 1) return;
  transport::Window& w = *ctx.transport.window();
  flat::publish(ctx, w, nullptr, 0);
  flat::wait_for_all(ctx, w);
}

}  // namespace ringreduce::algorithms
