#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {
namespace {
int mod(int a, int n) {
  return ((a % n) + n) % n;
}
}  // namespace

Range split(size_t count, size_t parts, size_t index) {
  const size_t base = count / parts, extra = count % parts;
  Range r;
  r.count = base + (index < extra ? 1 : 0);
  r.offset = index * base + (index < extra ? index : extra);
  return r;
}

RingStep reduce_scatter_step(int r, int n, int t, int shift) {
  return {mod(r + shift - t, n), mod(r + shift - t - 1, n)};
}

RingStep allgather_step(int r, int n, int t, int shift) {
  return {mod(r + shift + 1 - t, n), mod(r + shift - t, n)};
}

int owned_chunk(int r, int n, int shift) {
  return mod(r + shift + 1, n);
}

}  // namespace ringreduce::algorithms
