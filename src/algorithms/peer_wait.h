// Waiting for a stamp from every peer, shared by the algorithms that publish in the shared window
// (flat, direct, registered).
#pragma once

#include "algorithms/algorithm.h"

namespace ringreduce::algorithms {

// Returns once every peer has stamped. watch(q) returns a predicate, true once peer q has
// stamped, that may throw (a MismatchError for a fingerprint that is another call's); it is made
// once per wait, so that what it needs (addresses) is found before the wait polls it: at two ranks
// a small op is a few polls, and a predicate that looked its stamp up on every poll cost 0.1 us.
// A peer found stamped is not looked at again. The wait is for one peer at a time, which a
// timeout blames: the first in rank order not stamped, except that while ranks outnumber cores a
// peer that last ran on this rank's core goes first. The window gives the core up at once for
// such a peer, which cannot stamp until it runs here, and watches a while for one running
// elsewhere (at 4 ranks on 2 cores: one process switch per core and op instead of 1.5).
template <class Watch>
void wait_all_peers(Context& ctx, transport::Window& w, Watch&& watch) {
  int next = 0;  // peers below have stamped
  auto all = [&] {
    for (; next < ctx.size; ++next)
      if (next != ctx.rank && !watch(next)()) return false;
    return true;
  };
  while (!all()) {
    int q = next;
    if (!w.shares_core(q))
      for (int p = next + 1; p < ctx.size; ++p)
        if (p != ctx.rank && w.shares_core(p) && !watch(p)()) {
          q = p;
          break;
        }
    auto stamped = watch(q);
    w.wait(stamped, q, ctx.deadline);
  }
}

}  // namespace ringreduce::algorithms
