// stream_copy: STREAM-style memory bandwidth of the copy kernel (a[i] = b[i], done with glibc's
// memcpy), on one thread or on every core at once. bench/shm_compare.sh uses the all-cores number
// as the memory-bandwidth limit of a shared-memory allreduce.
//
//   stream_copy [-s SIZE=256M] [-t THREADS[,THREADS...]] [-n REPS=10]
//
//   -s SIZE     bytes copied per repetition, in total over all threads (K/M/G: powers of 1024).
//               As in STREAM, the arrays are split over the threads: thread i owns its own pair
//               of buffers of SIZE/THREADS bytes (rounded down to 4 KiB), allocated and first
//               touched by itself (so they are local to its NUMA node), and copies src -> dst.
//               Memory used is 2 x SIZE whatever the thread count, and the working set stays
//               SIZE-sized, so keep SIZE well above the last-level cache (the default 256M is 8x
//               a 32 MiB L3).
//   -t THREADS  default: the number of CPUs this process may run on (sched_getaffinity, i.e.
//               the online CPUs unless restricted by taskset/cgroups). Thread i is pinned to the
//               (i mod ncpu)-th of those CPUs. A comma-separated list runs one mode per entry,
//               e.g. -t 1,2.
//   -n REPS     timed repetitions per mode; the best (shortest) one is reported, as STREAM does.
//
// Every page of every buffer is written before timing (first touch by its owner thread), then
// one untimed copy runs. Each repetition starts with all threads released from a barrier and
// ends when the last one finishes (a second barrier); that wall time is the repetition's time.
//
// Output: one line per mode, easy to grep:
//   stream copy threads=2 size=268435456 reps=10 best_GBps_rw=21.432 copy_GBps=10.716
//     avg_GBps_rw=20.101 best_ms=25.049 avg_ms=26.707      (all on one line)
// where GB = 1e9 bytes (like busbw), size = the bytes actually copied per repetition,
//   best_GBps_rw = 2 x size / best time   (STREAM's convention: bytes read + bytes written)
//   copy_GBps    = size / best time       (bytes copied per second)
// Neither counts the read-for-ownership of a cached store, which makes the real DRAM traffic of
// an ordinary copy 3 x size; glibc's memcpy switches to non-temporal stores (no RFO) above its
// own threshold (`ld.so --list-diagnostics | grep non_temporal`), which applies to each thread's
// SIZE/THREADS, so single-thread and all-thread modes may run different kernels.
#include <pthread.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kPage = 4096;

[[noreturn]] void usage(const char* why) {
  if (why) std::fprintf(stderr, "stream_copy: %s\n", why);
  std::fprintf(stderr,
               "usage: stream_copy [-s SIZE=256M] [-t THREADS[,THREADS...]] [-n REPS=10]\n"
               "  SIZE: bytes copied per repetition over all threads (K/M/G suffixes);\n"
               "  THREADS: default the CPUs this process may run on, thread i pinned to the\n"
               "  (i mod ncpu)-th of them; REPS: timed repetitions, the best is reported.\n");
  std::exit(2);
}

bool parse_size(const char* s, std::size_t* out) {
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (end == s || errno != 0 || v <= 0) return false;
  double mul = 1;
  if (*end) {
    switch (*end) {
      case 'k':
      case 'K':
        mul = 1024.0;
        break;
      case 'm':
      case 'M':
        mul = 1024.0 * 1024;
        break;
      case 'g':
      case 'G':
        mul = 1024.0 * 1024 * 1024;
        break;
      default:
        return false;
    }
    if (end[1] != '\0' && std::strcmp(end + 1, "B") != 0 && std::strcmp(end + 1, "iB") != 0)
      return false;
  }
  *out = static_cast<std::size_t>(v * mul);
  return true;
}

bool parse_int(const char* s, int* out) {
  char* end = nullptr;
  const long v = std::strtol(s, &end, 10);
  if (end == s || *end != '\0' || v <= 0 || v > 1 << 20) return false;
  *out = static_cast<int>(v);
  return true;
}

// The CPUs this process may run on, in increasing order.
std::vector<int> allowed_cpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    for (int c = 0; c < CPU_SETSIZE; ++c)
      if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  if (cpus.empty()) {
    const long n = sysconf(_SC_NPROCESSORS_ONLN);
    for (long c = 0; c < std::max(1L, n); ++c) cpus.push_back(static_cast<int>(c));
  }
  return cpus;
}

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<unsigned char[], FreeDeleter>;

struct Mode {
  int threads;
  std::size_t bytes;  // copied per repetition, all threads together
  std::vector<double> rep_s;
  bool ok = true;
};

// Runs one mode: `threads` pinned threads, each copying its own `per_thread` bytes per rep.
Mode run_mode(int threads, std::size_t total, int reps, const std::vector<int>& cpus) {
  const std::size_t per_thread = total / static_cast<std::size_t>(threads) / kPage * kPage;
  Mode m{threads, per_thread * static_cast<std::size_t>(threads), {}};
  if (per_thread == 0) {
    m.ok = false;
    return m;
  }
  std::barrier sync(threads);
  std::atomic<bool> failed{false};
  std::vector<double> rep_s(static_cast<std::size_t>(reps), 0.0);
  Clock::time_point t0;

  auto body = [&](int i) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[static_cast<std::size_t>(i) % cpus.size()], &set);
    if (pthread_setaffinity_np(pthread_self(), sizeof set, &set) != 0) failed = true;

    Buffer src(static_cast<unsigned char*>(std::aligned_alloc(kPage, per_thread)));
    Buffer dst(static_cast<unsigned char*>(std::aligned_alloc(kPage, per_thread)));
    if (!src || !dst) {
      failed = true;
    } else {
      // First touch: every page written by its owner before any timing.
      for (std::size_t k = 0; k < per_thread; ++k)
        src[k] = static_cast<unsigned char>((k * 31 + static_cast<std::size_t>(i)) & 0xff);
      std::memset(dst.get(), 0, per_thread);
    }
    sync.arrive_and_wait();
    const bool have = src && dst;
    if (have) std::memcpy(dst.get(), src.get(), per_thread);  // untimed warm-up copy
    for (int r = 0; r < reps; ++r) {
      sync.arrive_and_wait();
      if (i == 0) t0 = Clock::now();
      sync.arrive_and_wait();
      if (have) std::memcpy(dst.get(), src.get(), per_thread);
      sync.arrive_and_wait();
      if (i == 0)
        rep_s[static_cast<std::size_t>(r)] =
            std::chrono::duration<double>(Clock::now() - t0).count();
    }
    // The copies must have happened: compare a few bytes (this also keeps them observable).
    if (have) {
      for (std::size_t k = 0; k < per_thread; k += per_thread / 7 + 1)
        if (dst[k] != src[k]) failed = true;
      if (dst[per_thread - 1] != src[per_thread - 1]) failed = true;
    }
  };

  std::vector<std::thread> pool;
  for (int i = 1; i < threads; ++i) pool.emplace_back(body, i);
  body(0);
  for (auto& t : pool) t.join();
  m.rep_s = std::move(rep_s);
  m.ok = !failed;
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  const std::vector<int> cpus = allowed_cpus();
  std::size_t size = std::size_t{256} << 20;
  std::vector<int> thread_counts;
  int reps = 10;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(nullptr);
    if (a.size() != 2 || a[0] != '-') usage(("unknown argument " + a).c_str());
    if (i + 1 >= argc) usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    switch (a[1]) {
      case 's':
        if (!parse_size(v, &size)) usage((std::string("not a size: ") + v).c_str());
        break;
      case 't': {
        thread_counts.clear();
        std::string list = v;
        std::size_t pos = 0;
        while (pos <= list.size()) {
          const std::size_t comma = std::min(list.find(',', pos), list.size());
          int t = 0;
          const std::string item = list.substr(pos, comma - pos);
          if (!parse_int(item.c_str(), &t)) usage(("not a thread count: '" + item + "'").c_str());
          thread_counts.push_back(t);
          pos = comma + 1;
        }
        break;
      }
      case 'n':
        if (!parse_int(v, &reps)) usage((std::string("not a repetition count: ") + v).c_str());
        break;
      default:
        usage(("unknown flag " + a).c_str());
    }
  }
  if (thread_counts.empty()) thread_counts.push_back(static_cast<int>(cpus.size()));

  std::printf("# stream_copy: memcpy(dst, src, SIZE/THREADS) per thread, best of %d reps\n", reps);
  std::printf("# cpus allowed: %zu (thread i pinned to the (i mod %zu)-th); GB = 1e9 B\n",
              cpus.size(), cpus.size());
  std::printf(
      "# best_GBps_rw = 2 x size / best time (read + write, STREAM); "
      "copy_GBps = size / best time\n");
  std::fflush(stdout);

  int rc = 0;
  for (int threads : thread_counts) {
    Mode m = run_mode(threads, size, reps, cpus);
    if (!m.ok || m.rep_s.empty()) {
      std::fprintf(stderr, "stream_copy: threads=%d failed (allocation, pinning or check)\n",
                   threads);
      rc = 1;
      continue;
    }
    const double best = *std::min_element(m.rep_s.begin(), m.rep_s.end());
    double sum = 0;
    for (double s : m.rep_s) sum += s;
    const double avg = sum / static_cast<double>(m.rep_s.size());
    const double b = static_cast<double>(m.bytes);
    std::printf(
        "stream copy threads=%d size=%zu reps=%d best_GBps_rw=%.3f copy_GBps=%.3f "
        "avg_GBps_rw=%.3f best_ms=%.3f avg_ms=%.3f\n",
        threads, m.bytes, reps, 2 * b / best / 1e9, b / best / 1e9, 2 * b / avg / 1e9, best * 1e3,
        avg * 1e3);
    std::fflush(stdout);
  }
  return rc;
}
