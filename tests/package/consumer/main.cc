// A user's C++ program: allreduce of (rank + 1) over every rank, checked, and the header's and
// the library's versions compared. Prints "consumer ok" on success; exits 1 otherwise.
#include <cstdio>
#include <cstring>
#include <vector>

#include "ringreduce/ringreduce.hpp"

int main() {
  if (std::strcmp(ringreduce::Communicator::version(), RINGREDUCE_VERSION_STRING) != 0) {
    std::fprintf(stderr, "header %s, library %s\n", RINGREDUCE_VERSION_STRING,
                 ringreduce::Communicator::version());
    return 1;
  }
  auto comm = ringreduce::Communicator::from_env();
  std::vector<float> v(1000, static_cast<float>(comm.rank() + 1));
  comm.allreduce(std::span<float>(v), ringreduce::ReduceOp::sum);
  const float want = static_cast<float>(comm.size() * (comm.size() + 1) / 2);
  for (float x : v) {
    if (x != want) {
      std::fprintf(stderr, "rank %d: got %g, want %g\n", comm.rank(), x, want);
      return 1;
    }
  }
  std::printf("consumer ok: rank %d of %d, ringreduce %s\n", comm.rank(), comm.size(),
              ringreduce::Communicator::version());
  return 0;
}
