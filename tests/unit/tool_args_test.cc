// The tools' command lines: ringreduce-perf's options as nccl-tests spells them and its own long
// ones (tools/perf_args.cc), ringrun's mpirun spelling -np (tools/ringrun_args.cc), and what the
// built tools do with --help, --version and a bad value (exit status, where the text goes).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "perf_args.h"
#include "ringreduce/version.h"
#include "ringrun_args.h"

#if !defined(PERF_PATH) || !defined(RINGRUN_PATH) || !defined(STORE_PATH)
#error "PERF_PATH, RINGRUN_PATH and STORE_PATH must name the built tools"
#endif

extern char** environ;

namespace {

using ringreduce::DataType;
using ringreduce::ReduceOp;

perf::Parsed perf_parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ringreduce-perf");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return perf::parse_args(static_cast<int>(args.size()), argv.data());
}

ringrun::Parsed ringrun_parse(std::vector<std::string> args) {
  args.insert(args.begin(), "ringrun");
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  argv.push_back(nullptr);
  return ringrun::parse_args(static_cast<int>(args.size()), argv.data());
}

std::string joined(const std::vector<std::string>& args) {
  std::string s;
  for (const auto& a : args) s += a + " ";
  return s;
}

TEST(PerfArgs, DefaultsAreTheOnesTheBenchmarksWereMeasuredWith) {
  const auto p = perf_parse({"allreduce"});
  ASSERT_EQ(p.kind, perf::Parsed::Kind::run) << p.error;
  const auto& a = p.args;
  EXPECT_EQ(a.coll, perf::Coll::allreduce);
  EXPECT_EQ(a.min_bytes, size_t{32} << 20);
  EXPECT_EQ(a.max_bytes, size_t{32} << 20);
  EXPECT_EQ(a.factor, 2.0);
  EXPECT_EQ(a.iters, 0);  // adaptive
  EXPECT_EQ(a.warmup, 5);
  EXPECT_EQ(a.check, 1);
  EXPECT_EQ(a.root, 0);
  EXPECT_EQ(a.dtypes, std::vector<DataType>{DataType::f32});
  EXPECT_EQ(a.ops, std::vector<ReduceOp>{ReduceOp::sum});
  EXPECT_FALSE(a.blocking);
  EXPECT_EQ(a.report, perf::Report::max);
  EXPECT_EQ(a.timeout_s, 0.0);
  EXPECT_TRUE(a.algo.empty());
  EXPECT_EQ(a.target_seconds, 0.2);
  EXPECT_FALSE(a.device);
}

TEST(PerfArgs, ShortOptionsAsNcclTestsWritesThem) {
  const auto p = perf_parse({"reduce", "-b", "4",  "-e",  "1M", "-f",  "4",  "-n", "3",  "-w", "1",
                             "-c",     "2",  "-d", "all", "-o", "all", "-r", "3",  "-z", "1",  "-a",
                             "1",      "-T", "30", "-t",  "1",  "-g",  "1",  "-m", "1"});
  ASSERT_EQ(p.kind, perf::Parsed::Kind::run) << p.error;
  const auto& a = p.args;
  EXPECT_EQ(a.coll, perf::Coll::reduce);
  EXPECT_EQ(a.coll_name, "reduce");
  EXPECT_EQ(a.min_bytes, 4u);
  EXPECT_EQ(a.max_bytes, size_t{1} << 20);
  EXPECT_EQ(a.factor, 4.0);
  EXPECT_EQ(a.iters, 3);
  EXPECT_EQ(a.warmup, 1);
  EXPECT_EQ(a.check, 2);
  EXPECT_EQ(a.dtypes.size(), static_cast<size_t>(ringreduce::kNumDataTypes));
  EXPECT_EQ(a.ops.size(), static_cast<size_t>(ringreduce::kNumReduceOps));
  EXPECT_EQ(a.root, 3);
  EXPECT_TRUE(a.blocking);
  EXPECT_EQ(a.report, perf::Report::avg);
  EXPECT_EQ(a.timeout_s, 30.0);
}

TEST(PerfArgs, LongOptionsAttachedValuesAndTheCollectiveAnywhere) {
  const auto p = perf_parse(
      {"--minbytes=64K",   "--maxbytes", "4M", "--stepfactor=8", "--iters",     "7",
       "--warmup_iters=0", "--check",    "0",  "--datatype",     "half",        "--op=max",
       "allgather",        "--root",     "2",  "--blocking=0",   "--average",   "0",
       "--timeout=1.5",    "--nthreads", "1",  "--ngpus=1",      "--agg_iters", "1"});
  ASSERT_EQ(p.kind, perf::Parsed::Kind::run) << p.error;
  const auto& a = p.args;
  EXPECT_EQ(a.coll, perf::Coll::allgather);
  EXPECT_EQ(a.min_bytes, size_t{64} << 10);
  EXPECT_EQ(a.max_bytes, size_t{4} << 20);
  EXPECT_EQ(a.factor, 8.0);
  EXPECT_EQ(a.iters, 7);
  EXPECT_EQ(a.warmup, 0);
  EXPECT_EQ(a.check, 0);
  EXPECT_EQ(a.dtypes, std::vector<DataType>{DataType::f16});
  EXPECT_EQ(a.ops, std::vector<ReduceOp>{ReduceOp::max});
  EXPECT_EQ(a.root, 2);
  EXPECT_FALSE(a.blocking);
  EXPECT_EQ(a.report, perf::Report::rank0);
  EXPECT_EQ(a.timeout_s, 1.5);

  const auto q = perf_parse({"-n3", "-w0", "-b4", "-e4", "alltoall", "-omulsum", "-a2"});
  ASSERT_EQ(q.kind, perf::Parsed::Kind::run) << q.error;
  EXPECT_EQ(q.args.coll, perf::Coll::alltoall);
  EXPECT_EQ(q.args.iters, 3);
  EXPECT_EQ(q.args.warmup, 0);
  EXPECT_EQ(q.args.ops, std::vector<ReduceOp>{ReduceOp::premul_sum});  // nccl-tests' name
  EXPECT_EQ(q.args.report, perf::Report::min);
}

TEST(PerfArgs, RingreduceOwnOptionsAreLong) {
  const auto p = perf_parse(
      {"broadcast", "--algorithm", "tree", "--time-per-size", "0.1", "--buffers", "device"});
  ASSERT_EQ(p.kind, perf::Parsed::Kind::run) << p.error;
  EXPECT_EQ(p.args.coll, perf::Coll::broadcast);
  EXPECT_EQ(p.args.algo, "tree");
  EXPECT_EQ(p.args.target_seconds, 0.1);
  EXPECT_TRUE(p.args.device);
  // A unique prefix is the option, as getopt_long has it.
  const auto q = perf_parse({"allreduce", "--algo=ring", "--buffers=host"});
  ASSERT_EQ(q.kind, perf::Parsed::Kind::run) << q.error;
  EXPECT_EQ(q.args.algo, "ring");
  EXPECT_FALSE(q.args.device);
  EXPECT_FALSE(q.args.registered);
  const auto r = perf_parse({"allreduce", "--buffers", "registered"});
  ASSERT_EQ(r.kind, perf::Parsed::Kind::run) << r.error;
  EXPECT_TRUE(r.args.registered);
  EXPECT_FALSE(r.args.device);
  const auto w = perf_parse({"allreduce", "--wire", "fp8"});
  ASSERT_EQ(w.kind, perf::Parsed::Kind::run) << w.error;
  EXPECT_TRUE(w.args.wire_set);
  EXPECT_EQ(w.args.wire, ringreduce::Wire::fp8e4m3);
  EXPECT_FALSE(r.args.wire_set);  // unset: RINGREDUCE_WIRE decides

  const auto c = perf_parse({"--calibrate", "/tmp/costs"});
  ASSERT_EQ(c.kind, perf::Parsed::Kind::calibrate) << c.error;
  EXPECT_EQ(c.args.calibrate_file, "/tmp/costs");
}

TEST(PerfArgs, SizesGrowByTheFactorOrByTheStep) {
  auto a = perf_parse({"allreduce", "-b", "4", "-e", "64", "-f", "4"}).args;
  EXPECT_EQ(a.next_bytes(4), 16u);
  EXPECT_EQ(a.next_bytes(16), 64u);
  // -i alone, or with -f 1: additive steps, as nccl-tests' -i.
  for (const auto& args :
       {std::vector<std::string>{"allreduce", "-b", "1M", "-e", "4M", "-i", "1M"},
        {"allreduce", "-b", "1M", "-e", "4M", "-f", "1", "-i", "1M"}}) {
    const auto p = perf_parse(args);
    ASSERT_EQ(p.kind, perf::Parsed::Kind::run) << joined(args) << p.error;
    EXPECT_EQ(p.args.factor, 1.0);
    EXPECT_EQ(p.args.next_bytes(size_t{1} << 20), size_t{2} << 20);
  }
  // One size needs no step at all; a size that cannot grow ends the sizes.
  EXPECT_EQ(perf_parse({"allreduce", "-b", "8", "-e", "8", "-f", "1"}).kind,
            perf::Parsed::Kind::run);
  a.factor = 2;
  EXPECT_EQ(a.next_bytes(0), 0u);
  EXPECT_EQ(a.next_bytes(~size_t{0}), ~size_t{0});
}

TEST(PerfArgs, EveryBadValueIsRefusedByName) {
  // Each command line, and a piece of the message it must get.
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{}, "no collective given"},
      {{"-n", "3"}, "no collective given"},
      {{"allreduce", "reduce"}, "one collective only"},
      {{"--help-me"}, "unknown or ambiguous option '--help-me'"},
      {{"allfoo"}, "unknown collective 'allfoo'"},
      {{"allreduce", "-n", "abc"}, "-n takes a whole number"},
      {{"allreduce", "-n", "-3"}, "not '-3'"},
      {{"allreduce", "-n", "3x"}, "not '3x'"},
      {{"allreduce", "-n", ""}, "-n takes"},
      {{"allreduce", "--iters", "1e3"}, "--iters takes a whole number"},
      {{"allreduce", "-n", "99999999999999999999"}, "-n takes"},
      {{"allreduce", "-w", "-5"}, "-w takes a whole number from 0"},
      {{"allreduce", "-c", "x"}, "-c takes"},
      {{"allreduce", "-c", "-1"}, "-c takes"},
      {{"allreduce", "-o", "sums"}, "unknown op 'sums'"},
      {{"allreduce", "-d", "float128"}, "unknown datatype 'float128'"},
      {{"allreduce", "-b", "4Q"}, "-b takes a size"},
      {{"allreduce", "-e", "1MiB"}, "-e takes a size"},
      {{"allreduce", "-b", "-4"}, "-b takes a size"},
      {{"allreduce", "-e", "1.5M"}, "-e takes a size"},
      {{"allreduce", "-b", "8", "-e", "4"}, "-b 8 is above -e 4"},
      {{"allreduce", "-b", "4", "-e", "8", "-f", "0.5"}, "-f takes a factor of 1 or more"},
      {{"allreduce", "-f", "nan"}, "-f takes"},
      {{"allreduce", "-b", "4", "-e", "8", "-f", "1"}, "-f 1 needs -i"},
      {{"allreduce", "-b", "4", "-e", "8", "-f", "2", "-i", "4"}, "-f and -i both given"},
      {{"allreduce", "-i", "0"}, "-i takes a size above 0"},
      {{"allreduce", "-r", "-1"}, "-r takes a rank"},
      {{"allreduce", "-r", "65536"}, "-r takes a rank"},
      {{"allreduce", "-z", "2"}, "-z takes 0 or 1"},
      {{"allreduce", "-a", "4"}, "-a takes 0 (rank 0)"},
      {{"allreduce", "-a", "max"}, "-a takes"},
      {{"allreduce", "-T", "-1"}, "-T takes a number of seconds"},
      {{"allreduce", "-T", "soon"}, "-T takes"},
      {{"allreduce", "-t", "2"}, "-t takes only 1"},
      {{"allreduce", "-g", "8"}, "-g takes only 1"},
      {{"allreduce", "-m", "4"}, "-m takes only 1"},
      {{"allreduce", "-q"}, "unknown option '-q'"},
      {{"allreduce", "--bogus"}, "unknown or ambiguous option '--bogus'"},
      {{"allreduce", "--m", "1"}, "ambiguous option '--m'"},  // minbytes, maxbytes, memory_report
      {{"allreduce", "--help=1"}, "option '--help' takes no value"},
      {{"allreduce", "-n"}, "option '-n' needs a value"},
      {{"allreduce", "--iters"}, "option '--iters' needs a value"},
      {{"allreduce", "--algorithm"}, "option '--algorithm' needs a value"},
      {{"allreduce", "--algorithm="}, "--algorithm takes an algorithm's name"},
      {{"allreduce", "--time-per-size", "0"}, "--time-per-size takes a number of seconds above 0"},
      {{"allreduce", "--buffers", "gpu"}, "--buffers takes host, device or registered, not 'gpu'"},
      // -M was ringreduce-perf's host/device switch; in nccl-tests it is --memory_report.
      {{"allreduce", "-M", "device"}, "--buffers device"},
      {{"allreduce", "-G", "1"}, "-G (nccl-tests' --cudagraph) is not supported"},
      {{"allreduce", "--wire", "fp4"}, "--wire takes a wire format: none, bf16, f16, fp8e4m3"},
      {{"allreduce", "--calibrate", "f"}, "--calibrate FILE takes no collective"},
      {{"--calibrate", "f", "-n", "3"}, "--calibrate FILE takes no collective and no other"},
  };
  for (const auto& [args, want] : cases) {
    const auto p = perf_parse(args);
    EXPECT_EQ(p.kind, perf::Parsed::Kind::usage_error) << joined(args);
    EXPECT_NE(p.error.find(want), std::string::npos)
        << joined(args) << "\n  got: " << p.error << "\n  want: " << want;
    EXPECT_EQ(p.error.find('\n'), std::string::npos) << "one line: " << p.error;
  }
}

TEST(PerfArgs, HelpAndVersionWinOverTheRest) {
  EXPECT_EQ(perf_parse({"-h"}).kind, perf::Parsed::Kind::help);
  EXPECT_EQ(perf_parse({"--help"}).kind, perf::Parsed::Kind::help);
  EXPECT_EQ(perf_parse({"allreduce", "-b", "4", "--help"}).kind, perf::Parsed::Kind::help);
  EXPECT_EQ(perf_parse({"--version"}).kind, perf::Parsed::Kind::version);
  EXPECT_EQ(perf_parse({"allreduce", "--version"}).kind, perf::Parsed::Kind::version);
  EXPECT_NE(std::string(perf::kUsage).find("-a, --average"), std::string::npos);
}

TEST(PerfArgs, TheCallersArgvIsLeftInItsOrder) {
  // getopt_long moves operands after the options; it must do so on a copy.
  std::vector<std::string> args = {"ringreduce-perf", "allreduce", "-n", "3", "-w", "1"};
  std::vector<const char*> argv;
  for (const auto& a : args) argv.push_back(a.c_str());
  const std::vector<const char*> before = argv;
  argv.push_back(nullptr);
  ASSERT_EQ(perf::parse_args(static_cast<int>(args.size()), argv.data()).kind,
            perf::Parsed::Kind::run);
  for (size_t i = 0; i < before.size(); ++i) EXPECT_EQ(argv[i], before[i]) << i;
}

TEST(RingrunArgs, NpIsMpirunsSpellingOfN) {
  for (const auto& args : {std::vector<std::string>{"-np", "4", "prog"},
                           {"--np", "4", "prog"},
                           {"--np=4", "prog"},
                           {"-n", "4", "prog"}}) {
    const auto p = ringrun_parse(args);
    ASSERT_EQ(p.kind, ringrun::Parsed::Kind::run) << joined(args) << p.error;
    EXPECT_EQ(p.args.n, 4) << joined(args);
    EXPECT_EQ(p.args.command, std::vector<std::string>{"prog"});
  }
  // After the program, -np and --version are the program's.
  const auto p = ringrun_parse({"-np", "2", "prog", "-np", "7", "--version"});
  ASSERT_EQ(p.kind, ringrun::Parsed::Kind::run) << p.error;
  EXPECT_EQ(p.args.n, 2);
  EXPECT_EQ(p.args.command, (std::vector<std::string>{"prog", "-np", "7", "--version"}));

  for (const auto& [args, want] : std::vector<std::pair<std::vector<std::string>, std::string>>{
           {{"-np"}, "-n needs a value"},
           {{"-np", "0", "prog"}, "-n must be an integer from 1 to 1024, not '0'"},
           {{"-np", "x", "prog"}, "not 'x'"},
           {{"-np", "-2", "prog"}, "not '-2'"},
           {{"-np2", "prog"}, "not 'p2'"},  // -nV is -n's attached form: "p2" is no count
       }) {
    const auto q = ringrun_parse(args);
    EXPECT_EQ(q.kind, ringrun::Parsed::Kind::usage_error) << joined(args);
    EXPECT_NE(q.error.find(want), std::string::npos) << joined(args) << "\n  got: " << q.error;
  }
}

TEST(RingrunArgs, Version) {
  EXPECT_EQ(ringrun_parse({"--version"}).kind, ringrun::Parsed::Kind::version);
  EXPECT_EQ(ringrun_parse({"-n", "2", "--version"}).kind, ringrun::Parsed::Kind::version);
  EXPECT_NE(std::string(ringrun::kUsage).find("-np N"), std::string::npos);
}

// ---- the built tools ------------------------------------------------------------------------

struct Ran {
  int code = -1;  // exit status, 128 + signal if killed
  std::string out, err;
};

// Runs a tool with stdout and stderr captured, killed (SIGKILL) if it takes beyond 20 s.
Ran run_tool(const char* path, std::vector<std::string> args) {
  args.insert(args.begin(), path);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  int out[2], err[2];
  if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, path, &fa, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  ::close(out[1]);
  ::close(err[1]);
  Ran r;
  if (rc != 0) {
    ::close(out[0]);
    ::close(err[0]);
    r.err = std::string("posix_spawn: ") + std::strerror(rc);
    return r;
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  pollfd fds[2] = {{out[0], POLLIN, 0}, {err[0], POLLIN, 0}};
  bool killed = false;
  while (fds[0].fd >= 0 || fds[1].fd >= 0) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                          deadline - std::chrono::steady_clock::now())
                          .count();
    if (left <= 0) {
      ::kill(pid, SIGKILL);
      killed = true;
      break;
    }
    if (::poll(fds, 2, static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[4096];
      const ssize_t n = ::read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        (i == 0 ? r.out : r.err).append(buf, static_cast<size_t>(n));
      } else {
        ::close(fds[i].fd);
        fds[i].fd = -1;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) ::close(f.fd);
  int status = 0;
  ::waitpid(pid, &status, 0);
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  EXPECT_FALSE(killed) << path << " took beyond 20 s";
  return r;
}

TEST(ToolBinaries, HelpGoesToStdoutAndExits0) {
  for (const char* flag : {"-h", "--help"}) {
    const Ran r = run_tool(PERF_PATH, {flag});
    EXPECT_EQ(r.code, 0) << flag << r.err;
    EXPECT_EQ(r.out.rfind("usage: ringreduce-perf", 0), 0u) << r.out;
    EXPECT_EQ(r.err, "");
  }
  for (const char* tool : {RINGRUN_PATH, STORE_PATH}) {
    const Ran r = run_tool(tool, {"--help"});
    EXPECT_EQ(r.code, 0) << tool << r.err;
    EXPECT_EQ(r.out.rfind("usage: ", 0), 0u) << r.out;
  }
}

TEST(ToolBinaries, VersionNamesTheToolAndTheRelease) {
  const std::pair<const char*, const char*> tools[] = {
      {PERF_PATH, "ringreduce-perf"}, {RINGRUN_PATH, "ringrun"}, {STORE_PATH, "ringreduce-store"}};
  for (const auto& [path, name] : tools) {
    const Ran r = run_tool(path, {"--version"});
    EXPECT_EQ(r.code, 0) << name << r.err;
    EXPECT_EQ(r.out, std::string(name) + " " + RINGREDUCE_VERSION_STRING + "\n");
    EXPECT_EQ(r.err, "");
  }
}

TEST(ToolBinaries, PerfBadUsageExits2WithTheReasonAndTheUsage) {
  const std::vector<std::vector<std::string>> cases = {{},
                                                       {"--bogus"},
                                                       {"allreduce", "-n", "abc"},
                                                       {"allreduce", "-c", "x"},
                                                       {"allreduce", "-w", "-5"}};
  for (const auto& args : cases) {
    const Ran r = run_tool(PERF_PATH, args);
    EXPECT_EQ(r.code, 2) << joined(args) << r.err;
    EXPECT_EQ(r.err.rfind("ringreduce-perf: ", 0), 0u) << r.err;
    EXPECT_NE(r.err.find("usage: ringreduce-perf"), std::string::npos) << r.err;
    EXPECT_EQ(r.out, "");
  }
}

}  // namespace
