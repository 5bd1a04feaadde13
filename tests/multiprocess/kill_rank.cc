// One rank of the killed-peer test: every rank loops over large allreduces; the victim rank
// SIGKILLs itself from a second thread while its main thread is inside one. Every survivor must
// raise a PeerError naming the victim within a few seconds, and exit normally.
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

#include "ringreduce/ringreduce.hpp"

int main(int argc, char** argv) {
  using namespace ringreduce;
  const int victim = argc > 1 ? std::atoi(argv[1]) : 2;
  Options o;
  o.timeout = std::chrono::seconds(30);  // far above what the test allows: must not be the cause
  Communicator comm = Communicator::from_env(o);
  std::vector<float> buf(8 << 20, 1.0f);                 // 32 MiB: each allreduce takes a while
  comm.allreduce(std::span<float>(buf), ReduceOp::sum);  // everyone is connected and running
  if (comm.rank() == victim) {
    std::thread([] {
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      raise(SIGKILL);
    }).detach();
  }
  auto killed_at = std::chrono::steady_clock::now();
  try {
    for (int i = 0; i < 1000; ++i) comm.allreduce(std::span<float>(buf), ReduceOp::sum);
    std::printf("rank %d: no error\n", comm.rank());
    return 1;
  } catch (const PeerError& e) {
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - killed_at).count();
    std::printf("PeerError after %.3f s (peer %d): %s\n", s, e.peer(), e.what());
    return s < 5.0 ? 0 : 1;
  } catch (const Error& e) {
    std::printf("wrong error type: %s\n", e.what());
    return 1;
  }
}
