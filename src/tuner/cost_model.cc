#include "tuner/cost_model.h"

#include <bit>
#include <cmath>

#include "algorithms/algorithm.h"
#include "algorithms/tree_shape.h"

namespace ringreduce::tuner {

namespace {

// floor(lg n) and whether n is a power of two: the recursive algorithms run over the largest
// power of two p <= n and fold the other n - p ranks in and out, two whole-buffer steps.
int floor_lg(int n) {
  return std::countr_zero(static_cast<unsigned>(algorithms::largest_power_of_two(n)));
}
bool folds(int n) {
  return algorithms::largest_power_of_two(n) != n;
}
int ceil_lg(int n) {
  int lg = 0;
  while ((1 << lg) < n) ++lg;
  return lg;
}

}  // namespace

// 2(N-1) steps of K/N bytes; N-1 of them combine K/N bytes.
double ring_allreduce_cost(const Costs& c, int n, double k) {
  if (n <= 1) return 0;
  const double chunk = k / n;
  return 2.0 * (n - 1) * c.link.step(chunk) + (n - 1) * chunk * c.gamma;
}

int rd_steps(int n) {
  return n <= 1 ? 0 : floor_lg(n) + 2 * folds(n);
}

// lg p exchanges of the whole buffer, each followed by a combine; folding adds a send and a
// combine before and a send after. Every step's result goes through the output (pi).
double rd_allreduce_cost(const Costs& c, int n, double k) {
  if (n <= 1) return 0;
  const int lg = floor_lg(n), f = folds(n);
  return (lg + 2 * f) * (c.link.step(k) + k * c.pi) + (lg + f) * k * c.gamma;
}

// Recursive halving: steps of K/2, K/4, .., K/p bytes, each combined; recursive doubling back up
// with the same sizes, not combined. Bytes per rank 2(p-1)/p K, the ring's for N = p.
double rabenseifner_allreduce_cost(const Costs& c, int n, double k) {
  if (n <= 1) return 0;
  const int lg = floor_lg(n), f = folds(n);
  double t = 0, part = k;
  for (int i = 0; i < lg; ++i) {
    part /= 2;
    t += 2 * (c.link.step(part) + part * c.pi) + part * c.gamma;
  }
  return t + f * (2 * (c.link.step(k) + k * c.pi) + k * c.gamma);
}

int tree_depth(int n) {
  int depth = 0;
  for (int p = 0; p < n; ++p) {
    int d = 0;
    for (int q = p; q != 0; q = algorithms::binary_tree(n, q).parent) ++d;
    depth = std::max(depth, d);
  }
  return depth;
}

// Each tree carries K/2 bytes in m segments. A segment climbs D levels and descends D; with
// the pipeline full, every cycle moves one segment of each tree, and a rank then receives four
// segments (two children's in the tree where it is inner, one from each parent) and combines two.
// So (2D + m - 1) cycles of one step of 4 segments' bytes (shared over up to four links, but on
// one host the copies share the rank's CPU) and 2 segments' combines.
double tree_allreduce_cost(const Costs& c, int n, int depth, double k, double segment) {
  if (n <= 1) return 0;
  const double half = k / 2;
  const double seg = std::max(1.0, std::min(segment, half));
  const double m = std::ceil(half / seg);
  const int d = depth;
  return (2 * d + m - 1) * (c.link.step(4 * seg) + 4 * seg * c.pi + 2 * seg * c.gamma);
}

size_t tree_segment(const Costs& c, int depth, double k) {
  constexpr double kMin = 4 << 10, kMax = 1 << 20;
  if (c.link.beta <= 0) return 256 << 10;
  // d/dS of (K/2S) alpha + 2D * 4 S beta = 0.
  const double best = std::sqrt(k / 2 * c.link.alpha / (8 * std::max(depth, 1) * c.link.beta));
  const double s = std::clamp(best, kMin, kMax);
  return static_cast<size_t>(s / 4096) * 4096;
}

// Every rank publishes its input in its window, waits until all have (one step) and reads and
// combines the N inputs. A message's byte is copied twice (into a FIFO slot and out of it) and
// beta prices that; the publish is one copy and each peer's byte is read once from another core's
// cache (flat's few KiB stay cached), so both cost beta / 2; and N-1 combines.
double flat_allreduce_cost(const Costs& c, int n, double k) {
  if (n <= 1) return 0;
  return c.link.alpha + k * c.link.beta / 2 + (n - 1) * k * (c.link.beta / 2 + c.gamma);
}

double direct_piece_bytes(int n) {
  // direct_allreduce.cc: two buffers of N pieces in a 2 MiB window, after the flat areas
  // (128 KiB) and a 4 KiB header, at most 256 KiB each.
  return std::min(256.0 * 1024,
                  static_cast<double>((size_t{2} << 20) - (size_t{132} << 10)) / (2.0 * n));
}

// Per round of one piece of each slice: two steps (staged, reduced). A rank copies its input
// into its staging buffer (one local copy: beta / 2, as flat's publish), reads the N-1 peers'
// copies of its own slice and combines them, and copies the N-1 other reduced slices out of
// their owners' windows. Those 2 (N-1)/N K bytes read from other cores cost 3/4 beta each:
// between flat's beta / 2 (a few KiB, cache to cache) and a message's beta, because direct
// streams the whole buffer through the window. Fitted to the forced-algorithm sweeps at N = 2, 4,
// 8 (docs/TUNING.md): it puts direct ahead of the ring from 16 KiB to about 1 MiB at N = 4 and 8
// and level with it at N = 2, as measured, and behind it from a few MiB.
double direct_allreduce_cost(const Costs& c, int n, double k) {
  if (n <= 1) return 0;
  const double rounds = std::max(1.0, std::ceil(k / n / direct_piece_bytes(n)));
  const double others = (n - 1) * (k / n);
  return 2 * rounds * c.link.alpha + k * c.link.beta / 2 + others * (1.5 * c.link.beta + c.gamma);
}

// The chain forwards each of m segments: N-1 hops to fill, m-1 more to drain.
double chain_broadcast_cost(const Costs& c, int n, double k, double segment) {
  if (n <= 1) return 0;
  const double seg = std::max(1.0, std::min(segment, k));
  const double m = std::ceil(k / seg);
  return (n - 1 + m - 1) * c.link.step(seg);
}

// ceil(lg N) rounds, the root sending the whole buffer in each.
double binomial_broadcast_cost(const Costs& c, int n, double k) {
  return ceil_lg(n) * c.link.step(k);
}

double chain_reduce_cost(const Costs& c, int n, double k, double segment) {
  if (n <= 1) return 0;
  const double seg = std::max(1.0, std::min(segment, k));
  const double m = std::ceil(k / seg);
  return (n - 1 + m - 1) * (c.link.step(seg) + seg * c.gamma);
}

double binomial_reduce_cost(const Costs& c, int n, double k) {
  return ceil_lg(n) * (c.link.step(k) + k * c.pi + k * c.gamma);
}

}  // namespace ringreduce::tuner
