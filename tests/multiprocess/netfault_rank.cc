// One rank of the network-fault tests on the emulated cluster (cluster.sh case linkdown): every
// rank loops over allreduces of MIB MiB, each checked, until one fails or LIMIT_S seconds pass.
// Once its first call is done it creates READY_DIR/<rank>, so that the test cuts a link only
// when every rank is inside the loop. The fault comes from outside (the test takes a host's link
// down), so a rank cannot time its own error: it prints the wall-clock time of the failure and
// the test subtracts the moment of the cut (one machine, one clock).
//
// Prints "RESULT rank R TYPE peer P at T: MESSAGE" (TYPE: TimeoutError, PeerError, ...; P: a
// PeerError's peer, else -1; T: seconds since the epoch) and "CLEAN rank R fds A -> B threads
// C -> D" (before the communicator and after destroying it). Exits 0 when a call failed with an
// Error (the test judges which), 1 when LIMIT_S passed without one or a result was wrong.
//
//   netfault_rank MIB LIMIT_S READY_DIR
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "proc_self.h"
#include "ringreduce/ringreduce.hpp"

namespace {

using namespace ringreduce;

}  // namespace

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: netfault_rank MIB LIMIT_S READY_DIR\n");
    return 2;
  }
  const size_t count = static_cast<size_t>(std::atof(argv[1]) * (1 << 20)) / sizeof(float);
  const double limit_s = std::atof(argv[2]);
  const std::string ready_dir = argv[3];
  const int fds_before = rrtest::open_fds();
  const int threads_before = rrtest::thread_count();
  int rank = -1, peer = -1, calls = 0;
  std::string type = "none", message;
  double failed_at = 0;
  bool wrong = false;
  {
    // RINGREDUCE_TIMEOUT and the rest come from the environment, as in a real job.
    Communicator comm = Communicator::from_env();
    rank = comm.rank();
    const int n = comm.size();
    // Rank r contributes r + 1 everywhere: every element of the sum is n(n+1)/2, exactly.
    std::vector<float> in(count, static_cast<float>(rank + 1)), out(count);
    const float want = static_cast<float>(n * (n + 1) / 2);
    const double end = rrtest::wall_seconds() + limit_s;
    try {
      for (; rrtest::wall_seconds() < end; ++calls) {
        comm.allreduce(in.data(), out.data(), count, DataType::f32, ReduceOp::sum);
        for (size_t i = 0; i < count; i += 4099)
          if (out[i] != want) {
            std::printf("WRONG rank %d call %d element %zu: %g, not %g\n", rank, calls, i,
                        static_cast<double>(out[i]), static_cast<double>(want));
            wrong = true;
            break;
          }
        if (wrong) break;
        if (calls == 0) {
          const std::string mark = ready_dir + "/" + std::to_string(rank);
          const int fd = ::open(mark.c_str(), O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
          if (fd >= 0) ::close(fd);
        }
      }
    } catch (const TimeoutError& e) {
      type = "TimeoutError", message = e.what();
    } catch (const PeerError& e) {
      type = "PeerError", message = e.what(), peer = e.peer();
    } catch (const MismatchError& e) {
      type = "MismatchError", message = e.what();
    } catch (const Error& e) {
      type = "Error", message = e.what();
    }
    failed_at = rrtest::wall_seconds();
  }
  const double destroyed_at = rrtest::wall_seconds();
  std::printf("RESULT rank %d %s peer %d at %.3f: %s\n", rank, type.c_str(), peer, failed_at,
              message.c_str());
  std::printf("CLEAN rank %d fds %d -> %d threads %d -> %d destroy %.3f s calls %d\n", rank,
              fds_before, rrtest::open_fds(), threads_before, rrtest::thread_count(),
              destroyed_at - failed_at, calls);
  std::fflush(stdout);
  return type != "none" && !wrong ? 0 : 1;
}
