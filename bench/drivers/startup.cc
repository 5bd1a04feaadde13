// ringreduce-startup: how long a job takes from launch to its first allreduce, and whether the
// calls a large job starts with come out right (bench/drivers/startup.sh runs it at 16..256 ranks).
//
// Each rank notes when its process started (from /proc/self/stat, the kernel's clock since
// boot, 10 ms ticks), when Communicator::from_env returned, and when its first allreduce (4
// bytes) returned; then checks a barrier, an allreduce of every rank's number and an alltoall
// whose every block names its sender and receiver (not with --no-alltoall: over TCP an alltoall
// connects every pair of ranks on different hosts, 458,752 connections at 1,024 ranks over 8
// hosts, which is a test of the machine's sockets rather than of start-up). Rank 0 prints one
// line:
//
//   startup N=256 first_start 0.00 last_start 1.23 ready 4.56 first_allreduce 4.60 check ok
//
// times in seconds after the first process started: the last process to start, the slowest
// rank's communicator ready, and the slowest rank's first allreduce done. Exits 1 if a check
// failed.
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "ringreduce/ringreduce.hpp"

namespace {

using namespace ringreduce;

double boot_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_BOOTTIME, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Field 22 of /proc/self/stat: the process's start in clock ticks since boot. The command name
// (field 2) may hold spaces, so the fields are counted from its closing parenthesis.
double process_start_seconds() {
  std::ifstream f("/proc/self/stat");
  std::string all((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  std::istringstream rest(all.substr(all.rfind(')') + 2));
  std::string field;
  for (int i = 3; i <= 22; ++i) rest >> field;
  return std::stod(field) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

double max_over_ranks(Communicator& comm, double v) {
  comm.allreduce(&v, &v, 1, DataType::f64, ReduceOp::max);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  const double started = process_start_seconds();
  const bool alltoall = !(argc > 1 && std::string(argv[1]) == "--no-alltoall");
  try {
    Communicator comm = Communicator::from_env();
    const double ready = boot_seconds();
    int one = 1;
    comm.allreduce(&one, &one, 1, DataType::i32, ReduceOp::sum);
    const double first = boot_seconds();
    const int n = comm.size(), me = comm.rank();
    bool ok = one == n;

    comm.barrier();
    int64_t sum = me;
    comm.allreduce(&sum, &sum, 1, DataType::i64, ReduceOp::sum);
    ok = ok && sum == static_cast<int64_t>(n) * (n - 1) / 2;
    // Block j of rank i's input is i * n + j; after the alltoall, block i of rank j holds it.
    if (alltoall) {
      std::vector<int32_t> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), -1);
      for (int j = 0; j < n; ++j) in[static_cast<size_t>(j)] = me * n + j;
      comm.alltoall(in.data(), out.data(), 1, DataType::i32);
      for (int i = 0; i < n; ++i) ok = ok && out[static_cast<size_t>(i)] == i * n + me;
    }
    int bad = ok ? 0 : 1;
    comm.allreduce(&bad, &bad, 1, DataType::i32, ReduceOp::sum);

    const double first_start = -max_over_ranks(comm, -started);
    const double last_start = max_over_ranks(comm, started);
    const double slowest_ready = max_over_ranks(comm, ready);
    const double slowest_first = max_over_ranks(comm, first);
    if (me == 0) {
      std::printf(
          "startup N=%d first_start 0.00 last_start %.2f ready %.2f first_allreduce %.2f "
          "check %s%s\n",
          n, last_start - first_start, slowest_ready - first_start, slowest_first - first_start,
          bad == 0 ? "ok" : "FAILED", alltoall ? "" : " (barrier, allreduce; no alltoall)");
      if (bad) std::printf("# %d ranks got a wrong result\n", bad);
    }
    return bad == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "ringreduce-startup: %s\n", e.what());
    return 1;
  }
}
