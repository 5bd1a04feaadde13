// latency_floor: what a small allreduce cannot beat on this machine, the small-message
// counterpart of stream_copy's memory limit. Pinned processes run the barest exchange
// an allreduce needs:
//
//   cross-core  one process per core: each writes a sequence number into its own cache line and
//               spins (pause) until the other's line holds the same number. One exchange is the
//               floor of a 2-rank allreduce: each rank must see one line the other wrote.
//   same-core   both processes on one core, handing over with sched_yield: each op needs the
//               other process to run, so one process switch is the floor of an op whose ranks
//               share a core.
//   crowded     with -p P above the number of usable CPUs: P processes placed as ringrun and the
//               MPIs place ranks (p on cpu p mod cores), every op each writes its line and waits
//               for all others, yielding to those on its own core and spinning on the rest. Each
//               core runs its m ranks in turn, m - 1 switches per op, and an op ends when the
//               slower core's have: at 4 ranks on 2 cores 0.4-1.0 us above one switch.
//
//   latency_floor [-n ITERS=1000000] [-r ROUNDS=3] [-p PROCS]
//
// The cost of a switch grows with what runs after it: the VM this was written on has no PCID,
// so every switch empties the TLB, and each distinct 4 KiB page an op touches afterwards cost
// ~33 ns (64 pages: +2 us per op), huge pages or not; lines within one page cost nothing. These
// floors touch three pages; an allreduce's own pages come on top.
//
// Output, one line per mode and round:
//   floor cross-core cpus=0,1 iters=1000000 us_per_op=0.251
//   floor same-core cpu=0 iters=100000 us_per_op=6.10 yields_per_op=1.00
//   floor crowded procs=4 cpus=2 iters=100000 us_per_op=5.66 yields_per_op=2.02
// The numbers move with the VM's placement of its vCPUs (docs/PERFORMANCE.md: 0.06-0.27 us
// cross-core on the development VM within one hour).
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <vector>

#include "floor_common.h"

namespace {

using bench::pin;
using bench::usable_cpus;

struct alignas(64) Line {
  std::atomic<uint64_t> seq;
};

// How a process waits for a peer's line.
enum class Wait { spin, yield, crowded };

// Runs `iters` ops of cpu_of.size() processes, process p pinned to cpu_of[p]: in each op every
// process writes the op's number into its own line and waits until every other line holds it.
// Waiting: spin (pause), yield (sched_yield), or crowded: peers on this process's own core first,
// yielding to them (they cannot write until they run here), then peers on other cores, spinning
// (their cores run them; by then this core's peers have written, so nothing here waits for us).
// Returns us per op as process 0 saw it, and sched_yield calls per op, all processes together,
// through *yields_per_op.
double run_ops(const std::vector<int>& cpu_of, long iters, Wait wait, double* yields_per_op) {
  const size_t procs = cpu_of.size();
  const size_t bytes = 2 * procs * sizeof(Line);  // a line and a yield count per process
  void* mem = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  Line* lines = new (mem) Line[2 * procs]();
  Line* yield_counts = lines + procs;
  std::vector<pid_t> children;
  size_t me = 0;
  for (size_t p = 1; p < procs; ++p) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      std::exit(1);
    }
    if (pid == 0) {
      me = p;
      children.clear();
      break;
    }
    children.push_back(pid);
  }
  if (!pin(cpu_of[me])) std::perror("sched_setaffinity");
  // Peers in the order this process waits for them: its own core's first when crowded.
  std::vector<size_t> order;
  for (size_t q = 0; q < procs; ++q)
    if (q != me && (wait != Wait::crowded || cpu_of[q] == cpu_of[me])) order.push_back(q);
  if (wait == Wait::crowded)
    for (size_t q = 0; q < procs; ++q)
      if (cpu_of[q] != cpu_of[me]) order.push_back(q);
  long yields = 0;
  const auto start = std::chrono::steady_clock::now();
  for (long i = 1; i <= iters; ++i) {
    lines[me].seq.store(static_cast<uint64_t>(i), std::memory_order_release);
    for (size_t q : order) {
      const bool yield = wait == Wait::yield || (wait == Wait::crowded && cpu_of[q] == cpu_of[me]);
      while (lines[q].seq.load(std::memory_order_acquire) < static_cast<uint64_t>(i)) {
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
  }
  const double us =
      std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
  yield_counts[me].seq.store(static_cast<uint64_t>(yields));
  if (me != 0) _exit(0);
  for (pid_t pid : children) {
    int status = 0;
    waitpid(pid, &status, 0);
  }
  uint64_t total = 0;
  for (size_t p = 0; p < procs; ++p) total += yield_counts[p].seq.load();
  *yields_per_op = static_cast<double>(total) / static_cast<double>(iters);
  munmap(mem, bytes);
  return us / static_cast<double>(iters);
}

}  // namespace

int main(int argc, char** argv) {
  long iters = 1000000;
  long rounds = 3;
  long procs = 0;
  struct Option {
    const char* flag;
    long* value;
    long lo, hi;
  };
  const Option options[] = {
      {"-n", &iters, 1, LONG_MAX}, {"-r", &rounds, 1, 1000}, {"-p", &procs, 0, 4096}};
  for (int i = 1; i < argc; ++i) {
    const Option* o = nullptr;
    for (const Option& c : options)
      if (std::strcmp(argv[i], c.flag) == 0) o = &c;
    if (!o || i + 1 >= argc || !bench::parse_long(argv[++i], o->lo, o->hi, o->value)) {
      std::fprintf(stderr,
                   "usage: latency_floor [-n ITERS=1000000] [-r ROUNDS=3] [-p PROCS]\n"
                   "  ITERS at least 1, ROUNDS 1 to 1000, PROCS 0 to 4096\n");
      return 2;
    }
  }
  const std::vector<int> cpus = usable_cpus();
  if (cpus.empty()) {
    std::fprintf(stderr, "latency_floor: no usable cpu\n");
    return 1;
  }
  // A switch costs microseconds: a tenth of the iterations keeps both modes near a second.
  const long switch_iters = std::max(1L, iters / 10);
  const bool crowded = procs > static_cast<long>(cpus.size());
  for (long r = 0; r < rounds; ++r) {
    double yields = 0;
    if (cpus.size() >= 2) {
      const double us = run_ops({cpus[0], cpus[1]}, iters, Wait::spin, &yields);
      std::printf("floor cross-core cpus=%d,%d iters=%ld us_per_op=%.3f\n", cpus[0], cpus[1], iters,
                  us);
    } else {
      std::printf("floor cross-core skipped: one usable cpu\n");
    }
    double us = run_ops({cpus[0], cpus[0]}, switch_iters, Wait::yield, &yields);
    std::printf("floor same-core cpu=%d iters=%ld us_per_op=%.2f yields_per_op=%.2f\n", cpus[0],
                switch_iters, us, yields);
    if (crowded) {
      // Process p on cpus[p mod cores], as ringrun and the MPIs place ranks.
      std::vector<int> cpu_of;
      for (long p = 0; p < procs; ++p) cpu_of.push_back(cpus[static_cast<size_t>(p) % cpus.size()]);
      us = run_ops(cpu_of, switch_iters, Wait::crowded, &yields);
      std::printf("floor crowded procs=%ld cpus=%zu iters=%ld us_per_op=%.2f yields_per_op=%.2f\n",
                  procs, cpus.size(), switch_iters, us, yields);
    }
    std::fflush(stdout);
  }
  return 0;
}
