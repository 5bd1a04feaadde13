// jitter_floor: how steady this machine lets a call be, the per-call counterpart of
// latency_floor and stream_copy. Issue 19 asks for an allreduce's per-call max / min <= 1.15
// over 100 calls from 1 MiB; this runs the same shape of work with no library in it: P
// processes, one pinned per core, meet at a barrier (one cache line, spun on), each copies
// BYTES within its own buffers (memcpy, the core of every shared-memory step), and the call is
// over when the slowest is done. What the host does to a core (another guest, an interrupt, a
// descheduled vCPU) shows in these times as it does in an allreduce's.
//
//   jitter_floor [-s BYTES=1M] [-n CALLS=100] [-r ROUNDS=3] [-p PROCS=cores]
//
// Output, one line per round:
//   jitter bytes=1048576 procs=2 calls=100 min_us=... median_us=... max_us=... max_over_min=...
//     over_1.15x_min=K
// where a call's time is the slowest process's, from leaving the barrier to the end of its copy.
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

#include "core/config.h"
#include "floor_common.h"

namespace {

using bench::pin;
using bench::usable_cpus;

struct alignas(64) Barrier {
  std::atomic<uint64_t> arrived;
};

// Every process arrives once per call; the n-th call's barrier opens at n * procs arrivals.
void meet(Barrier* b, uint64_t call, int procs) {
  b->arrived.fetch_add(1, std::memory_order_acq_rel);
  const uint64_t open = (call + 1) * static_cast<uint64_t>(procs);
  while (b->arrived.load(std::memory_order_acquire) < open) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
  }
}

// One round: per call, the slowest process's time (us).
std::vector<double> round_times(const std::vector<int>& cpus, int procs, size_t bytes, long calls) {
  const size_t shared = sizeof(Barrier) + static_cast<size_t>(procs * calls) * sizeof(double);
  void* mem = mmap(nullptr, shared, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (mem == MAP_FAILED) {
    std::perror("mmap");
    std::exit(1);
  }
  auto* barrier = new (mem) Barrier{};
  auto* times = reinterpret_cast<double*>(static_cast<char*>(mem) + sizeof(Barrier));
  constexpr long kWarm = 10;
  std::vector<pid_t> kids;
  for (int p = 0; p < procs; ++p) {
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      std::exit(1);
    }
    if (pid > 0) {
      kids.push_back(pid);
      continue;
    }
    if (!pin(cpus[static_cast<size_t>(p) % cpus.size()])) std::perror("sched_setaffinity");
    alarm(120);  // a lost process must not keep the others spinning
    std::vector<char> src(bytes, 1), dst(bytes, 0);
    for (long c = 0; c < kWarm + calls; ++c) {
      meet(barrier, static_cast<uint64_t>(c), procs);
      const auto t0 = std::chrono::steady_clock::now();
      std::memcpy(dst.data(), src.data(), bytes);
      asm volatile("" : : "r"(dst.data()) : "memory");
      const auto t1 = std::chrono::steady_clock::now();
      if (c >= kWarm)
        times[p * calls + (c - kWarm)] = std::chrono::duration<double, std::micro>(t1 - t0).count();
    }
    _exit(0);
  }
  bool ok = true;
  for (pid_t k : kids) {
    int status = 0;
    waitpid(k, &status, 0);
    ok = ok && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  if (!ok) {
    std::fprintf(stderr, "jitter_floor: a process failed\n");
    std::exit(1);
  }
  std::vector<double> out(static_cast<size_t>(calls), 0);
  for (long c = 0; c < calls; ++c) {
    double& slowest = out[static_cast<size_t>(c)];
    for (int p = 0; p < procs; ++p) slowest = std::max(slowest, times[p * calls + c]);
  }
  munmap(mem, shared);
  return out;
}

size_t core_size(const char* text) {
  const auto v = ringreduce::core::parse_size(text);
  return v ? static_cast<size_t>(*v) : 0;
}

}  // namespace

int main(int argc, char** argv) {
  size_t bytes = 1 << 20;
  long calls = 100, rounds = 3, procs = 0;
  struct Option {
    const char* flag;
    long* value;
    long lo, hi;
  };
  const Option options[] = {
      {"-n", &calls, 1, 1000000}, {"-r", &rounds, 1, 1000}, {"-p", &procs, 0, 64}};
  for (int i = 1; i < argc; ++i) {
    const Option* o = nullptr;
    for (const Option& c : options)
      if (std::strcmp(argv[i], c.flag) == 0) o = &c;
    bool ok = i + 1 < argc;
    if (ok && std::strcmp(argv[i], "-s") == 0) {
      // The library's size syntax (65536, 64K, 4M), as its settings take it.
      bytes = core_size(argv[++i]);
      ok = bytes > 0;
    } else {
      ok = ok && o && bench::parse_long(argv[++i], o->lo, o->hi, o->value);
    }
    if (!ok) {
      std::fprintf(stderr,
                   "usage: jitter_floor [-s BYTES=1M] [-n CALLS=100] [-r ROUNDS=3] [-p PROCS]\n"
                   "  BYTES a size such as 65536, 64K or 4M; CALLS 1 to 1000000, ROUNDS 1 to "
                   "1000, PROCS 0 (the cores) to 64\n");
      return 2;
    }
  }
  const std::vector<int> cpus = usable_cpus();
  if (cpus.empty()) {
    std::fprintf(stderr, "jitter_floor: no usable cpu\n");
    return 1;
  }
  if (procs == 0) procs = static_cast<long>(cpus.size());
  for (long r = 0; r < rounds; ++r) {
    std::vector<double> t = round_times(cpus, static_cast<int>(procs), bytes, calls);
    std::sort(t.begin(), t.end());
    const double lo = t.front(), hi = t.back();
    const long over = std::count_if(t.begin(), t.end(), [&](double v) { return v > 1.15 * lo; });
    std::printf(
        "jitter bytes=%zu procs=%ld calls=%ld min_us=%.2f median_us=%.2f max_us=%.2f "
        "max_over_min=%.2f over_1.15x_min=%ld\n",
        bytes, procs, calls, lo, t[t.size() / 2], hi, hi / lo, over);
    std::fflush(stdout);
  }
  return 0;
}
