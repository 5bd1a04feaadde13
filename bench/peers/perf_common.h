// Shared bits of the peer benchmark programs (gloo_allreduce, mpi_allreduce): nccl-tests style
// flags, the adaptive iteration policy, and the row format
//   size(B) count type redop time(us) algbw(GB/s) busbw(GB/s) #wrong
// Header-only, C++20, no dependencies beyond the standard library.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace peers {

struct Options {
  std::size_t min_bytes = 4;                      // -b
  std::size_t max_bytes = std::size_t{32} << 20;  // -e (nccl-tests default 32M)
  std::size_t factor = 2;                         // -f
  int iters = 0;                                  // -n: 0 = adaptive (default)
  int warmup = 5;                                 // -w: at most this many warmup runs
  double target_s = 0.3;                          // -T: adaptive: seconds of timed runs per size
  int min_iters = 3;                              // -m: adaptive: lower bound
  int max_iters = 10000;                          // -M: adaptive: upper bound
  bool check = true;                              // -c 0|1
  bool prime = true;                              // -P 0|1: one untimed run at MAX before the sweep
  int nranks = 0;                                 // -N: fork-launch this many ranks (gloo only)
  std::string store;                              // -s: rendezvous directory (gloo only)
};

inline void usage(const char* prog, bool with_launch) {
  std::fprintf(
      stderr,
      "usage: %s [-b MIN] [-e MAX] [-f FACTOR] [-n ITERS] [-w WARMUP] [-T SECONDS]\n"
      "          [-m MIN_ITERS] [-M MAX_ITERS] [-c 0|1] [-P 0|1]%s\n"
      "  sizes accept K/M/G suffixes (powers of 1024).\n"
      "  -n 0 (default): adaptive, iterations = clamp(T / estimated time, m, M);\n"
      "  -n K>0: exactly K timed iterations after W warmup runs (like nccl-tests).\n"
      "  -P 1 (default): one untimed run at the largest size before the sweep, as\n"
      "  nccl-tests does (it also sizes Gloo's socket send buffers, see gloo_allreduce.cc).\n",
      prog, with_launch ? " [-N NRANKS] [-s STORE_DIR]" : "");
}

inline std::size_t parse_size(const char* s) {
  char* end = nullptr;
  double v = std::strtod(s, &end);
  std::size_t mul = 1;
  if (end && *end) {
    switch (*end) {
      case 'k':
      case 'K':
        mul = std::size_t{1} << 10;
        break;
      case 'm':
      case 'M':
        mul = std::size_t{1} << 20;
        break;
      case 'g':
      case 'G':
        mul = std::size_t{1} << 30;
        break;
      default:
        std::fprintf(stderr, "bad size '%s'\n", s);
        std::exit(2);
    }
  }
  return static_cast<std::size_t>(v * static_cast<double>(mul));
}

// Returns false (after printing usage) on a bad command line.
inline bool parse_options(int argc, char** argv, Options& o, bool with_launch) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-h" || a == "--help") {
      usage(argv[0], with_launch);
      std::exit(0);
    }
    if (a.size() != 2 || a[0] != '-' || i + 1 >= argc) {
      usage(argv[0], with_launch);
      return false;
    }
    const char* v = argv[++i];
    switch (a[1]) {
      case 'b':
        o.min_bytes = parse_size(v);
        break;
      case 'e':
        o.max_bytes = parse_size(v);
        break;
      case 'f':
        o.factor = std::strtoull(v, nullptr, 10);
        break;
      case 'n':
        o.iters = std::atoi(v);
        break;
      case 'w':
        o.warmup = std::atoi(v);
        break;
      case 'T':
        o.target_s = std::atof(v);
        break;
      case 'm':
        o.min_iters = std::atoi(v);
        break;
      case 'M':
        o.max_iters = std::atoi(v);
        break;
      case 'c':
        o.check = std::atoi(v) != 0;
        break;
      case 'P':
        o.prime = std::atoi(v) != 0;
        break;
      case 'd':
        if (std::strcmp(v, "float") != 0) {
          std::fprintf(stderr, "only -d float\n");
          return false;
        }
        break;
      case 'o':
        if (std::strcmp(v, "sum") != 0) {
          std::fprintf(stderr, "only -o sum\n");
          return false;
        }
        break;
      case 'N':
        if (!with_launch) {
          usage(argv[0], with_launch);
          return false;
        }
        o.nranks = std::atoi(v);
        break;
      case 's':
        if (!with_launch) {
          usage(argv[0], with_launch);
          return false;
        }
        o.store = v;
        break;
      default:
        usage(argv[0], with_launch);
        return false;
    }
  }
  if (o.factor < 2) o.factor = 2;
  if (o.min_bytes < sizeof(float)) o.min_bytes = sizeof(float);
  if (o.min_iters < 1) o.min_iters = 1;
  if (o.max_iters < o.min_iters) o.max_iters = o.min_iters;
  if (o.warmup < 1)
    o.warmup = 1;  // the first run (which is also the correctness check) always happens
  return true;
}

inline std::vector<std::size_t> sizes(const Options& o) {
  std::vector<std::size_t> v;
  for (std::size_t s = o.min_bytes; s <= o.max_bytes; s *= o.factor) v.push_back(s);
  return v;
}

inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Input of rank `rank` at element i: small non-negative integers, so every partial sum is exact in
// float32 whatever the reduction order.
inline float input_value(int rank, std::size_t i) {
  return static_cast<float>((i * 7 + static_cast<std::size_t>(rank) * 13) % 61);
}
inline void fill_input(float* p, std::size_t n, int rank) {
  for (std::size_t i = 0; i < n; ++i) p[i] = input_value(rank, i);
}
inline long count_wrong(const float* p, std::size_t n, int nranks) {
  long wrong = 0;
  for (std::size_t i = 0; i < n; ++i) {
    float want = 0;
    for (int r = 0; r < nranks; ++r) want += input_value(r, i);
    if (p[i] != want) ++wrong;
  }
  return wrong;
}

// Number of extra warmup runs after the first (checked) one, given that run's time.
inline int extra_warmup(const Options& o, double first_s) {
  if (o.iters > 0) return o.warmup - 1;
  // Adaptive: spend at most ~T/3 on warmup.
  double budget = o.target_s / 3.0;
  int by_time = first_s > 0 ? static_cast<int>(budget / first_s) : o.warmup;
  return std::max(0, std::min(o.warmup - 1, by_time));
}

// Timed iterations, given the (rank-agreed) estimated time of one run.
inline int timed_iters(const Options& o, double est_s) {
  if (o.iters > 0) return o.iters;
  double want = est_s > 0 ? std::ceil(o.target_s / est_s) : o.max_iters;
  return static_cast<int>(std::clamp(want, double(o.min_iters), double(o.max_iters)));
}

struct Timing {
  double per_iter_s;  // mean time per run, max over ranks
  int iters;          // timed runs
};

// Warmup and timed runs of one size, after the first (checked) run took `first_s` on this rank.
// `run()` runs the collective once; `agree_max(x)` returns the max of x over ranks (it is also
// the barrier before timing). Timed runs go in batches (adaptive mode) and stop early, once at
// least min_iters ran, when the ranks agree that 4 T has been spent: the iteration count comes
// from a warmup estimate, and on a shared machine a size can get much slower after it.
template <class Run, class AgreeMax>
Timing time_runs(const Options& o, double first_s, Run&& run, AgreeMax&& agree_max) {
  const int extra = extra_warmup(o, agree_max(first_s));
  double t0 = now_s();
  for (int i = 0; i < extra; ++i) run();
  const double est = extra > 0 ? (now_s() - t0) / extra : first_s;
  const int iters = timed_iters(o, agree_max(est));

  const bool adaptive = o.iters <= 0;
  const int batch = adaptive ? std::max(1, (iters + 7) / 8) : iters;
  const double budget = 4 * o.target_s;
  int done = 0;
  double total = 0;
  agree_max(0.0);  // barrier
  while (done < iters) {
    const int k = std::min(batch, iters - done);
    t0 = now_s();
    for (int i = 0; i < k; ++i) run();
    total += now_s() - t0;
    done += k;
    if (adaptive && done < iters && done >= o.min_iters && agree_max(total) > budget) break;
  }
  return {agree_max(total / done), done};
}

inline void print_header(const char* what, int nranks, const Options& o) {
  std::printf("# %s: float32 sum allreduce, %d ranks, TCP loopback\n", what, nranks);
  if (o.iters > 0)
    std::printf("# iterations: %d timed after %d warmup\n", o.iters, o.warmup);
  else
    std::printf(
        "# iterations: adaptive, ~%.2f s per size (cut at %.2f s), %d..%d timed, <=%d warmup\n",
        o.target_s, 4 * o.target_s, o.min_iters, o.max_iters, o.warmup);
  std::printf("# %s; time = mean per-iteration time, max over ranks; busbw = algbw * 2(N-1)/N\n",
              o.prime ? "primed with one run at the largest size" : "not primed");
  std::printf("#\n");
  std::printf("# %10s %12s %6s %6s %10s %8s %8s %7s %7s\n", "size", "count", "type", "redop",
              "time", "algbw", "busbw", "#wrong", "iters");
  std::printf("# %10s %12s %6s %6s %10s %8s %8s %7s %7s\n", "(B)", "(elements)", "", "", "(us)",
              "(GB/s)", "(GB/s)", "", "");
  std::fflush(stdout);
}

// `iters` is printed after #wrong, commented out so the row keeps the nccl-tests shape.
inline void print_row(std::size_t bytes, int nranks, double time_s, long wrong, int iters) {
  double algbw = time_s > 0 ? static_cast<double>(bytes) / time_s / 1e9 : 0.0;
  double busbw = algbw * 2.0 * (nranks - 1) / nranks;
  std::printf("  %10zu %12zu %6s %6s %10.2f %8.3f %8.3f %7ld  # %d\n", bytes, bytes / sizeof(float),
              "float", "sum", time_s * 1e6, algbw, busbw, wrong, iters);
  std::fflush(stdout);
}

}  // namespace peers
