// ringreduce-perf: the collective benchmark, following nccl-tests' conventions.
//
//   ringrun -n 4 ringreduce-perf allreduce -b 4 -e 256M -f 4 -d float -o sum
//
// Each row: size(B) count type redop root | out-of-place time(us) algbw busbw #wrong | in-place
// time algbw busbw #wrong | algorithm. algbw = size / time; busbw = algbw x the collective's bus
// factor (allreduce 2(n-1)/n; reduce_scatter, allgather, alltoall (n-1)/n; broadcast, reduce 1),
// so busbw compares with the link's bandwidth whatever the rank count. Time is the slowest rank's
// mean over the timed iterations (-a picks another: nccl-tests' --average), the loop timed as a
// whole; for calls under 1 ms the spread below comes from a second loop of as many calls. #wrong
// counts elements, over all ranks, that differ from the exact answer (inputs are small integers, so
// every answer is exact). Exits non-zero if any is. The options: perf_args.cc.
// After the algorithm, how stable the times are, out of place then in place: the first call of
// the size (from a barrier, before any warm-up: what a training job's first step pays), and the
// min / median / max of the per-call times of the timed iterations (each the slowest rank's;
// calls under 5 us are timed in blocks of 5 us, each block's mean standing for its calls).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "exact_data.h"
#include "perf_args.h"
#include "perf_bench.h"
#include "reduce/cuda/reduce_cuda.h"
#include "reduce/wire.h"
#include "ringreduce/ringreduce.hpp"
#include "tool_version.h"

namespace {

using namespace ringreduce;
using Clock = std::chrono::steady_clock;

using perf::Args;
using perf::Bench;
using perf::Coll;
using perf::Report;

// A usage error found once the communicator is up (a root past the last rank, no CUDA device).
[[noreturn]] void usage_error(const std::string& why) {
  std::fprintf(stderr, "ringreduce-perf: %s\n%s", why.c_str(), perf::kUsage);
  std::exit(2);
}

bool reduces(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce_scatter || c == Coll::reduce;
}
bool rooted(Coll c) {
  return c == Coll::broadcast || c == Coll::reduce;
}

double bus_factor(Coll c, int n) {
  switch (c) {
    case Coll::allreduce:
      return 2.0 * (n - 1) / n;
    case Coll::reduce_scatter:
    case Coll::allgather:
    case Coll::alltoall:
      return double(n - 1) / n;
    case Coll::broadcast:
    case Coll::reduce:
      return 1.0;
  }
  return 1.0;
}

double max_over_ranks(Communicator& comm, double v) {
  comm.allreduce(&v, &v, 1, DataType::f64, ReduceOp::max);
  return v;
}
// The k values of every rank made into the ones a row reports (-a): rank 0's, the mean over the
// ranks, the least or the greatest of each.
void report_over_ranks(Communicator& comm, double* v, size_t k, Report how) {
  switch (how) {
    case Report::rank0:
      comm.broadcast(v, k, DataType::f64, 0);
      return;
    case Report::avg:
      comm.allreduce(v, v, k, DataType::f64, ReduceOp::sum);
      for (size_t i = 0; i < k; ++i) v[i] /= comm.size();
      return;
    case Report::min:
      comm.allreduce(v, v, k, DataType::f64, ReduceOp::min);
      return;
    case Report::max:
      comm.allreduce(v, v, k, DataType::f64, ReduceOp::max);
      return;
  }
}
uint64_t sum_over_ranks(Communicator& comm, uint64_t v) {
  comm.allreduce(&v, &v, 1, DataType::u64, ReduceOp::sum);
  return v;
}

struct Result {
  double time_us = 0;
  uint64_t wrong = 0;
  std::string algo;
  double first_us = 0, min_us = 0, median_us = 0, max_us = 0;
};

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

Result measure(Bench& b, bool in_place) {
  Communicator& comm = b.comm;
  Result res;
  // The first call of this size, every rank starting together and awake. A rank that waited
  // long in a barrier (while rank 0 printed the last row) has slept, and waking it can take
  // longer than a waiter spins before sleeping itself (tens to hundreds of us on a VM): a second
  // barrier then only moved the sleep to the other rank, and the first call paid for its wake-up
  // (out of place 3-390 us at N = 2, median 0.4). So barriers until one takes every rank under
  // 20 us (at most 10; with ranks crowding a core a barrier may never be that quick).
  comm.barrier();
  for (int i = 0; i < 10; ++i) {
    const auto t = Clock::now();
    comm.barrier();
    if (max_over_ranks(comm, seconds(Clock::now() - t)) < 20e-6) break;
  }
  const auto start = Clock::now();
  b.run(in_place);
  double first = seconds(Clock::now() - start);
  report_over_ranks(comm, &first, 1, b.args.report);
  res.first_us = first * 1e6;
  // -z 1: every call is followed by a barrier, timed with it (nccl-tests' blocking mode).
  auto step = [&] {
    b.run(in_place);
    if (b.args.blocking) comm.barrier();
  };
  for (long i = 1; i < b.args.warmup; ++i) step();
  // Time one iteration (slowest rank, so every rank computes the same counts below).
  comm.barrier();
  auto probe = Clock::now();
  step();
  const double one = std::max(max_over_ranks(comm, seconds(Clock::now() - probe)), 1e-7);
  // Small sizes also warm up for ~20 ms: cores that were idle halt, and the first few hundred
  // microseconds after waking them are not the steady state a training loop sees.
  for (long i = 0, extra = static_cast<long>(std::min(0.02 / one, 2000.0)); i < extra; ++i) step();
  long iters = b.args.iters;
  if (iters <= 0) {
    // Adaptive: aim for target_seconds per measurement.
    iters = static_cast<long>(std::clamp(b.args.target_seconds / one, 5.0, 20000.0));
  }
  // The mean of calls under 1 ms comes from a loop timed as a whole, as nccl-tests and the MPI
  // peers (bench/peers) time theirs: reading the clock after each call costs more than its ~25 ns
  // where ranks share a core, since after every process switch the clock's code and data pages
  // miss the emptied TLB (4 B at N = 4 on 2 cores: 0.25 us of 6.3, docs/PERFORMANCE.md).
  double whole = 0;
  const bool separate_mean = one < 1e-3;
  if (separate_mean) {
    comm.barrier();
    const auto m0 = Clock::now();
    for (long i = 0; i < iters; ++i) step();
    whole = seconds(Clock::now() - m0) / static_cast<double>(iters);
  }
  // The spread: the clock is read after every `per` calls, so that its ~25 ns stay under 0.5% of
  // what it times: each call for calls of 5 us or more, blocks of calls below (whose mean is then
  // each call's time in the spread). From 1 ms the mean is this loop's total.
  const long per = std::max(1L, static_cast<long>(5e-6 / one));
  std::vector<double> per_call;
  per_call.reserve(static_cast<size_t>(iters / per + 1));
  comm.barrier();
  const auto t0 = Clock::now();
  auto prev = t0;
  long in_block = 0;
  for (long i = 0; i < iters; ++i) {
    step();
    if (++in_block < per && i + 1 != iters) continue;
    const auto now = Clock::now();
    per_call.push_back(seconds(now - prev) / static_cast<double>(in_block));
    prev = now;
    in_block = 0;
  }
  std::sort(per_call.begin(), per_call.end());
  // The mean, min, median and max of the slowest rank (or as -a says), in one collective.
  double stats[4] = {separate_mean ? whole : seconds(prev - t0) / static_cast<double>(iters),
                     per_call.front(), per_call[per_call.size() / 2], per_call.back()};
  report_over_ranks(comm, stats, 4, b.args.report);
  res.time_us = stats[0] * 1e6;
  res.min_us = stats[1] * 1e6;
  res.median_us = stats[2] * 1e6;
  res.max_us = stats[3] * 1e6;
  // -c N: N checked calls, each on fresh inputs; #wrong is their total.
  for (long c = 0; c < b.args.check; ++c) {
    b.fill(in_place);
    Work w = b.issue(in_place);
    w.wait();
    res.algo = w.algorithm();
    res.wrong += sum_over_ranks(comm, b.wrong(in_place));
  }
  if (b.args.check == 0) {
    Work w = b.issue(in_place);
    w.wait();
    res.algo = w.algorithm();
  }
  return res;
}

}  // namespace

// --calibrate FILE: a communicator that measures its links for longer than start-up does, and
// its costs written into FILE (other lines kept, this kind and size replaced).
int calibrate(const std::string& path) {
  try {
    Options options;
    options.settings["RINGREDUCE_TUNING_FILE"] = "";  // measure, do not read
    options.settings["RINGREDUCE_PROBE_BATCHES"] = "30";
    Communicator comm = Communicator::from_env(options);
    if (comm.rank() != 0) return 0;
    const std::string mine = comm.tuning();
    // mine: "link KIND RANKS ALPHA BETA PI\ngamma G\n"; keep other kinds' and sizes' lines.
    const std::string key = mine.substr(0, mine.find(' ', mine.find(' ', 5) + 1) + 1);
    std::vector<std::string> keep;
    if (FILE* in = std::fopen(path.c_str(), "r")) {
      char line[512];
      while (std::fgets(line, sizeof line, in)) {
        std::string l(line);
        if (l.rfind(key, 0) == 0 || l.rfind("gamma ", 0) == 0 || l.rfind("# ", 0) == 0) continue;
        keep.push_back(l);
      }
      std::fclose(in);
    }
    FILE* out = std::fopen(path.c_str(), "w");
    if (!out) {
      std::fprintf(stderr, "ringreduce-perf: cannot write %s\n", path.c_str());
      return 1;
    }
    std::fprintf(out,
                 "# ringreduce-perf --calibrate: link KIND RANKS ALPHA_S BETA_S_PER_BYTE "
                 "PI_S_PER_BYTE; gamma S_PER_BYTE\n");
    for (const auto& l : keep) std::fputs(l.c_str(), out);
    std::fputs(mine.c_str(), out);
    std::fclose(out);
    std::printf("%s", mine.c_str());
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ringreduce-perf: %s\n", e.what());
    return 1;
  }
}

int main(int argc, char** argv) {
  perf::Parsed parsed = perf::parse_args(argc, argv);
  switch (parsed.kind) {
    case perf::Parsed::Kind::help:
      std::fputs(perf::kUsage, stdout);
      return 0;
    case perf::Parsed::Kind::version:
      std::printf("%s\n", ringreduce_tools::version_text("ringreduce-perf").c_str());
      return 0;
    case perf::Parsed::Kind::usage_error:
      usage_error(parsed.error);
    case perf::Parsed::Kind::calibrate:
      return calibrate(parsed.args.calibrate_file);
    case perf::Parsed::Kind::run:
      break;
  }
  const Args& args = parsed.args;
  if (args.device && !reduce::cuda::available())
    usage_error("--buffers device: " + reduce::cuda::unavailable_reason());
  try {
    Options options;
    if (args.timeout_s > 0)
      options.timeout = std::chrono::milliseconds(static_cast<long long>(args.timeout_s * 1000));
    if (!args.algo.empty()) options.settings["RINGREDUCE_ALGO"] = args.coll_name + ":" + args.algo;
    Communicator comm = Communicator::from_env(options);
    const int n = comm.size();
    const bool print = comm.rank() == 0;
    if (args.root < 0 || args.root >= n)
      usage_error("-r " + std::to_string(args.root) + " is not a rank of " + std::to_string(n));
    char host[256] = {};
    gethostname(host, sizeof host - 1);
    if (print) {
      std::printf("# ringreduce-perf %s: %d ranks, iters %s, warmup %ld, check %ld\n",
                  args.coll_name.c_str(), n,
                  args.iters > 0 ? std::to_string(args.iters).c_str() : "adaptive", args.warmup,
                  args.check);
      std::printf("#  Rank  0 Pid %6d on %s\n", getpid(), host);
      // Only where they differ from the defaults, so that default runs print what they always did.
      if (args.blocking)
        std::printf("#  Blocking: a barrier after each call, inside the timing (-z 1)\n");
      if (args.report != Report::max) {
        const char* whose[] = {"rank 0's", "the mean over the ranks", "the fastest rank's"};
        std::printf("#  Times: %s (-a %d)\n", whose[static_cast<int>(args.report)],
                    static_cast<int>(args.report));
      }
      if (args.wire_set)
        std::printf(
            "#  Wire %s: float32 allreduce, reduce_scatter, allgather coded; an allreduce's "
            "result is checked to be within %g x (sum of |inputs| + |result|) of the exact one\n",
            wire_name(args.wire),
            args.wire == Wire::none
                ? 0.0
                : reduce::wire_layout(args.wire == Wire::automatic ? Wire::bf16 : args.wire)
                      .roundoff);
      std::printf("#  Buffers in %s memory%s\n#\n",
                  args.device       ? "device"
                  : args.registered ? "registered host"
                                    : "host",
                  args.device ? (" (" + reduce::cuda::device_description() + ")").c_str() : "");
      std::printf("# %10s %12s %8s %6s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s  %-20s  %s\n", "", "",
                  "", "", "", "out-of-place", "", "", "", "in-place", "", "", "", "",
                  "per call (us): out-of-place | in-place");
      std::printf("# %10s %12s %8s %6s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s  %-20s  %s\n", "size",
                  "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
                  "algbw", "busbw", "#wrong", "algo",
                  "first min median max | first min median max");
      std::printf("# %10s %12s %8s %6s %6s  %9s %7s %7s %6s  %9s %7s %7s %6s\n", "(B)",
                  "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
                  "(GB/s)", "");
      std::fflush(stdout);
    }
    uint64_t total_wrong = 0;
    double bw_sum = 0;
    int bw_rows = 0;
    const bool blocked = args.coll == Coll::reduce_scatter || args.coll == Coll::allgather ||
                         args.coll == Coll::alltoall;
    for (DataType dtype : args.dtypes) {
      for (ReduceOp op : args.ops) {
        if (!reduces(args.coll) && op != args.ops.front()) continue;  // op is irrelevant
        if (reduces(args.coll) && !op_applies(op, dtype)) continue;   // -d all -o all
        for (size_t bytes = args.min_bytes; bytes <= args.max_bytes;) {
          const size_t elem = dtype_size(dtype);
          size_t count = bytes / elem;
          size_t block = count / static_cast<size_t>(n);
          if (blocked) count = block * static_cast<size_t>(n);
          Bench b{comm, args, dtype, op, count, block, {}, {}};
          b.allocate();
          Result oop = measure(b, false);
          const bool in_place_ok = args.coll != Coll::alltoall || n == 1;
          Result ip = in_place_ok ? measure(b, true) : Result{};
          total_wrong += oop.wrong + ip.wrong;
          const double size = static_cast<double>(count * elem);
          auto algbw = [&](double us) { return us > 0 ? size / us / 1e3 : 0.0; };
          const double f = bus_factor(args.coll, n);
          bw_sum += algbw(oop.time_us) * f;
          ++bw_rows;
          if (print) {
            char ipbuf[96], spread[160];
            auto times = [](const Result& r) {
              char t[80];
              std::snprintf(t, sizeof t, "%.2f %.2f %.2f %.2f", r.first_us, r.min_us, r.median_us,
                            r.max_us);
              return std::string(t);
            };
            if (in_place_ok) {
              std::snprintf(ipbuf, sizeof ipbuf, "%9.2f %7.3f %7.3f %6llu", ip.time_us,
                            algbw(ip.time_us), algbw(ip.time_us) * f,
                            static_cast<unsigned long long>(ip.wrong));
              std::snprintf(spread, sizeof spread, "%s | %s", times(oop).c_str(),
                            times(ip).c_str());
            } else {
              std::snprintf(ipbuf, sizeof ipbuf, "%9s %7s %7s %6s", "N/A", "N/A", "N/A", "N/A");
              std::snprintf(spread, sizeof spread, "%s | N/A", times(oop).c_str());
            }
            std::printf("  %10zu %12zu %8s %6s %6d  %9.2f %7.3f %7.3f %6llu  %s  %-20s  %s\n",
                        count * elem, count, dtype_name(dtype),
                        reduces(args.coll) ? op_name(op) : "none",
                        rooted(args.coll) ? args.root : -1, oop.time_us, algbw(oop.time_us),
                        algbw(oop.time_us) * f, static_cast<unsigned long long>(oop.wrong), ipbuf,
                        oop.algo.c_str(), spread);
            std::fflush(stdout);
          }
          const size_t next = args.next_bytes(bytes);
          if (next <= bytes) break;
          bytes = next;
        }
      }
    }
    if (print) {
      std::printf("# Out of bounds values : %llu %s\n",
                  static_cast<unsigned long long>(total_wrong), total_wrong == 0 ? "OK" : "FAILED");
      std::printf("# Avg bus bandwidth    : %.4f\n#\n", bw_rows ? bw_sum / bw_rows : 0.0);
    }
    return total_wrong == 0 ? 0 : 1;
  } catch (const Error& e) {
    std::fprintf(stderr, "ringreduce-perf: %s\n", e.what());
    return 1;
  }
}
