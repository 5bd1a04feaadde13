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
#include "reduce/cuda/reduce_cuda.h"
#include "reduce/wire.h"
#include "ringreduce/ringreduce.hpp"
#include "tool_version.h"

namespace {

using namespace ringreduce;
using Clock = std::chrono::steady_clock;

using perf::Args;
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

// One benchmark shape: buffers sized for `count` total elements.
struct Bench {
  Communicator& comm;
  const Args& args;
  DataType dtype;
  ReduceOp op;
  size_t count;  // total elements (size / elem), a multiple of n where the collective needs it
  size_t block;  // per-rank elements for the block collectives
  // Page-aligned, like the buffers users pass (torch allocates 64-byte aligned tensors, nccl-tests
  // cudaMalloc'd ones); malloc's 16-byte offset would time split vector loads instead.
  // --buffers device: the buffers are device memory (cudaMalloc), with a host copy that the checks
  // fill and read (uploaded before a checked run, downloaded after).
  // --buffers registered: the buffers come from Communicator::alloc (page-aligned too), and are
  // freed with it (a collective: every rank frees its buffers in the same order).
  struct Buffer {
    std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
    std::unique_ptr<reduce::cuda::DeviceBuffer> dev;
    Communicator* registered = nullptr;
    char* reg = nullptr;
    size_t n = 0;
    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() {
      try {
        unregister();
      } catch (const std::exception&) {  // the communicator failed: its end frees the memory
      }
    }
    void unregister() {
      if (reg) registered->free(std::exchange(reg, nullptr));
    }
    void assign(size_t bytes, char v, bool device, Communicator* comm) {
      unregister();
      p.reset();
      n = bytes;
      if (comm) {
        reg = static_cast<char*>(comm->alloc(bytes));
        registered = comm;
      } else {
        p.reset(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
        if (!p) throw std::bad_alloc();
      }
      std::memset(host(), v, bytes);
      if (device) dev = std::make_unique<reduce::cuda::DeviceBuffer>(bytes);
    }
    // What the calls are given: device memory with --buffers device.
    char* data() { return dev ? static_cast<char*>(dev->data()) : host(); }
    char* host() { return reg ? reg : p.get(); }
    size_t size() const { return n; }
    void upload() {
      if (dev) dev->upload(p.get(), n);
    }
    void download() {
      if (dev) dev->download(p.get(), n);
    }
  };
  Buffer send, recv;

  size_t elem() const { return dtype_size(dtype); }
  int n() const { return comm.size(); }
  int r() const { return comm.rank(); }
  size_t send_elems() const { return args.coll == Coll::allgather ? block : count; }
  size_t recv_elems() const { return args.coll == Coll::reduce_scatter ? block : count; }

  void allocate() {
    Communicator* reg = args.registered ? &comm : nullptr;
    send.assign(std::max<size_t>(1, send_elems() * elem()), 0, args.device, reg);
    recv.assign(std::max<size_t>(1, count * elem()), 0, args.device, reg);
  }

  // The receive pointer of the in-place variant (nccl-tests conventions).
  void* in_place_recv() { return args.coll == Coll::allgather ? recv.data() : send.data(); }
  const void* in_place_send() {
    if (args.coll == Coll::allgather)
      return recv.data() + static_cast<size_t>(r()) * block * elem();
    return send.data();
  }
  void* in_place_dst() {
    if (args.coll == Coll::reduce_scatter)
      return send.data() + static_cast<size_t>(r()) * block * elem();
    return in_place_recv();
  }

  CallOptions call() const {
    CallOptions c;
    // Host buffers take the default (automatic) path, so rows time what a user's call pays.
    c.memory = args.device ? Memory::device : Memory::automatic;
    if (args.wire_set) c.wire = args.wire;
    return c;
  }
  Work issue(bool in_place) {
    const void* s = in_place ? in_place_send() : send.data();
    void* d = in_place ? in_place_dst() : recv.data();
    switch (args.coll) {
      case Coll::allreduce:
        return comm.allreduce_async(s, d, count, dtype, op, call());
      case Coll::reduce_scatter:
        return comm.reduce_scatter_async(s, d, block, dtype, op, call());
      case Coll::allgather:
        return comm.allgather_async(s, d, block, dtype, call());
      case Coll::broadcast:
        return comm.broadcast_async(s, d, count, dtype, args.root, call());
      case Coll::reduce:
        return comm.reduce_async(s, d, count, dtype, op, args.root, call());
      case Coll::alltoall:
        return comm.alltoall_async(s, d, block, dtype, call());
    }
    return {};
  }
  // Blocking variant for the timed loop: the caller drives progress itself.
  void run(bool in_place) {
    const void* s = in_place ? in_place_send() : send.data();
    void* d = in_place ? in_place_dst() : recv.data();
    switch (args.coll) {
      case Coll::allreduce:
        comm.allreduce(s, d, count, dtype, op, call());
        break;
      case Coll::reduce_scatter:
        comm.reduce_scatter(s, d, block, dtype, op, call());
        break;
      case Coll::allgather:
        comm.allgather(s, d, block, dtype, call());
        break;
      case Coll::broadcast:
        comm.broadcast(s, d, count, dtype, args.root, call());
        break;
      case Coll::reduce:
        comm.reduce(s, d, count, dtype, op, args.root, call());
        break;
      case Coll::alltoall:
        comm.alltoall(s, d, block, dtype, call());
        break;
    }
  }

  // Fills the inputs with exact data for one checked run.
  void fill(bool in_place) {
    using namespace exact;
    switch (args.coll) {
      case Coll::allreduce:
      case Coll::reduce:
      case Coll::reduce_scatter:
        fill_input(send.host(), count, r(), dtype, op);
        break;
      case Coll::allgather:
        fill_input(in_place ? recv.host() + static_cast<size_t>(r()) * block * elem() : send.host(),
                   block, r(), dtype, op, static_cast<size_t>(r()) * block);
        break;
      case Coll::broadcast:
        if (r() == args.root) fill_input(send.host(), count, r(), dtype, op);
        if (in_place && r() != args.root) std::memset(send.host(), 0, count * elem());
        break;
      case Coll::alltoall:
        // Block j goes to rank j; its content identifies the sender (rank r) and position.
        for (int j = 0; j < n(); ++j)
          fill_input(send.host() + static_cast<size_t>(j) * block * elem(), block, r(), dtype, op,
                     static_cast<size_t>(j) * block);
        break;
    }
    if (!in_place) std::memset(recv.host(), 0, recv.size());
    send.upload();
    recv.upload();
  }

  // The host's view of a pointer into send or recv.
  const char* host_of(const void* p) {
    const char* c = static_cast<const char*>(p);
    for (Buffer* b : {&send, &recv})
      if (c >= b->data() && c < b->data() + b->size()) return b->host() + (c - b->data());
    return c;
  }

  // Whether a call of this row may run coded (Tuner::wire_applies): float32, sum-like.
  bool coded() const {
    const bool summing = op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::premul_sum;
    return args.wire_set && args.wire != Wire::none && dtype == DataType::f32 &&
           (args.coll == Coll::allgather ||
            (summing && (args.coll == Coll::allreduce || args.coll == Coll::reduce_scatter)));
  }
  // The relative error a coded result may carry: one rounding of the widest format auto may
  // pick (bf16) or of the format asked for.
  double roundoff() const {
    return reduce::wire_layout(args.wire == Wire::automatic ? Wire::bf16 : args.wire).roundoff;
  }
  size_t wrong(bool in_place) {
    using namespace exact;
    send.download();
    recv.download();
    const char* out = host_of(in_place ? in_place_dst() : recv.data());
    switch (args.coll) {
      case Coll::allreduce:
        // A coded allreduce rounds its result once (its inputs, small integers, code exactly).
        if (coded()) return count_wrong_reduced(out, count, n(), dtype, op, 0, roundoff());
        return count_wrong_reduced(out, count, n(), dtype, op);
      case Coll::reduce:
        return r() == args.root ? count_wrong_reduced(out, count, n(), dtype, op) : 0;
      case Coll::reduce_scatter:
        return count_wrong_reduced(out, block, n(), dtype, op, static_cast<size_t>(r()) * block);
      case Coll::broadcast:
        return count_wrong_input(out, count, args.root, dtype, op);
      case Coll::allgather: {
        size_t w = 0;
        for (int j = 0; j < n(); ++j)
          w += count_wrong_input(out + static_cast<size_t>(j) * block * elem(), block, j, dtype, op,
                                 static_cast<size_t>(j) * block);
        return w;
      }
      case Coll::alltoall: {
        size_t w = 0;
        for (int j = 0; j < n(); ++j)
          w += count_wrong_input(out + static_cast<size_t>(j) * block * elem(), block, j, dtype, op,
                                 static_cast<size_t>(r()) * block);
        return w;
      }
    }
    return 0;
  }
};

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
