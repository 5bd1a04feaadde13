// The ring allreduce's schedule, as functions: which chunk each rank sends and receives at each
// step. The ring algorithms run exactly these functions, and examples/ring_schedule prints them.
#pragma once

#include <cstddef>

namespace ringreduce::algorithms {

// A contiguous run of elements.
struct Range {
  size_t offset = 0;
  size_t count = 0;
};

// Part `index` of `parts` near-equal parts of `count` elements: the first count % parts parts are
// one element longer, so any count splits over any number of parts,
// including counts smaller than parts (the tail parts are empty).
Range split(size_t count, size_t parts, size_t index);

struct RingStep {
  int send_chunk;
  int recv_chunk;
};

// Reduce-scatter step t (0 <= t < n-1) on rank r, as examples/ring_schedule prints it: rank r sends
// chunk (r - t) mod n to rank r+1 and receives chunk (r - t - 1) mod n from rank r-1, which it
// reduces into its own copy. After n-1 steps rank r holds the fully reduced chunk (r + 1) mod n.
// `shift` rotates the assignment (the reduce_scatter collective uses shift = -1 so that rank r
// ends with chunk r).
RingStep reduce_scatter_step(int r, int n, int t, int shift = 0);

// Allgather step t: rank r sends chunk (r + 1 - t) mod n (at t = 0 the chunk it owns after the
// reduce-scatter) and receives chunk (r - t) mod n, overwriting its copy.
RingStep allgather_step(int r, int n, int t, int shift = 0);

// The chunk rank r owns after the reduce-scatter: (r + 1 + shift) mod n.
int owned_chunk(int r, int n, int shift = 0);

}  // namespace ringreduce::algorithms
