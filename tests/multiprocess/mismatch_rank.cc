// One rank of the mismatch test: rank 1 issues an allreduce with a different count from everyone
// else. Every rank must get a MismatchError naming both calls within a few seconds.
#include <chrono>
#include <cstdio>
#include <vector>

#include "ringreduce/ringreduce.hpp"

int main() {
  using namespace ringreduce;
  Options o;
  o.timeout = std::chrono::seconds(30);  // far above what the test allows: must not be the cause
  Communicator comm = Communicator::from_env(o);
  std::vector<float> warm(1000, 1.0f);
  const size_t count = comm.rank() == 1 ? 200000 : 100000;
  std::vector<float> buf(count, 1.0f);
  auto start = std::chrono::steady_clock::now();
  try {
    // A matched call first. A rank still finishing it when another rank has already found the
    // mismatch in the next call fails here, with that rank's report: the job is failing.
    comm.allreduce(std::span<float>(warm), ReduceOp::sum);
    comm.allreduce(std::span<float>(buf), ReduceOp::sum);
    std::printf("rank %d: no error\n", comm.rank());
    return 1;
  } catch (const MismatchError& e) {
    double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("MismatchError after %.3f s: %s\n", s, e.what());
    return s < 5.0 ? 0 : 1;
  } catch (const Error& e) {
    std::printf("wrong error type: %s\n", e.what());
    return 1;
  }
}
