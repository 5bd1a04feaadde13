#include "perf_args.h"

#include <getopt.h>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <optional>

#include "core/config.h"

namespace perf {

using ringreduce::DataType;
using ringreduce::ReduceOp;

const char kUsage[] =
    "usage: ringreduce-perf allreduce|reduce_scatter|allgather|broadcast|reduce|alltoall "
    "[OPTIONS]\n"
    "   or: ringreduce-perf --calibrate FILE\n"
    "   or: ringreduce-perf -h|--help|--version\n"
    "\n"
    "Times the collective at each size from MINBYTES to MAXBYTES, out of place and in place,\n"
    "and checks every element of the results. Launch it with ringrun, mpirun, srun or\n"
    "torchrun (see README). The short options are nccl-tests' and mean what they mean there.\n"
    "\n"
    "  -b, --minbytes SIZE      smallest size, e.g. 4, 64K, 1M, 2G (default 32M)\n"
    "  -e, --maxbytes SIZE      largest size (default 32M)\n"
    "  -f, --stepfactor F       multiply the size by F (> 1) at each step (default 2)\n"
    "  -i, --stepbytes SIZE     add SIZE at each step instead (without -f, or with -f 1)\n"
    "  -n, --iters N            timed calls per size; 0 (default): as many as fill\n"
    "                           --time-per-size\n"
    "  -w, --warmup_iters N     untimed calls per size first (default 5)\n"
    "  -c, --check N            checked calls per size after the timed ones (default 1;\n"
    "                           0: none); #wrong counts the wrong elements of all of them\n"
    "  -d, --datatype T         float, half, bfloat16, double, int8, uint8, int16, int32,\n"
    "                           uint32, int64, uint64, bool, or all (default float)\n"
    "  -o, --op OP              sum, prod, min, max, avg, band, bor, bxor, premul_sum\n"
    "                           (mulsum), or all (default sum)\n"
    "  -r, --root R             root rank of broadcast and reduce (default 0)\n"
    "  -z, --blocking 0|1       1: a barrier after every call, inside the timing (default 0)\n"
    "  -a, --average 0|1|2|3    whose times a row reports: 0 rank 0's, 1 the mean over the\n"
    "                           ranks, 2 the fastest rank's, 3 the slowest rank's (default 3)\n"
    "  -T, --timeout SECONDS    fail a call (and the run) that waits longer than SECONDS\n"
    "                           (sets RINGREDUCE_TIMEOUT; 0, the default: its own value)\n"
    "  -t, --nthreads 1         -g, --ngpus 1    -m, --agg_iters 1\n"
    "                           accepted for nccl-tests' command lines: one rank per\n"
    "                           process, one call per iteration\n"
    "  --algorithm ALGO         force the algorithm (RINGREDUCE_ALGO=COLL:ALGO; default: the\n"
    "                           tuner's choice)\n"
    "  --time-per-size SECONDS  how long the adaptive iteration count aims for (default 0.2)\n"
    "  --wire FORMAT            float32 allreduce, reduce_scatter, allgather with a narrow\n"
    "                           wire format: none, bf16, f16, fp8e4m3, fp8e5m2, auto (default:\n"
    "                           RINGREDUCE_WIRE's); the check then allows the format's error\n"
    "                           bound, which the header states\n"
    "  --buffers host|device|registered\n"
    "                           where the buffers are (default host); device: CUDA device\n"
    "                           memory, every call stream-ordered on the default stream and\n"
    "                           timed to the stream's end; registered: host memory from\n"
    "                           Communicator::alloc (registered with this host's ranks)\n"
    "  --calibrate FILE         measure the links and the reduce kernel at length (30 batches\n"
    "                           instead of start-up's 3) and write them to FILE for\n"
    "                           RINGREDUCE_TUNING_FILE, replacing the line for this link kind\n"
    "                           and world size (run once per world size); no other options\n"
    "  -h, --help               print this text\n"
    "  --version                print the version\n"
    "\n"
    "Exit status: 0 if every checked element was right; 1 if any was wrong or a call failed;\n"
    "2 on bad usage.\n";

namespace {

// Strict decimal count: digits only (no sign, space or suffix), at most `max`.
std::optional<long> parse_count(const char* s, long max) {
  if (!*s) return std::nullopt;
  long v = 0;
  for (const char* c = s; *c; ++c) {
    if (*c < '0' || *c > '9') return std::nullopt;
    v = v * 10 + (*c - '0');
    if (v > max) return std::nullopt;
  }
  return v;
}

// A finite decimal number, the whole text of it.
std::optional<double> parse_number(const char* s) {
  if (!*s) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(s, &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v)) return std::nullopt;
  return v;
}

constexpr long kMaxIters = 1000000000;
constexpr long kMaxRoot = 65535;  // ringrun's largest job is 65536 ranks

// The long options with no short form: values past any char.
enum LongOnly { kAlgorithm = 256, kTimePerSize, kBuffers, kCalibrate, kVersion, kWire };

const option kLongOptions[] = {
    {"minbytes", required_argument, nullptr, 'b'},
    {"maxbytes", required_argument, nullptr, 'e'},
    {"stepbytes", required_argument, nullptr, 'i'},
    {"stepfactor", required_argument, nullptr, 'f'},
    {"iters", required_argument, nullptr, 'n'},
    {"agg_iters", required_argument, nullptr, 'm'},
    {"warmup_iters", required_argument, nullptr, 'w'},
    {"check", required_argument, nullptr, 'c'},
    {"op", required_argument, nullptr, 'o'},
    {"datatype", required_argument, nullptr, 'd'},
    {"root", required_argument, nullptr, 'r'},
    {"blocking", required_argument, nullptr, 'z'},
    {"timeout", required_argument, nullptr, 'T'},
    {"average", required_argument, nullptr, 'a'},
    {"nthreads", required_argument, nullptr, 't'},
    {"ngpus", required_argument, nullptr, 'g'},
    {"help", no_argument, nullptr, 'h'},
    {"algorithm", required_argument, nullptr, kAlgorithm},
    {"time-per-size", required_argument, nullptr, kTimePerSize},
    {"buffers", required_argument, nullptr, kBuffers},
    {"calibrate", required_argument, nullptr, kCalibrate},
    {"wire", required_argument, nullptr, kWire},
    {"version", no_argument, nullptr, kVersion},
    // nccl-tests options with nothing to do here: refused by name rather than as unknown.
    {"parallel_init", required_argument, nullptr, 'p'},
    {"stream_null", required_argument, nullptr, 'y'},
    {"cudagraph", required_argument, nullptr, 'G'},
    {"report_cputime", required_argument, nullptr, 'C'},
    {"report_timestamps", required_argument, nullptr, 'S'},
    {"output_file", required_argument, nullptr, 'J'},
    {"local_register", required_argument, nullptr, 'R'},
    {"run_cycles", required_argument, nullptr, 'N'},
    {"memory_report", required_argument, nullptr, 'M'},
    {nullptr, 0, nullptr, 0},
};
// Leading ':': a missing value is reported as ':' (not '?'), and getopt prints nothing itself.
constexpr const char kShortOptions[] = ":b:e:i:f:n:m:w:c:o:d:r:z:T:a:t:g:hp:y:G:C:S:J:R:N:M:";

const char* unsupported_name(int c) {
  switch (c) {
    case 'p':
      return "parallel_init";
    case 'y':
      return "stream_null";
    case 'G':
      return "cudagraph";
    case 'C':
      return "report_cputime";
    case 'S':
      return "report_timestamps";
    case 'J':
      return "output_file";
    case 'R':
      return "local_register";
    case 'N':
      return "run_cycles";
    case 'M':
      return "memory_report";
  }
  return nullptr;
}

}  // namespace

size_t Args::next_bytes(size_t bytes) const {
  const double next = factor > 1 ? static_cast<double>(bytes) * factor
                                 : static_cast<double>(bytes) + static_cast<double>(step_bytes);
  // Past what size_t holds, or not growing: the sizes end here.
  if (!(next < 18446744073709549568.0)) return bytes;
  const auto n = static_cast<size_t>(next);
  return n > bytes ? n : bytes;
}

Parsed parse_args(int argc, const char* const* argv) {
  Parsed p;
  Args& a = p.args;
  auto fail = [&](const std::string& why) {
    p.kind = Parsed::Kind::usage_error;
    p.error = why;
    return p;
  };
  if (argc < 1) return fail("no collective given");
  // getopt_long reorders its argv (options before operands); it gets a copy of the pointers.
  std::vector<char*> args;
  for (int i = 0; i < argc; ++i) args.push_back(const_cast<char*>(argv[i]));
  args.push_back(nullptr);
  optind = 0;  // glibc: 0 restarts the scan from scratch (a previous call's state is dropped)
  opterr = 0;
  bool factor_given = false, step_given = false, calibrate = false;
  int options_given = 0;
  for (;;) {
    int long_index = -1;
    const int c = getopt_long(argc, args.data(), kShortOptions, kLongOptions, &long_index);
    if (c == -1) break;
    // The argument getopt stopped after: the option itself when it failed (an unknown one, or
    // one whose value is missing because nothing follows it).
    const std::string last = optind > 0 && optind <= argc ? args[optind - 1] : "";
    const std::string last_name = last.substr(0, last.find('='));
    if (c == '?') {
      if (last.rfind("--", 0) == 0) {
        if (optopt != 0) return fail("option '" + last_name + "' takes no value");
        return fail("unknown or ambiguous option '" + last_name + "'");
      }
      return fail(std::string("unknown option '-") + static_cast<char>(optopt) + "'");
    }
    // The option's name for messages, as it was spelt (long or short).
    const std::string opt = long_index >= 0 ? std::string("--") + kLongOptions[long_index].name
                                            : std::string("-") + static_cast<char>(c);
    if (c == ':') {
      const std::string name = long_index >= 0 || last.rfind("--", 0) == 0
                                   ? last_name
                                   : std::string("-") + static_cast<char>(optopt);
      return fail("option '" + name + "' needs a value");
    }
    const std::string v = optarg ? optarg : "";
    auto bad = [&](const std::string& wants) {
      return fail(opt + " takes " + wants + ", not '" + v + "'");
    };
    if (c != 'h' && c != kVersion) ++options_given;
    switch (c) {
      case 'h':
        p.kind = Parsed::Kind::help;
        return p;
      case kVersion:
        p.kind = Parsed::Kind::version;
        return p;
      case 'b':
      case 'e':
      case 'i': {
        auto bytes = ringreduce::core::parse_size(v);
        if (!bytes) return bad("a size such as 4, 65536, 64K, 4M or 1G");
        if (c == 'b') a.min_bytes = *bytes;
        if (c == 'e') a.max_bytes = *bytes;
        if (c == 'i') {
          if (*bytes == 0) return bad("a size above 0");
          a.step_bytes = *bytes;
          step_given = true;
        }
        break;
      }
      case 'f': {
        auto f = parse_number(v.c_str());
        if (!f || *f < 1) return bad("a factor of 1 or more");
        a.factor = *f;
        factor_given = true;
        break;
      }
      case 'n': {
        auto n = parse_count(v.c_str(), kMaxIters);
        if (!n) return bad("a whole number from 0 (adaptive) to " + std::to_string(kMaxIters));
        a.iters = *n;
        break;
      }
      case 'w': {
        auto n = parse_count(v.c_str(), kMaxIters);
        if (!n) return bad("a whole number from 0 to " + std::to_string(kMaxIters));
        a.warmup = *n;
        break;
      }
      case 'c': {
        auto n = parse_count(v.c_str(), kMaxIters);
        if (!n) return bad("a count of checked calls, 0 (no check) or more");
        a.check = *n;
        break;
      }
      case 'r': {
        auto r = parse_count(v.c_str(), kMaxRoot);
        if (!r) return bad("a rank, from 0 to " + std::to_string(kMaxRoot));
        a.root = static_cast<int>(*r);
        break;
      }
      case 'z':
        if (v != "0" && v != "1") return bad("0 or 1");
        a.blocking = v == "1";
        break;
      case 'a': {
        auto m = parse_count(v.c_str(), 3);
        if (!m) return bad("0 (rank 0), 1 (mean), 2 (min) or 3 (max)");
        a.report = static_cast<Report>(*m);
        break;
      }
      case 'T': {
        auto t = parse_number(v.c_str());
        if (!t || *t < 0 || *t > 1e8) return bad("a number of seconds, 0 or more");
        a.timeout_s = *t;
        break;
      }
      case 't':
      case 'g':
      case 'm':
        // nccl-tests' threads, GPUs per thread and calls per group: here always one each.
        if (v != "1")
          return fail(opt +
                      " takes only 1 here (one rank per process, one call per iteration), not '" +
                      v + "'");
        break;
      case 'd':
        a.dtypes.clear();
        if (v == "all") {
          for (int t = 0; t < ringreduce::kNumDataTypes; ++t)
            a.dtypes.push_back(static_cast<DataType>(t));
        } else {
          DataType t;
          if (!ringreduce::parse_dtype(v, &t)) return fail("unknown datatype '" + v + "' (-d)");
          a.dtypes.push_back(t);
        }
        break;
      case 'o':
        a.ops.clear();
        if (v == "all") {
          for (int o = 0; o < ringreduce::kNumReduceOps; ++o)
            a.ops.push_back(static_cast<ReduceOp>(o));
        } else {
          ReduceOp o;
          if (v == "mulsum") {  // nccl-tests' name for it
            o = ReduceOp::premul_sum;
          } else if (!ringreduce::parse_op(v, &o)) {
            return fail("unknown op '" + v + "' (-o)");
          }
          a.ops.push_back(o);
        }
        break;
      case kAlgorithm:
        if (v.empty()) return bad("an algorithm's name");
        a.algo = v;
        break;
      case kWire:
        if (!ringreduce::parse_wire(v, &a.wire))
          return bad("a wire format: none, bf16, f16, fp8e4m3, fp8e5m2 or auto");
        a.wire_set = true;
        break;
      case kTimePerSize: {
        auto t = parse_number(v.c_str());
        if (!t || *t <= 0 || *t > 1e6) return bad("a number of seconds above 0");
        a.target_seconds = *t;
        break;
      }
      case kBuffers:
        if (v != "host" && v != "device" && v != "registered")
          return bad("host, device or registered");
        a.device = v == "device";
        a.registered = v == "registered";
        break;
      case kCalibrate:
        if (v.empty()) return bad("a file name");
        a.calibrate_file = v;
        calibrate = true;
        break;
      default:
        if (const char* name = unsupported_name(c))
          return fail(opt + " (nccl-tests' --" + name + ") is not supported by ringreduce-perf" +
                      (c == 'M' ? "; buffers in device memory are --buffers device" : ""));
        return fail("unknown option '" + opt + "'");
    }
  }
  std::vector<std::string> operands(args.begin() + optind, args.begin() + argc);
  if (calibrate) {
    if (options_given > 1 || !operands.empty())
      return fail("--calibrate FILE takes no collective and no other options");
    p.kind = Parsed::Kind::calibrate;
    return p;
  }
  if (operands.empty()) return fail("no collective given");
  if (operands.size() > 1) return fail("one collective only, not also '" + operands[1] + "'");
  a.coll_name = operands[0];
  const std::pair<const char*, Coll> names[] = {
      {"allreduce", Coll::allreduce}, {"reduce_scatter", Coll::reduce_scatter},
      {"allgather", Coll::allgather}, {"broadcast", Coll::broadcast},
      {"reduce", Coll::reduce},       {"alltoall", Coll::alltoall}};
  bool found = false;
  for (const auto& [n, c] : names)
    if (a.coll_name == n) a.coll = c, found = true;
  if (!found) return fail("unknown collective '" + a.coll_name + "'");
  if (a.min_bytes > a.max_bytes)
    return fail("-b " + std::to_string(a.min_bytes) + " is above -e " +
                std::to_string(a.max_bytes));
  if (step_given) {
    if (factor_given && a.factor > 1)
      return fail("-f and -i both given: sizes grow by a factor (-f) or by a step (-i), not both");
    a.factor = 1;
  } else if (a.factor <= 1 && a.min_bytes != a.max_bytes) {
    return fail("-f 1 needs -i SIZE, the step the sizes grow by");
  }
  p.kind = Parsed::Kind::run;
  return p;
}

}  // namespace perf
