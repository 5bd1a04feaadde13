// Prints the ring allreduce schedule for N ranks: which chunk each rank sends and receives at each
// step of the scatter-reduce and the allgather, and the state of every chunk with string
// "reduction" (concatenation): the tables tests/unit/ring_schedule_test.cc checks. The chunk
// indices come from algorithms/ring_schedule.h, the functions the ring algorithm itself runs.
//
//   ring_schedule [N]      (default 4)
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "algorithms/ring_schedule.h"

using ringreduce::algorithms::allgather_step;
using ringreduce::algorithms::reduce_scatter_step;

namespace {

using State = std::vector<std::vector<std::string>>;  // [rank][chunk]

void print_state(const State& s) {
  std::printf("State (rows: ranks, columns: chunks):\n");
  for (size_t r = 0; r < s.size(); ++r) {
    std::printf("  rank %zu:", r);
    for (const auto& c : s[r]) std::printf(" %-*s", static_cast<int>(2 * s.size()), c.c_str());
    std::printf("\n");
  }
  std::printf("\n");
}

}  // namespace

int main(int argc, char** argv) {
  const int n = argc > 1 ? std::atoi(argv[1]) : 4;
  if (n < 2 || n > 26) {
    std::fprintf(stderr, "usage: ring_schedule [N], 2 <= N <= 26\n");
    return 2;
  }
  // Rank r's chunk c starts as the chunk's letter and the rank's number: "a0", "b0", ...
  State state(static_cast<size_t>(n), std::vector<std::string>(static_cast<size_t>(n)));
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < n; ++c)
      state[static_cast<size_t>(r)][static_cast<size_t>(c)] =
          std::string(1, static_cast<char>('a' + c)) + std::to_string(r);

  std::printf("Ring allreduce of %d ranks: each buffer is cut into %d chunks.\n\n", n, n);
  print_state(state);
  for (int t = 0; t < n - 1; ++t) {
    std::printf("Scatter-reduce, iteration %d\nGPU Send Receive\n", t + 1);
    State next = state;
    for (int r = 0; r < n; ++r) {
      auto s = reduce_scatter_step(r, n, t);
      std::printf("%d Chunk %d Chunk %d\n", r, s.send_chunk, s.recv_chunk);
      // The left neighbour sends, in the same step, the chunk this rank receives.
      const int left = (r + n - 1) % n;
      const auto from = reduce_scatter_step(left, n, t);
      next[static_cast<size_t>(r)][static_cast<size_t>(s.recv_chunk)] +=
          state[static_cast<size_t>(left)][static_cast<size_t>(from.send_chunk)];
    }
    state = next;
    std::printf("\n");
    print_state(state);
  }
  for (int t = 0; t < n - 1; ++t) {
    std::printf("Allgather, iteration %d\nGPU Send Receive\n", t + 1);
    State next = state;
    for (int r = 0; r < n; ++r) {
      auto s = allgather_step(r, n, t);
      std::printf("%d Chunk %d Chunk %d\n", r, s.send_chunk, s.recv_chunk);
      const int left = (r + n - 1) % n;
      const auto from = allgather_step(left, n, t);
      next[static_cast<size_t>(r)][static_cast<size_t>(s.recv_chunk)] =
          state[static_cast<size_t>(left)][static_cast<size_t>(from.send_chunk)];
    }
    state = next;
    std::printf("\n");
    print_state(state);
  }
  return 0;
}
