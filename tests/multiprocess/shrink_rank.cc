// One rank of the kill-and-shrink tests (launchers.sh cases shrink-*): every rank loops over a
// call on 1 MiB per rank; at an agreed moment the victims SIGKILL themselves. A survivor that
// gets an error shrinks the communicator and goes on; at the end each survivor checks that its
// communicator holds exactly the ranks that were not killed, that a collective on it is exact,
// and prints a RESULT line with the seconds from the kill to the error and to the first exact
// collective after the shrink, and a CLEAN line (descriptors and threads before the first
// communicator and after the last is destroyed). Exits 0 only if all of that holds.
//
//   shrink_rank WHEN VICTIMS N_EXPECTED TIMEOUT_S
//     WHEN: coll     the victims die inside an allreduce (a thread of theirs raises SIGKILL)
//           between  the victims die between two calls (their main thread, after a call)
//           p2p      the loop is a ring of sends and receives; the victims die inside it
//           shrink   the first victim dies inside an allreduce, the others while the survivors
//                    are shrinking (a few ms after they see the first death: inside the
//                    agreement or while the links are made)
//           restart  the restart-everything baseline under torchrun --max-restarts (the
//                    bench's, bench/drivers/elastic_recovery.sh): in the first attempt the
//                    victims die inside an allreduce and the others fail and exit; torchrun starts
//                    them all again, and the next attempt prints the seconds from the kill to
//                    its first exact allreduce. The kill's time travels in $RR_RESTART_FILE.
//     VICTIMS: comma-separated ranks ("2", "0,3")
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "proc_self.h"
#include "ringreduce/ringreduce.hpp"

namespace {

using namespace ringreduce;
using SysClock = std::chrono::system_clock;

void sleep_until_wall(double at) {
  std::this_thread::sleep_until(SysClock::time_point(
      std::chrono::duration_cast<SysClock::duration>(std::chrono::duration<double>(at))));
}

// Every rank adds (its rank in the first communicator) + 1, so the sum says who took part.
bool exact_allreduce(Communicator& comm, const std::vector<int>& world_ranks,
                     std::vector<float>& buf) {
  const float mine = static_cast<float>(world_ranks[static_cast<size_t>(comm.rank())] + 1);
  std::fill(buf.begin(), buf.end(), mine);
  comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum);
  float want = 0;
  for (int r : world_ranks) want += static_cast<float>(r + 1);
  return buf.front() == want && buf.back() == want && buf[buf.size() / 2] == want;
}

void ring_p2p(Communicator& comm, std::vector<float>& a, std::vector<float>& b) {
  const int n = comm.size(), me = comm.rank();
  Work s = comm.send_async(a.data(), b.size(), DataType::f32, (me + 1) % n, 5);
  comm.recv(b.data(), b.size(), DataType::f32, (me + n - 1) % n, 5);
  s.wait();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr,
                 "usage: shrink_rank coll|between|p2p|shrink VICTIMS N_EXPECTED TIMEOUT_S\n");
    return 2;
  }
  const std::string when = argv[1];
  std::vector<int> victims;
  {
    std::stringstream ss(argv[2]);
    for (std::string v; std::getline(ss, v, ',');) victims.push_back(std::atoi(v.c_str()));
  }
  const int expected = std::atoi(argv[3]);
  const double timeout_s = std::atof(argv[4]);
  if (when == "restart") {
    const char* file = std::getenv("RR_RESTART_FILE");
    const char* attempt = std::getenv("TORCHELASTIC_RESTART_COUNT");
    if (!file) return 2;
    Options o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    Communicator comm = Communicator::from_env(o);
    std::vector<int> world(static_cast<size_t>(comm.size()));
    for (int r = 0; r < comm.size(); ++r) world[static_cast<size_t>(r)] = r;
    std::vector<float> buf((256 << 10) * static_cast<size_t>(comm.size()));
    if (attempt && std::atoi(attempt) > 0) {
      const bool ok = exact_allreduce(comm, world, buf);
      double at = 0;
      if (FILE* f = std::fopen(file, "r")) {
        if (std::fscanf(f, "%lf", &at) != 1) at = 0;
        std::fclose(f);
      }
      std::printf("RESULT rank %d restarted exact %d recovered after %.3f s\n", comm.rank(),
                  ok ? 1 : 0, rrtest::wall_seconds() - at);
      return ok ? 0 : 1;
    }
    if (!exact_allreduce(comm, world, buf)) return 4;
    double at = rrtest::wall_seconds() + 0.3;
    comm.broadcast(&at, 1, DataType::f64, 0);
    if (comm.rank() == 0) {
      if (FILE* f = std::fopen(file, "w")) {
        std::fprintf(f, "%.6f\n", at);
        std::fclose(f);
      }
    }
    if (std::count(victims.begin(), victims.end(), comm.rank()) > 0) {
      std::thread([at] {
        sleep_until_wall(at);
        raise(SIGKILL);
      }).detach();
    }
    try {
      for (int i = 0; i < 1000000 && rrtest::wall_seconds() < at + 30; ++i)
        exact_allreduce(comm, world, buf);
    } catch (const Error&) {
      return 1;  // torchrun restarts everyone
    }
    return 3;
  }
  const int fds_before = rrtest::open_fds();
  const int threads_before = rrtest::thread_count();
  int rank = -1, shrinks = 0, final_size = -1, since_shrink = 0;
  double destroy_s = 0;
  double fault_at = 0, error_at = 0, recovered_at = 0;
  std::string first_error, survivors;
  bool exact = false;
  {
    Options o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    Communicator comm = Communicator::from_env(o);
    rank = comm.rank();
    const int n = comm.size();
    // The ranks of the first communicator, by rank of the current one.
    std::vector<int> world(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) world[static_cast<size_t>(r)] = r;
    const size_t count = 256 << 10;  // 1 MiB per rank
    std::vector<float> buf(count * static_cast<size_t>(n)), other(count);
    if (!exact_allreduce(comm, world, buf)) return 4;
    double at = rrtest::wall_seconds() + 0.3;
    comm.broadcast(&at, 1, DataType::f64, 0);
    fault_at = at;
    const bool victim = std::count(victims.begin(), victims.end(), rank) > 0;
    const bool first_victim = victim && rank == victims.front();
    if (victim && when == "shrink" && !first_victim) {
      // The later victims die while the survivors shrink: a few milliseconds after they see the
      // first death themselves (their communicator's abort hook), when the others are agreeing
      // or making their links. (A fixed delay after the first death missed the shrink once it
      // took 20 ms.)
      comm.on_abort([rank](std::exception_ptr) {
        std::thread([rank] {
          std::this_thread::sleep_for(std::chrono::milliseconds(2 + 3 * (rank % 4)));
          raise(SIGKILL);
        }).detach();
      });
    }
    if (victim && when != "between" && (when != "shrink" || first_victim)) {
      std::thread([at] {
        sleep_until_wall(at);
        raise(SIGKILL);
      }).detach();
    }
    // Bounded: the fault comes 0.3 s in; 30 s of calls is far beyond any deadline here.
    for (int i = 0; i < 1000000 && rrtest::wall_seconds() < at + 30; ++i) {
      try {
        if (when == "p2p" && shrinks == 0) {
          ring_p2p(comm, buf, other);
        } else {
          exact = exact_allreduce(comm, world, buf);
          if (!exact) break;
          if (victim && when == "between" && rrtest::wall_seconds() >= at) raise(SIGKILL);
          if (shrinks > 0) {
            if (recovered_at == 0) recovered_at = rrtest::wall_seconds();
            // A few more calls, then done: the survivors stop together (the same count since
            // the last shrink on every one).
            if (++since_shrink == 8) break;
          }
        }
      } catch (const Error& e) {
        if (first_error.empty()) {
          first_error = e.what();
          error_at = rrtest::wall_seconds();
        }
        recovered_at = 0;
        since_shrink = 0;
        try {
          Communicator small = comm.shrink();
          std::vector<int> next;
          for (int p : small.parent_ranks()) next.push_back(world[static_cast<size_t>(p)]);
          world = next;
          // Destroying the aborted parent never waits for its peers (nor for a store that died
          // with rank 0): timed, and held to a bound.
          const double d0 = rrtest::wall_seconds();
          comm = std::move(small);
          destroy_s = std::max(destroy_s, rrtest::wall_seconds() - d0);
          ++shrinks;
          buf.assign(count * static_cast<size_t>(comm.size()), 0.0f);
        } catch (const Error& e2) {
          std::printf("SHRINK FAILED rank %d: %s\n", rank, e2.what());
          return 5;
        }
      }
    }
    final_size = comm.size();
    for (int r : world) survivors += (survivors.empty() ? "" : ",") + std::to_string(r);
    if (victim) return 3;  // a victim that lived: the test kills it, never this
  }
  const int fds_after = rrtest::open_fds();
  const int threads_after = rrtest::thread_count();
  std::printf(
      "RESULT rank %d shrinks %d size %d ranks %s exact %d error after %.3f s, recovered "
      "after %.3f s, parent destroyed in %.3f s: %s\n",
      rank, shrinks, final_size, survivors.c_str(), exact ? 1 : 0, error_at - fault_at,
      recovered_at - fault_at, destroy_s, first_error.c_str());
  std::printf("CLEAN rank %d fds %d -> %d threads %d -> %d\n", rank, fds_before, fds_after,
              threads_before, threads_after);
  std::string want;
  for (int r = 0, k = 0; r < 1024 && k < expected; ++r)
    if (std::count(victims.begin(), victims.end(), r) == 0) {
      want += (want.empty() ? "" : ",") + std::to_string(r);
      ++k;
    }
  const bool ok = exact && final_size == expected && survivors == want && shrinks >= 1 &&
                  destroy_s < 0.5 && recovered_at > 0 && fds_after == fds_before &&
                  threads_after == threads_before;
  return ok ? 0 : 1;
}
