// stream_copy: STREAM-style memory bandwidth of the kernels a shared-memory allreduce is made
// of, on one thread or on every core at once. bench/drivers/compare.sh shm takes the best all-cores
// number of the copy and add kernels as the memory limit of an allreduce (its "floor").
//
//   stream_copy [-s SIZE=256M] [-t THREADS[,THREADS...]] [-k KERNEL[,KERNEL...]] [-n REPS=10]
//               [-H on|off]
//
//   -s SIZE     bytes of each array per repetition, in total over all threads (K/M/G: powers of
//               1024). As in STREAM, the arrays are split over the threads: thread i owns its
//               own arrays of SIZE/THREADS bytes (rounded down to 4 KiB), allocated and first
//               touched by itself (so they are local to its NUMA node). Keep SIZE well above the
//               last-level cache (the default 256M is 8x a 32 MiB L3).
//   -t THREADS  default: the number of CPUs this process may run on (sched_getaffinity, i.e.
//               the online CPUs unless restricted by taskset/cgroups). Thread i is pinned to the
//               (i mod ncpu)-th of those CPUs. A comma-separated list runs one mode per entry.
//   -k KERNELS  default: copy,nt,movsb,add,add_nt. Each with its bytes read + written per
//               repetition (what best_GBps_rw counts):
//                 copy    dst = src with glibc's memcpy                       2 x size
//                 nt      dst = src, 16-byte loads and non-temporal stores    2 x size
//                 movsb   dst = src with `rep movsb` (ERMS)                   2 x size
//                 add     a += b, float32 (read a, read b, write a)           3 x size
//                 add_nt  c = a + b, float32, non-temporal stores to c        3 x size
//               add_nt is a ring step's shape (reduce an incoming chunk into one's own into
//               another buffer).
//   -n REPS     timed repetitions per mode; the best (shortest) one is reported, as STREAM does.
//   -H on|off   madvise(MADV_HUGEPAGE) on the arrays (on) or MADV_NOHUGEPAGE (off); default:
//               neither, the kernel's transparent_hugepage setting decides.
//
// Every page of every array is written before timing (first touch by its owner thread), then
// one untimed repetition runs. Each repetition starts with all threads released from a barrier
// and ends when the last one finishes (a second barrier); that wall time is the repetition's.
//
// Output: one line per kernel and thread count, easy to grep:
//   stream copy threads=2 size=268435456 reps=10 best_GBps_rw=21.432 copy_GBps=10.716
//     avg_GBps_rw=20.101 best_ms=25.049 avg_ms=26.707      (all on one line)
// where GB = 1e9 bytes (like busbw), size = bytes of one array per repetition (all threads),
//   best_GBps_rw = the kernel's bytes read + written / best time (STREAM's convention)
//   copy_GBps    = size / best time       (bytes of output per second)
// Neither counts the read-for-ownership of a cached store, which makes the real DRAM traffic of
// an ordinary store one more read; glibc's memcpy switches to non-temporal stores (no RFO) above
// its own threshold (`ld.so --list-diagnostics | grep non_temporal`), which applies to each
// thread's SIZE/THREADS, so single-thread and all-thread modes may run different kernels. `nt`
// and `add_nt` never read their destination; `add` reads its destination anyway (a), so the
// counted traffic of those three is the real traffic.
#include <emmintrin.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
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
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"  // core::parse_size: the library's size syntax
#include "floor_common.h"

namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kPage = 4096;

[[noreturn]] void usage(const char* why) {
  if (why) std::fprintf(stderr, "stream_copy: %s\n", why);
  std::fprintf(stderr,
               "usage: stream_copy [-s SIZE=256M] [-t THREADS[,THREADS...]]\n"
               "                   [-k KERNEL[,KERNEL...]] [-n REPS=10] [-H on|off]\n"
               "  SIZE: bytes of each array per repetition over all threads (K/M/G suffixes);\n"
               "  THREADS: default the CPUs this process may run on, thread i pinned to the\n"
               "  (i mod ncpu)-th of them; KERNEL: copy nt movsb add add_nt (default all);\n"
               "  REPS: timed repetitions, the best is reported; -H: huge pages on or off.\n");
  std::exit(2);
}

// A whole number from 1 to 2^20 (thread and repetition counts).
bool parse_int(const char* s, int* out) {
  long v = 0;
  if (!bench::parse_long(s, 1, 1 << 20, &v)) return false;
  *out = static_cast<int>(v);
  return true;
}

// The kernels. Each works on one thread's arrays of `n` bytes (a multiple of 4 KiB).
enum class Kernel { copy, nt, movsb, add, add_nt };
struct KernelInfo {
  Kernel kernel;
  const char* name;
  int arrays;   // arrays each thread needs
  int streams;  // arrays read or written per repetition: bytes counted = streams x size
};
constexpr KernelInfo kKernels[] = {{Kernel::copy, "copy", 2, 2},
                                   {Kernel::nt, "nt", 2, 2},
                                   {Kernel::movsb, "movsb", 2, 2},
                                   {Kernel::add, "add", 2, 3},
                                   {Kernel::add_nt, "add_nt", 3, 3}};

// 16-byte loads, non-temporal 16-byte stores: the destination is never read (no RFO) and does
// not evict the sources from the cache. SSE2 is in every x86-64, so no target flags are needed.
void copy_nt(unsigned char* dst, const unsigned char* src, std::size_t n) {
  auto* d = reinterpret_cast<__m128i*>(dst);
  const auto* s = reinterpret_cast<const __m128i*>(src);
  for (std::size_t i = 0; i < n / 16; i += 4) {
    const __m128i x0 = _mm_load_si128(s + i), x1 = _mm_load_si128(s + i + 1);
    const __m128i x2 = _mm_load_si128(s + i + 2), x3 = _mm_load_si128(s + i + 3);
    _mm_stream_si128(d + i, x0);
    _mm_stream_si128(d + i + 1, x1);
    _mm_stream_si128(d + i + 2, x2);
    _mm_stream_si128(d + i + 3, x3);
  }
  _mm_sfence();
}

void copy_movsb(unsigned char* dst, const unsigned char* src, std::size_t n) {
  asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

void add_into(float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; ++i) a[i] += b[i];
}

void add_nt(float* c, const float* a, const float* b, std::size_t n) {
  for (std::size_t i = 0; i < n; i += 4)
    _mm_stream_ps(c + i, _mm_add_ps(_mm_load_ps(a + i), _mm_load_ps(b + i)));
  _mm_sfence();
}

void run_kernel(Kernel k, unsigned char* const* arr, std::size_t n) {
  switch (k) {
    case Kernel::copy:
      std::memcpy(arr[1], arr[0], n);
      break;
    case Kernel::nt:
      copy_nt(arr[1], arr[0], n);
      break;
    case Kernel::movsb:
      copy_movsb(arr[1], arr[0], n);
      break;
    case Kernel::add:
      add_into(reinterpret_cast<float*>(arr[1]), reinterpret_cast<const float*>(arr[0]),
               n / sizeof(float));
      break;
    case Kernel::add_nt:
      add_nt(reinterpret_cast<float*>(arr[2]), reinterpret_cast<const float*>(arr[0]),
             reinterpret_cast<const float*>(arr[1]), n / sizeof(float));
      break;
  }
}

// An anonymous mapping, so that -H can ask for (or refuse) huge pages before the first touch.
class Array {
 public:
  Array(std::size_t n, int huge) : n_(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return;
    p_ = static_cast<unsigned char*>(p);
    if (huge != 0) madvise(p_, n, huge > 0 ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
  }
  ~Array() {
    if (p_) munmap(p_, n_);
  }
  Array(const Array&) = delete;
  Array& operator=(const Array&) = delete;
  unsigned char* get() const { return p_; }

 private:
  unsigned char* p_ = nullptr;
  std::size_t n_;
};

struct Mode {
  int threads;
  std::size_t bytes;  // of one array per repetition, all threads together
  std::vector<double> rep_s;
  bool ok = true;
};

// Runs one mode: `threads` pinned threads, each running kernel `k` over its own arrays of
// `per_thread` bytes per rep.
Mode run_mode(const KernelInfo& k, int threads, std::size_t total, int reps, int huge,
              const std::vector<int>& cpus) {
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
    if (!bench::pin(cpus[static_cast<std::size_t>(i) % cpus.size()])) failed = true;

    std::vector<std::unique_ptr<Array>> arrays;
    unsigned char* arr[3] = {};
    bool have = true;
    for (int a = 0; a < k.arrays; ++a) {
      arrays.push_back(std::make_unique<Array>(per_thread, huge));
      arr[a] = arrays.back()->get();
      have = have && arr[a] != nullptr;
    }
    if (!have) {
      failed = true;
    } else {
      // First touch: every page written by its owner before any timing. Small integers as
      // floats, so that the add kernels' sums stay exact.
      for (int a = 0; a < k.arrays; ++a) {
        auto* f = reinterpret_cast<float*>(arr[a]);
        for (std::size_t e = 0; e < per_thread / sizeof(float); ++e)
          f[e] = static_cast<float>((e + static_cast<std::size_t>(a + i)) % 7);
      }
    }
    sync.arrive_and_wait();
    if (have) run_kernel(k.kernel, arr, per_thread);  // untimed warm-up
    for (int r = 0; r < reps; ++r) {
      sync.arrive_and_wait();
      if (i == 0) t0 = Clock::now();
      sync.arrive_and_wait();
      if (have) run_kernel(k.kernel, arr, per_thread);
      sync.arrive_and_wait();
      if (i == 0)
        rep_s[static_cast<std::size_t>(r)] =
            std::chrono::duration<double>(Clock::now() - t0).count();
    }
    // The kernel must have run: check a few elements (this also keeps the work observable).
    if (have) {
      const auto* src = reinterpret_cast<const float*>(arr[0]);
      const auto* out = reinterpret_cast<const float*>(arr[k.arrays - 1]);
      const std::size_t n = per_thread / sizeof(float);
      for (std::size_t e = 0; e < n; e += n / 7 + 1) {
        const float s0 = static_cast<float>((e + static_cast<std::size_t>(i)) % 7);
        const float s1 = static_cast<float>((e + static_cast<std::size_t>(1 + i)) % 7);
        float want = s0;
        if (k.kernel == Kernel::add) want = s1 + static_cast<float>(reps + 1) * s0;
        if (k.kernel == Kernel::add_nt) want = s0 + s1;
        if (out[e] != want || (k.kernel != Kernel::add && src[e] != s0)) failed = true;
      }
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

std::vector<std::string> split(const std::string& list) {
  std::vector<std::string> items;
  std::size_t pos = 0;
  while (pos <= list.size()) {
    const std::size_t comma = std::min(list.find(',', pos), list.size());
    items.push_back(list.substr(pos, comma - pos));
    pos = comma + 1;
  }
  return items;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> cpus = bench::usable_cpus();
  if (cpus.empty()) cpus.push_back(0);
  std::size_t size = std::size_t{256} << 20;
  std::vector<int> thread_counts;
  std::vector<const KernelInfo*> kernels;
  int reps = 10;
  int huge = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "-h" || a == "--help") usage(nullptr);
    if (a.size() != 2 || a[0] != '-') usage(("unknown argument " + a).c_str());
    if (i + 1 >= argc) usage(("missing value for " + a).c_str());
    const char* v = argv[++i];
    switch (a[1]) {
      case 's': {
        const std::optional<uint64_t> parsed = ringreduce::core::parse_size(v);
        if (!parsed || *parsed == 0) usage((std::string("not a size: ") + v).c_str());
        size = static_cast<std::size_t>(*parsed);
        break;
      }
      case 't':
        thread_counts.clear();
        for (const std::string& item : split(v)) {
          int t = 0;
          if (!parse_int(item.c_str(), &t)) usage(("not a thread count: '" + item + "'").c_str());
          thread_counts.push_back(t);
        }
        break;
      case 'k':
        kernels.clear();
        for (const std::string& item : split(v)) {
          const KernelInfo* found = nullptr;
          for (const KernelInfo& k : kKernels)
            if (item == k.name) found = &k;
          if (!found) usage(("not a kernel: '" + item + "'").c_str());
          kernels.push_back(found);
        }
        break;
      case 'n':
        if (!parse_int(v, &reps)) usage((std::string("not a repetition count: ") + v).c_str());
        break;
      case 'H':
        if (std::strcmp(v, "on") == 0) {
          huge = 1;
        } else if (std::strcmp(v, "off") == 0) {
          huge = -1;
        } else {
          usage((std::string("-H takes on or off, not ") + v).c_str());
        }
        break;
      default:
        usage(("unknown flag " + a).c_str());
    }
  }
  if (thread_counts.empty()) thread_counts.push_back(static_cast<int>(cpus.size()));
  if (kernels.empty())
    for (const KernelInfo& k : kKernels) kernels.push_back(&k);

  std::printf("# stream_copy: each kernel over SIZE/THREADS bytes per thread, best of %d reps\n",
              reps);
  std::printf(
      "# cpus allowed: %zu (thread i pinned to the (i mod %zu)-th); GB = 1e9 B; huge "
      "pages: %s\n",
      cpus.size(), cpus.size(),
      huge > 0   ? "madvise on"
      : huge < 0 ? "madvise off"
                 : "as the kernel decides");
  std::printf(
      "# best_GBps_rw = bytes read + written / best time (STREAM); copy_GBps = size / best "
      "time\n");
  std::fflush(stdout);

  int rc = 0;
  for (const KernelInfo* k : kernels) {
    for (int threads : thread_counts) {
      Mode m = run_mode(*k, threads, size, reps, huge, cpus);
      if (!m.ok || m.rep_s.empty()) {
        std::fprintf(stderr, "stream_copy: %s threads=%d failed (allocation, pinning or check)\n",
                     k->name, threads);
        rc = 1;
        continue;
      }
      const double best = *std::min_element(m.rep_s.begin(), m.rep_s.end());
      double sum = 0;
      for (double s : m.rep_s) sum += s;
      const double avg = sum / static_cast<double>(m.rep_s.size());
      const double b = static_cast<double>(m.bytes);
      const double rw = b * k->streams;
      std::printf(
          "stream %s threads=%d size=%zu reps=%d best_GBps_rw=%.3f copy_GBps=%.3f "
          "avg_GBps_rw=%.3f best_ms=%.3f avg_ms=%.3f\n",
          k->name, threads, m.bytes, reps, rw / best / 1e9, b / best / 1e9, rw / avg / 1e9,
          best * 1e3, avg * 1e3);
      std::fflush(stdout);
    }
  }
  return rc;
}
