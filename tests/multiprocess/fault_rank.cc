// One rank of the dead- and stuck-peer tests (launchers.sh cases fault*): every rank loops over
// one collective on a few MiB (or "p2p": a send to the next rank and a receive from the previous
// one, 1 MiB each, so rendezvous-sized); at an agreed moment the victim rank SIGKILLs or SIGSTOPs itself
// from a second thread while its main thread is inside a call. Each survivor prints one RESULT
// line (error type, blamed peer, seconds from the fault to the error, message) and one CLEAN line
// (descriptors and threads before the communicator and after destroying it), and exits 0 only if
// it got the error the issue asks for, in time, and the communicator left nothing behind.
//
//   fault_rank kill|stop VICTIM COLLECTIVE TIMEOUT_S
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "proc_self.h"
#include "ringreduce/ringreduce.hpp"

namespace {

using namespace ringreduce;
using SysClock = std::chrono::system_clock;

// One call of `coll` on buffers big enough that a call takes milliseconds.
void one_call(Communicator& comm, const std::string& coll, std::vector<float>& a,
              std::vector<float>& b, size_t count) {
  const size_t n = static_cast<size_t>(comm.size());
  if (coll == "allreduce")
    comm.allreduce(a.data(), b.data(), count * n, DataType::f32, ReduceOp::sum);
  else if (coll == "reduce_scatter")
    comm.reduce_scatter(a.data(), b.data(), count, DataType::f32, ReduceOp::sum);
  else if (coll == "allgather")
    comm.allgather(a.data(), b.data(), count, DataType::f32);
  else if (coll == "broadcast")
    comm.broadcast(a.data(), count * n, DataType::f32, 1);
  else if (coll == "reduce")
    comm.reduce(a.data(), b.data(), count * n, DataType::f32, ReduceOp::sum, 1);
  else if (coll == "alltoall")
    comm.alltoall(a.data(), b.data(), count, DataType::f32);
  else if (coll == "barrier")
    comm.barrier();
  else if (coll == "p2p") {
    const int n = comm.size(), me = comm.rank();
    Work s = comm.send_async(a.data(), count, DataType::f32, (me + 1) % n, 7);
    comm.recv(b.data(), count, DataType::f32, (me + n - 1) % n, 7);
    s.wait();
  }
  else
    throw InvalidArgument("unknown collective " + coll);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: fault_rank kill|stop VICTIM COLLECTIVE TIMEOUT_S\n");
    return 2;
  }
  const std::string mode = argv[1];
  const int victim = std::atoi(argv[2]);
  const std::string coll = argv[3];
  const double timeout_s = std::atof(argv[4]);
  const int fds_before = rrtest::open_fds();
  const int threads_before = rrtest::thread_count();
  int rank = -1;
  std::string type = "none", message;
  int peer = -1;
  double fault_at = 0, failed_at = 0;
  {
    Options o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    Communicator comm = Communicator::from_env(o);
    rank = comm.rank();
    const size_t count = 256 << 10;  // per rank: 1 MiB blocks, N MiB buffers
    std::vector<float> a(count * static_cast<size_t>(comm.size()), 1.0f), b(a.size());
    one_call(comm, coll, a, b, count);  // everyone is connected and running
    // The moment of the fault, agreed through rank 0's clock (one machine, one clock).
    double at = rrtest::wall_seconds() + 0.3;
    comm.broadcast(&at, 1, DataType::f64, 0);
    fault_at = at;
    if (rank == victim) {
      std::thread([at, stop = mode == "stop"] {
        std::this_thread::sleep_until(SysClock::time_point(
            std::chrono::duration_cast<SysClock::duration>(std::chrono::duration<double>(at))));
        raise(stop ? SIGSTOP : SIGKILL);
      }).detach();
    }
    try {
      // Bounded: the fault comes 0.3 s in; 30 s of calls is far beyond any deadline here.
      for (int i = 0; i < 1000000 && rrtest::wall_seconds() < at + 30; ++i)
        one_call(comm, coll, a, b, count);
      type = "none";
    } catch (const MismatchError& e) {
      type = "MismatchError", message = e.what();
    } catch (const TimeoutError& e) {
      type = "TimeoutError", message = e.what();
    } catch (const PeerError& e) {
      type = "PeerError", message = e.what(), peer = e.peer();
    } catch (const Error& e) {
      type = "Error", message = e.what();
    }
    failed_at = rrtest::wall_seconds();
    if (rank == victim) return 3;  // a stopped victim resumed: the test kills it, never this
  }
  const int fds_after = rrtest::open_fds();
  const int threads_after = rrtest::thread_count();
  const double took = failed_at - fault_at;
  std::printf("RESULT rank %d %s peer %d after %.3f s: %s\n", rank, type.c_str(), peer, took,
              message.c_str());
  std::printf("CLEAN rank %d fds %d -> %d threads %d -> %d\n", rank, fds_before, fds_after,
              threads_before, threads_after);
  bool ok = fds_after == fds_before && threads_after == threads_before;
  if (mode == "kill") {
    // Connection loss (or a dead pid on shared memory) is seen at once: 2 s is the issue's bar.
    ok = ok && type == "PeerError" && peer == victim && took < 2.0;
  } else {
    // Nothing closes: the deadline is what ends the wait, and the message names the rank waited
    // on (the victim, or the neighbour that was waiting for it and timed out first), the op and
    // its number (a send or receive: its peer and tag). Which rank is stuck is the stall
    // report's job (launchers.sh checks it).
    const std::string op = coll == "p2p" ? "(tag 7, " : coll + " #";
    ok = ok && type == "TimeoutError" &&
         message.find("timed out waiting for rank ") != std::string::npos &&
         message.find(op) != std::string::npos && took < timeout_s + 1.0;
  }
  return ok ? 0 : 1;
}
