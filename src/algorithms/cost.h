// The alpha-beta-gamma cost model the tuner chooses by (docs/TUNING.md has the formulas with
// their derivations). alpha: the time of one message step, beta: of one byte through a link,
// gamma: of one byte reduced, pi: of one byte a step's result spends in a buffer. Each algorithm
// file states its own cost at its top (as MPICH's do), as a function of these, the world size N
// and the buffer size K; the tuner runs the cheapest of the algorithms that suit the links.
#pragma once

#include <bit>
#include <cstddef>

#include "transport/kind.h"

namespace ringreduce::algorithms {

using transport::LinkCost;

struct Costs {
  LinkCost link;
  double gamma = 0;  // seconds per byte of one combine (two inputs into one output)
  // Seconds per byte that a step pays when its result goes through a buffer before the next
  // step sends it (recursive doubling, Rabenseifner, the trees), on top of beta: the ring's
  // fused forwards, which shared memory reduces from one FIFO slot straight into the next, do
  // not. Measured at start-up (Rabenseifner against the ring); small beside a network's beta.
  double pi = 0;
  // Seconds per float32 byte to code it narrow (bf16) and decode it again, added to a sum: what
  // a coded collective pays per byte beyond the links (Tuner::resolve_wire). Measured by rank 0
  // at start-up beside gamma.
  double codec = 0;
};

// Everything a cost function may use besides the call's size.
struct CostInputs {
  Costs costs;
  int n = 1;                // ranks
  int tree_depth = 0;       // tree_depth(n), computed once by the tuner
  int host_size = 0;        // ranks per host when several hosts have as many each, else 0
  size_t link_segment = 0;  // the links' preferred message size (KindTraits::segment_bytes)
};

// Predicted seconds for one call of K bytes (allreduce, broadcast, reduce: the buffer; per rank)
// with pipeline segments of `segment` bytes where the algorithm pipelines.
using CostFn = double (*)(const CostInputs& in, double k, double segment);
// The segment an algorithm pipelines with, when it is not the links' preferred size.
using SegmentFn = size_t (*)(const CostInputs& in, size_t bytes);
// For an algorithm the model does not compare: whether it takes a call of `bytes` outright.
using RuleFn = bool (*)(const CostInputs& in, size_t bytes);

// The largest power of two <= n (n >= 1): the ranks recursive doubling and Rabenseifner run over,
// the other n - p being folded in and out.
inline int largest_power_of_two(int n) {
  int p = 1;
  while (p * 2 <= n) p *= 2;
  return p;
}
// floor(lg n), ceil(lg n), and whether n is not a power of two (the recursive algorithms fold
// the other n - p ranks in and out: two whole-buffer steps).
inline int floor_lg(int n) {
  return std::countr_zero(static_cast<unsigned>(largest_power_of_two(n)));
}
inline int ceil_lg(int n) {
  int lg = 0;
  while ((1 << lg) < n) ++lg;
  return lg;
}
inline bool folds(int n) {
  return largest_power_of_two(n) != n;
}

// Recursive doubling's steps at n ranks: lg p, and two more when it folds (n not a power of two).
// The start-up probe divides recursive doubling's time by it to get alpha.
inline int rd_steps(int n) {
  return n <= 1 ? 0 : floor_lg(n) + 2 * folds(n);
}

// The depth of the deeper of the double binary tree's two trees (tree_shape.cc).
int tree_depth(int n);

}  // namespace ringreduce::algorithms
