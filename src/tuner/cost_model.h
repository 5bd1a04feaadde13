// The alpha-beta-gamma cost model the tuner chooses by (docs/TUNING.md has the formulas with
// their derivations). alpha: the time of one message step, beta: of one byte through a link,
// gamma: of one byte reduced. Each algorithm's predicted time is a function of these, the world
// size N and the buffer size K; the tuner runs the cheapest.
#pragma once

#include <algorithm>
#include <cstddef>
#include <string>

namespace ringreduce::tuner {

// One kind of link as measured at start-up (comm/ probes it) or read from a calibration file.
struct LinkCost {
  double alpha = 0;  // seconds per message step, every rank stepping at once
  double beta = 0;   // seconds per byte through one link while every link carries as much
  // A step costs max(alpha, bytes * beta) instead of their sum: across hosts the kernel's TCP
  // stack overlaps a message's latency with the transfer of the one before (measured on the
  // emulated cluster: the ring's 64 KiB steps at 1 Gbit/s took their transfer time alone).
  bool overlap = false;
  double step(double bytes) const {
    return overlap ? std::max(alpha, bytes * beta) : alpha + bytes * beta;
  }
};

struct Costs {
  LinkCost link;
  double gamma = 0;  // seconds per byte of one combine (two inputs into one output)
  // Seconds per byte that a step pays when its result goes through a buffer before the next
  // step sends it (recursive doubling, Rabenseifner, the trees), on top of beta: the ring's
  // fused forwards, which shared memory reduces from one FIFO slot straight into the next, do
  // not. Measured at start-up (Rabenseifner against the ring); small beside a network's beta.
  double pi = 0;
};

// Predicted seconds for one call of K bytes (allreduce, broadcast, reduce: the buffer; per rank)
// on n ranks. `segment` is the pipeline segment where the algorithm pipelines.
double ring_allreduce_cost(const Costs& c, int n, double k);
double rd_allreduce_cost(const Costs& c, int n, double k);
double rabenseifner_allreduce_cost(const Costs& c, int n, double k);
// depth: tree_depth(n), which the tuner computes once.
double tree_allreduce_cost(const Costs& c, int n, int depth, double k, double segment);
double flat_allreduce_cost(const Costs& c, int n, double k);
double direct_allreduce_cost(const Costs& c, int n, double k);
// The elements of a slice that direct_allreduce.cc reduces per round (its window holds two
// buffers of N such pieces).
double direct_piece_bytes(int n);
double chain_broadcast_cost(const Costs& c, int n, double k, double segment);
double binomial_broadcast_cost(const Costs& c, int n, double k);
double chain_reduce_cost(const Costs& c, int n, double k, double segment);
double binomial_reduce_cost(const Costs& c, int n, double k);

// The tree's segment: the one that minimises tree_allreduce_cost (more segments add alphas,
// larger ones lengthen the pipeline's fill), a multiple of 4 KiB between 4 KiB and 1 MiB.
size_t tree_segment(const Costs& c, int depth, double k);

// Recursive doubling's steps at n ranks: lg p, and two more when it folds (n not a power of two).
// The start-up probe divides recursive doubling's time by it to get alpha.
int rd_steps(int n);

// The depth of the deeper of the double binary tree's two trees.
int tree_depth(int n);

}  // namespace ringreduce::tuner
