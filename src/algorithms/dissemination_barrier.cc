// Dissemination barrier: in round k every rank signals rank r + 2^k and waits for rank r - 2^k.
// After ceil(lg N) rounds every rank has heard, directly or not, from every other, so none can
// leave before all have arrived. Messages are empty frames.
#include "algorithms/algorithm.h"

namespace ringreduce::algorithms {

void dissemination_barrier(Context& ctx, const Args&) {
  const int n = ctx.size, r = ctx.rank;
  for (int k = 1; k < n; k *= 2) {
    transport::Completion done;
    ctx.link((r + k) % n).send(nullptr, 0, &done);
    ctx.link((r - k + n) % n).recv(nullptr, 0, &done);
    ctx.wait(done);
  }
}

}  // namespace ringreduce::algorithms
