// latency_floor: what a small allreduce cannot beat on this machine, the small-message
// counterpart of stream_copy's memory limit. Two processes, each pinned, run the barest exchange
// an allreduce needs:
//
//   cross-core  one process per core: each writes a sequence number into its own cache line and
//               spins (pause) until the other's line holds the same number. One exchange is the
//               floor of a 2-rank allreduce: each rank must see one line the other wrote.
//   same-core   both processes on one core, handing over with sched_yield: each op needs the
//               other process to run, so one process switch is the floor of an op whose ranks
//               share a core (4 ranks on 2 cores: every core runs two ranks per op).
//
//   latency_floor [-n ITERS=1000000] [-r ROUNDS=3]
//
// Output, one line per mode and round:
//   floor cross-core cpus=0,1 iters=1000000 us_per_op=0.251
//   floor same-core cpu=0 iters=100000 us_per_op=6.10 yields_per_op=1.00
// The numbers move with the VM's placement of its vCPUs (docs/PERFORMANCE.md: 0.06-0.27 us
// cross-core on the development VM within one hour).
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "pinning.h"

namespace {

using bench::pin;
using bench::usable_cpus;

struct alignas(64) Line {
  std::atomic<uint64_t> seq;
};

// Runs `iters` exchanges between two processes, process p pinned to cpus[p]; returns us per op
// as the parent saw it (and sched_yield calls per op, both processes together, through
// *yields_per_op).
double exchange(int cpu0, int cpu1, long iters, bool yield, double* yields_per_op) {
  void* mem = mmap(nullptr, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  Line* lines = new (mem) Line[3]();  // one per process, and the child's yield count
  const pid_t pid = fork();
  if (pid < 0) {
    std::perror("fork");
    std::exit(1);
  }
  const int me = pid == 0 ? 1 : 0;
  if (!pin(me == 0 ? cpu0 : cpu1)) std::perror("sched_setaffinity");
  long yields = 0;
  const auto start = std::chrono::steady_clock::now();
  for (long i = 1; i <= iters; ++i) {
    lines[me].seq.store(static_cast<uint64_t>(i), std::memory_order_release);
    while (lines[1 - me].seq.load(std::memory_order_acquire) < static_cast<uint64_t>(i)) {
      if (yield) {
        sched_yield();
        ++yields;
      } else {
#if defined(__x86_64__) || defined(__i386__)
        __builtin_ia32_pause();
#endif
      }
    }
  }
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  if (pid == 0) {
    lines[2].seq.store(static_cast<uint64_t>(yields));
    _exit(0);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  *yields_per_op = static_cast<double>(yields + static_cast<long>(lines[2].seq.load())) /
                   static_cast<double>(iters);
  munmap(mem, 4096);
  return us / static_cast<double>(iters);
}

}  // namespace

int main(int argc, char** argv) {
  long iters = 1000000;
  int rounds = 3;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-n") == 0 && i + 1 < argc) {
      iters = std::atol(argv[++i]);
    } else if (std::strcmp(argv[i], "-r") == 0 && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: latency_floor [-n ITERS=1000000] [-r ROUNDS=3]\n");
      return 2;
    }
  }
  if (iters <= 0 || rounds <= 0) {
    std::fprintf(stderr, "latency_floor: -n and -r must be positive\n");
    return 2;
  }
  const std::vector<int> cpus = usable_cpus();
  if (cpus.empty()) {
    std::fprintf(stderr, "latency_floor: no usable cpu\n");
    return 1;
  }
  // A switch costs microseconds: a tenth of the iterations keeps both modes near a second.
  const long switch_iters = std::max(1L, iters / 10);
  for (int r = 0; r < rounds; ++r) {
    double yields = 0;
    if (cpus.size() >= 2) {
      const double us = exchange(cpus[0], cpus[1], iters, false, &yields);
      std::printf("floor cross-core cpus=%d,%d iters=%ld us_per_op=%.3f\n", cpus[0], cpus[1], iters,
                  us);
    } else {
      std::printf("floor cross-core skipped: one usable cpu\n");
    }
    const double us = exchange(cpus[0], cpus[0], switch_iters, true, &yields);
    std::printf("floor same-core cpu=%d iters=%ld us_per_op=%.2f yields_per_op=%.2f\n", cpus[0],
                switch_iters, us, yields);
    std::fflush(stdout);
  }
  return 0;
}
