// Runs the built ringrun on rank_helper and checks what a user of the launcher relies on: the
// environment each rank sees, whole prefixed lines, exit statuses, signal forwarding, timeouts,
// the grace before SIGKILL, that no process outlives ringrun, that the store it hosts works, and
// that two ringruns (--nnodes 2) make one job.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#ifndef RINGRUN_PATH
#error "RINGRUN_PATH must name the ringrun binary under test"
#endif
#ifndef RANK_HELPER_PATH
#error "RANK_HELPER_PATH must name the rank_helper binary"
#endif

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// A ringrun process with its stdout and stderr captured. Every wait is bounded; the destructor
// SIGKILLs a ringrun that is still running (its ranks follow through PR_SET_PDEATHSIG).
class Ringrun {
 public:
  explicit Ringrun(std::vector<std::string> args) {
    args.insert(args.begin(), RINGRUN_PATH);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    int out[2], err[2];
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0) std::abort();
    pid_t parent = ::getpid();
    start_ = Clock::now();
    pid_ = ::fork();
    if (pid_ == 0) {
      // If this test dies (ctest timeout), ringrun and hence its ranks go too.
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent) ::_exit(127);
      ::dup2(out[1], 1);
      ::dup2(err[1], 2);
      ::execv(argv[0], argv.data());
      ::_exit(127);
    }
    ::close(out[1]);
    ::close(err[1]);
    out_fd_ = out[0];
    err_fd_ = err[0];
    pidfd_ = static_cast<int>(::syscall(SYS_pidfd_open, pid_, 0));
  }

  ~Ringrun() {
    if (!exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : {out_fd_, err_fd_, pidfd_})
      if (fd >= 0) ::close(fd);
  }

  Ringrun(const Ringrun&) = delete;
  Ringrun& operator=(const Ringrun&) = delete;

  pid_t pid() const { return pid_; }
  const std::string& out() const { return out_; }
  const std::string& err() const { return err_; }
  bool exited() const { return exited_; }
  // Exit code, or 128 + signal if ringrun itself was killed.
  int code() const { return WIFEXITED(status_) ? WEXITSTATUS(status_) : 128 + WTERMSIG(status_); }
  // Seconds from start to exit.
  double seconds() const { return std::chrono::duration<double>(end_ - start_).count(); }

  // Collects output until pred() holds or timeout passes; returns pred().
  bool wait_for(const std::function<bool()>& pred, std::chrono::milliseconds timeout) {
    auto until = Clock::now() + timeout;
    while (!pred()) {
      if (Clock::now() >= until || !step(until)) return pred();
    }
    return true;
  }

  // Waits for exit and EOF on both pipes; false (and SIGKILL) if that takes beyond timeout.
  bool finish(std::chrono::milliseconds timeout) {
    bool done = wait_for([&] { return exited_ && out_fd_ < 0 && err_fd_ < 0; }, timeout);
    if (!done && !exited_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, &status_, 0);
      exited_ = true;
    }
    return done;
  }

  // Counts occurrences of text in stdout.
  int count_out(const std::string& text) const {
    int n = 0;
    for (size_t at = out_.find(text); at != std::string::npos; at = out_.find(text, at + 1)) ++n;
    return n;
  }

 private:
  // One poll over the pipes and the pidfd; false when nothing is left to wait for.
  bool step(Clock::time_point until) {
    std::vector<pollfd> fds;
    for (int fd : {out_fd_, err_fd_}) fds.push_back({fd, POLLIN, 0});
    fds.push_back({exited_ ? -1 : pidfd_, POLLIN, 0});
    if (out_fd_ < 0 && err_fd_ < 0 && exited_) return false;
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(until - Clock::now()).count();
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(ms, 0) + 1));
    if (rc < 0) return errno == EINTR;
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || fds[i].revents == 0) continue;
      char buf[65536];
      ssize_t n = ::read(fds[i].fd, buf, sizeof(buf));
      int& fd = i == 0 ? out_fd_ : err_fd_;
      if (n > 0) {
        (i == 0 ? out_ : err_).append(buf, static_cast<size_t>(n));
      } else {
        ::close(fd);
        fd = -1;
      }
    }
    if (!exited_ && fds[2].revents != 0) {
      ::waitpid(pid_, &status_, 0);
      end_ = Clock::now();
      exited_ = true;
    }
    return true;
  }

  pid_t pid_ = -1;
  int out_fd_ = -1, err_fd_ = -1, pidfd_ = -1;
  std::string out_, err_;
  int status_ = 0;
  bool exited_ = false;
  Clock::time_point start_, end_{};
};

std::vector<std::string> helper(std::vector<std::string> args) {
  args.insert(args.begin(), RANK_HELPER_PATH);
  return args;
}

std::vector<std::string> ringrun_args(int n, std::vector<std::string> helper_args,
                                      std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"-n", std::to_string(n)};
  a.insert(a.end(), extra.begin(), extra.end());
  a.push_back("--");
  auto h = helper(std::move(helper_args));
  a.insert(a.end(), h.begin(), h.end());
  return a;
}

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) out.push_back(line);
  return out;
}

bool all_digits(const std::string& s) {
  return !s.empty() && s.find_first_not_of("0123456789") == std::string::npos;
}

// Splits "[RANK] REST"; false if the line does not start with a rank prefix. (No std::regex: GCC
// 12 warns inside it under the sanitizer builds, and -Werror turns that into a failure.)
bool split_prefix(const std::string& line, int* rank, std::string* rest) {
  if (line.empty() || line[0] != '[') return false;
  size_t close = line.find("] ");
  if (close == std::string::npos || !all_digits(line.substr(1, close - 1))) return false;
  *rank = std::stoi(line.substr(1, close - 1));
  *rest = line.substr(close + 2);
  return true;
}

// Every "[r] KEY=NUMBER" line of the output, as pids.
std::vector<pid_t> pids_named(const std::string& out, const std::string& key) {
  std::vector<pid_t> pids;
  for (const auto& line : lines_of(out)) {
    int rank;
    std::string rest;
    if (!split_prefix(line, &rank, &rest) || rest.rfind(key + "=", 0) != 0) continue;
    std::string value = rest.substr(key.size() + 1);
    if (all_digits(value)) pids.push_back(std::stoi(value));
  }
  return pids;
}

// Alive means not yet exited: a zombie waiting for whichever process reaps orphans is dead.
bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string content;
  if (!std::getline(stat, content)) return false;
  auto close_paren = content.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < content.size() &&
         content[close_paren + 2] != 'Z' && content[close_paren + 2] != 'X';
}

// Waits (bounded) until none of pids is alive; returns those still alive after the limit.
std::vector<pid_t> survivors(const std::vector<pid_t>& pids, std::chrono::milliseconds limit) {
  auto until = Clock::now() + limit;
  for (;;) {
    std::vector<pid_t> left;
    for (pid_t p : pids)
      if (alive(p)) left.push_back(p);
    if (left.empty() || Clock::now() >= until) return left;
    ::poll(nullptr, 0, 20);
  }
}

TEST(Ringrun, EveryRankSeesItsEnvironment) {
  Ringrun r(ringrun_args(4, {"env"}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();
  std::set<int> ranks;
  std::set<std::string> ports;
  for (const auto& line : lines_of(r.out())) {
    int rank;
    std::string rest;
    ASSERT_TRUE(split_prefix(line, &rank, &rest)) << line;
    std::map<std::string, std::string> vars;
    std::istringstream words(rest);
    for (std::string w; words >> w;) vars[w.substr(0, w.find('='))] = w.substr(w.find('=') + 1);
    EXPECT_EQ(vars.size(), 6u) << line;
    EXPECT_EQ(vars["rank"], std::to_string(rank)) << line;
    EXPECT_EQ(vars["world"], "4") << line;
    EXPECT_EQ(vars["local_rank"], std::to_string(rank)) << line;
    EXPECT_EQ(vars["local_size"], "4") << line;
    EXPECT_EQ(vars["store_server"], "0") << line;
    const std::string host = "127.0.0.1:";
    ASSERT_EQ(vars["addr"].rfind(host, 0), 0u) << line;
    std::string port = vars["addr"].substr(host.size());
    ASSERT_TRUE(all_digits(port)) << line;
    EXPECT_GT(std::stoi(port), 0);
    ranks.insert(rank);
    ports.insert(port);
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2, 3}));
  EXPECT_EQ(ports.size(), 1u);
}

TEST(Ringrun, InheritedRankVariablesAreReplaced) {
  // A ringrun started from inside another ringrun job must not leak the outer job's values.
  ::setenv("RINGREDUCE_RANK", "77", 1);
  ::setenv("RINGREDUCE_STORE_SERVER", "1", 1);
  Ringrun r(ringrun_args(2, {"env"}));
  ::unsetenv("RINGREDUCE_RANK");
  ::unsetenv("RINGREDUCE_STORE_SERVER");
  ASSERT_TRUE(r.finish(20s));
  EXPECT_EQ(r.code(), 0) << r.err();
  EXPECT_EQ(r.count_out("rank=77"), 0) << r.out();
  EXPECT_EQ(r.count_out("store_server=0"), 2) << r.out();
}

TEST(Ringrun, ManyRanksStart) {
  Ringrun r(ringrun_args(64, {"env"}));
  ASSERT_TRUE(r.finish(40s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();
  EXPECT_EQ(lines_of(r.out()).size(), 64u);
  EXPECT_EQ(r.count_out("world=64"), 64);
}

// Every output line must be exactly one line some rank wrote, with that rank's prefix, and each
// rank's lines must arrive complete and in order.
void check_lines(const std::string& text, int ranks, int lines, const std::string& lead) {
  std::map<int, int> next;
  for (const auto& line : lines_of(text)) {
    int r;
    std::string rest;
    ASSERT_TRUE(split_prefix(line, &r, &rest)) << "mangled line: " << line.substr(0, 200);
    ASSERT_TRUE(r >= 0 && r < ranks) << line.substr(0, 200);
    // Each rank's lines arrive in order, so the next line of rank r is known exactly.
    int j = next[r];
    ASSERT_LT(j, lines) << "rank " << r << " wrote too many lines: " << line.substr(0, 200);
    std::string want =
        lead + "rank " + std::to_string(r) + " line " + std::to_string(j) + " " +
        std::string(static_cast<size_t>(j % 50) * 7, static_cast<char>('a' + j % 26));
    ASSERT_EQ(rest, want) << "rank " << r << " line " << j;
    next[r] = j + 1;
  }
  for (int r = 0; r < ranks; ++r) EXPECT_EQ(next[r], lines) << "rank " << r;
}

TEST(Ringrun, LinesArePrefixedAndNeverInterleaved) {
  const int kLines = 3000;
  Ringrun r(ringrun_args(4, {"lines", std::to_string(kLines)}));
  ASSERT_TRUE(r.finish(40s)) << r.err().substr(0, 2000);
  EXPECT_EQ(r.code(), 0);
  check_lines(r.out(), 4, kLines, "");
  check_lines(r.err(), 4, kLines, "err ");
}

TEST(Ringrun, PartialLastLineIsFlushedAtEof) {
  Ringrun r(ringrun_args(3, {"partial"}));
  ASSERT_TRUE(r.finish(20s));
  EXPECT_EQ(r.code(), 0) << r.err();
  auto out = lines_of(r.out());
  auto err = lines_of(r.err());
  std::multiset<std::string> got_out(out.begin(), out.end()), got_err(err.begin(), err.end());
  std::multiset<std::string> want_out, want_err;
  for (int i = 0; i < 3; ++i) {
    std::string p = "[" + std::to_string(i) + "] ";
    want_out.insert(p + "first line");
    want_out.insert(p + "rank " + std::to_string(i) + " partial");
    want_err.insert(p + "rank " + std::to_string(i) + " err-partial");
  }
  EXPECT_EQ(got_out, want_out) << r.out();
  EXPECT_EQ(got_err, want_err) << r.err();
  EXPECT_EQ(r.out().back(), '\n');
}

TEST(Ringrun, OverlongLinesAreSplitIntoPrefixedPieces) {
  // ringrun holds at most 64 KiB of an unfinished line per stream; a longer one comes out in
  // pieces, each a prefixed line of its own, and nothing is lost.
  const int kBytes = 300000;
  Ringrun r(ringrun_args(2, {"longline", std::to_string(kBytes)}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();
  std::map<int, std::string> joined;
  std::map<int, int> pieces;
  for (const auto& line : lines_of(r.out())) {
    ASSERT_GE(line.size(), 4u);
    ASSERT_EQ(line[0], '[') << line.substr(0, 80);
    int rank = line[1] - '0';
    ASSERT_EQ(line.substr(2, 2), "] ") << line.substr(0, 80);
    EXPECT_LE(line.size(), 4u + 64 * 1024);
    if (line.substr(4) == "end") continue;
    joined[rank] += line.substr(4);
    ++pieces[rank];
  }
  std::string want;
  for (int i = 0; i < kBytes; ++i) want.push_back(static_cast<char>('0' + i % 10));
  for (int rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(joined[rank], want) << "rank " << rank;
    EXPECT_GE(pieces[rank], kBytes / (64 * 1024)) << "rank " << rank;
  }
  EXPECT_EQ(r.count_out("] end\n"), 2);
}

TEST(Ringrun, FailingRankExitCodeIsPropagatedAndOthersAreKilled) {
  Ringrun r(ringrun_args(4, {"fail", "2", "3", "--grandchild"}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 3) << r.err();
  EXPECT_NE(r.err().find("ringrun: rank 2 exited with code 3\n"), std::string::npos) << r.err();
  // The others sleep 60 s; they must be torn down promptly (0.5 s until rank 2 fails).
  EXPECT_LT(r.seconds(), 5.0);
  auto pids = pids_named(r.out(), "pid");
  auto grandchildren = pids_named(r.out(), "grandchild");
  ASSERT_EQ(pids.size(), 4u) << r.out();
  ASSERT_EQ(grandchildren.size(), 4u) << r.out();
  EXPECT_TRUE(survivors(pids, 0ms).empty()) << "ranks outlived ringrun";
  // Grandchildren are orphans reaped by init: allow a moment for the kernel.
  EXPECT_TRUE(survivors(grandchildren, 2s).empty()) << "a rank's child outlived ringrun";
}

TEST(Ringrun, RankKilledBySignalGives128PlusSignal) {
  Ringrun r(ringrun_args(3, {"die", "1", std::to_string(SIGUSR1)}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 128 + SIGUSR1) << r.err();
  EXPECT_NE(r.err().find("ringrun: rank 1 killed by signal " + std::to_string(SIGUSR1)),
            std::string::npos)
      << r.err();
  EXPECT_LT(r.seconds(), 5.0);
  auto pids = pids_named(r.out(), "pid");
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_TRUE(survivors(pids, 0ms).empty());
}

// --elastic: a rank killed by a signal, or failing, does not end the job; the others finish by
// themselves, each loss is named when it happens and at the end.
TEST(Ringrun, ElasticKeepsTheOthersRunningAndNamesWhoDied) {
  Ringrun r(ringrun_args(3, {"die", "1", std::to_string(SIGKILL), "1.5"}, {"--elastic"}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();  // the survivors finished the job
  EXPECT_EQ(r.count_out("] done\n"), 2) << r.out();
  EXPECT_NE(r.err().find("ringrun: rank 1 killed by signal 9 (SIGKILL); --elastic: the other "
                         "ranks go on"),
            std::string::npos)
      << r.err();
  EXPECT_NE(r.err().find("ringrun: --elastic: the job ended with 1 rank(s) lost: rank 1 killed "
                         "by signal 9 (SIGKILL) after "),
            std::string::npos)
      << r.err();
  EXPECT_GT(r.seconds(), 1.4);
  // A rank that fails by itself is the job's exit status, after the others finish.
  Ringrun f(ringrun_args(3, {"fail", "2", "3", "1"}, {"--elastic"}));
  ASSERT_TRUE(f.finish(20s)) << f.err();
  EXPECT_EQ(f.code(), 3) << f.err();
  EXPECT_EQ(f.count_out("] done\n"), 2) << f.out();
  EXPECT_NE(f.err().find("rank 2 exited with code 3"), std::string::npos) << f.err();
}

TEST(Ringrun, SigtermIsForwardedToEveryRank) {
  Ringrun r(ringrun_args(3, {"on-term"}));
  ASSERT_TRUE(r.wait_for([&] { return r.count_out("ready") == 3; }, 15s)) << r.out() << r.err();
  ::kill(r.pid(), SIGTERM);
  ASSERT_TRUE(r.finish(10s)) << r.err();
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(r.count_out("[" + std::to_string(i) + "] got SIGTERM\n"), 1) << r.out();
  // The ranks exited 0 after the forwarded signal; ringrun reports that it was terminated.
  EXPECT_EQ(r.code(), 128 + SIGTERM) << r.err();
  EXPECT_LT(r.seconds(), 10.0);
}

TEST(Ringrun, SigtermKillsDefaultRanks) {
  Ringrun r(ringrun_args(2, {"sleep", "60"}));
  ASSERT_TRUE(r.wait_for([&] { return r.count_out("ready") == 2; }, 15s)) << r.err();
  ::kill(r.pid(), SIGTERM);
  ASSERT_TRUE(r.finish(10s)) << r.err();
  EXPECT_EQ(r.code(), 128 + SIGTERM) << r.err();
  EXPECT_TRUE(survivors(pids_named(r.out(), "pid"), 0ms).empty());
}

TEST(Ringrun, SecondSigintEscalatesToSigkill) {
  Ringrun r(ringrun_args(2, {"on-int"}));
  ASSERT_TRUE(r.wait_for([&] { return r.count_out("ready") == 2; }, 15s)) << r.err();
  ::kill(r.pid(), SIGINT);
  // The ranks catch SIGINT and carry on, so only the second one can end the job.
  ASSERT_TRUE(r.wait_for([&] { return r.count_out("got SIGINT") == 2; }, 10s)) << r.out();
  auto t0 = Clock::now();
  ::kill(r.pid(), SIGINT);
  ASSERT_TRUE(r.finish(10s)) << r.err();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
  EXPECT_EQ(r.code(), 128 + SIGINT) << r.err();
  EXPECT_TRUE(survivors(pids_named(r.out(), "pid"), 0ms).empty());
}

TEST(Ringrun, TimeoutKillsTheJobAndExits124) {
  Ringrun r(ringrun_args(2, {"sleep", "60"}, {"--timeout", "1"}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 124) << r.err();
  EXPECT_NE(r.err().find("ringrun: timeout after 1 s, killing ranks 0-1"), std::string::npos)
      << r.err();
  EXPECT_GE(r.seconds(), 1.0);
  EXPECT_LT(r.seconds(), 4.0);
  EXPECT_TRUE(survivors(pids_named(r.out(), "pid"), 0ms).empty());
}

TEST(Ringrun, TimeoutDoesNotFireForAShortJob) {
  Ringrun r(ringrun_args(2, {"sleep", "0.2"}, {"--timeout=30"}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();
}

TEST(Ringrun, RankIgnoringSigtermIsKilledAfterGrace) {
  Ringrun r(ringrun_args(3, {"fail", "0", "5", "--ignore-term"}));
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 5) << r.err();
  EXPECT_NE(r.err().find("ringrun: ranks 1-2 still running 3 s after SIGTERM, sending SIGKILL"),
            std::string::npos)
      << r.err();
  // 0.5 s until rank 0 fails, then the 3 s grace.
  EXPECT_GE(r.seconds(), 3.4);
  EXPECT_LT(r.seconds(), 6.0);
  auto pids = pids_named(r.out(), "pid");
  EXPECT_EQ(pids.size(), 3u);
  EXPECT_TRUE(survivors(pids, 0ms).empty());
}

TEST(Ringrun, RanksDieWhenRingrunIsKilledHard) {
  Ringrun r(ringrun_args(3, {"sleep", "60", "--ignore-term"}));
  ASSERT_TRUE(r.wait_for([&] { return r.count_out("ready") == 3; }, 15s)) << r.err();
  auto pids = pids_named(r.out(), "pid");
  ASSERT_EQ(pids.size(), 3u);
  ::kill(r.pid(), SIGKILL);
  r.finish(5s);
  EXPECT_TRUE(survivors(pids, 3s).empty()) << "PR_SET_PDEATHSIG did not take the ranks down";
}

TEST(Ringrun, StoreAddressWorksForABarrier) {
  Ringrun r(ringrun_args(4, {"barrier"}));
  ASSERT_TRUE(r.finish(40s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.out() << r.err();
  std::set<std::string> arrived;
  for (int i = 1; i <= 4; ++i) EXPECT_EQ(r.count_out("arrived=" + std::to_string(i) + "\n"), 1);
  EXPECT_EQ(r.count_out("barrier passed total=4\n"), 4) << r.out();
}

TEST(Ringrun, BadUsageExits2) {
  const std::vector<std::vector<std::string>> cases = {
      {},
      {"-n", "0", RANK_HELPER_PATH, "env"},
      {"-n", "1025", RANK_HELPER_PATH, "env"},
      {"-n", "x", RANK_HELPER_PATH, "env"},
      {"-n", "-1", RANK_HELPER_PATH, "env"},
      {"-n"},
      {"-n", "2"},
      {"-n", "2", "--"},
      {RANK_HELPER_PATH, "env"},
      {"-n", "2", "--bogus", RANK_HELPER_PATH, "env"},
      {"-n", "2", "--timeout", "0", RANK_HELPER_PATH, "env"},
      {"-n", "2", "--timeout", "soon", RANK_HELPER_PATH, "env"},
  };
  for (const auto& args : cases) {
    Ringrun r(args);
    ASSERT_TRUE(r.finish(10s));
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    EXPECT_EQ(r.code(), 2) << joined << "\n" << r.err();
    EXPECT_NE(r.err().find("usage: ringrun"), std::string::npos) << joined;
  }
}

TEST(Ringrun, AcceptsBoundaryRankCountsAndHelp) {
  Ringrun one({"-n1", RANK_HELPER_PATH, "env"});
  ASSERT_TRUE(one.finish(10s));
  EXPECT_EQ(one.code(), 0) << one.err();
  EXPECT_EQ(one.out().rfind("[0] rank=0 world=1 ", 0), 0u) << one.out();

  Ringrun help({"--help"});
  ASSERT_TRUE(help.finish(10s));
  EXPECT_EQ(help.code(), 0);
  EXPECT_NE(help.out().find("usage: ringrun"), std::string::npos);

  // mpirun's spelling of -n.
  Ringrun np({"-np", "2", RANK_HELPER_PATH, "env"});
  ASSERT_TRUE(np.finish(10s));
  EXPECT_EQ(np.code(), 0) << np.err();
  EXPECT_EQ(np.count_out(" world=2 "), 2) << np.out();

  Ringrun version({"--version"});
  ASSERT_TRUE(version.finish(10s));
  EXPECT_EQ(version.code(), 0);
  EXPECT_EQ(version.out().rfind("ringrun ", 0), 0u) << version.out();
}

TEST(Ringrun, MissingProgramIsAClearError) {
  Ringrun r({"-n", "2", "ringrun-no-such-program-xyz"});
  ASSERT_TRUE(r.finish(10s));
  EXPECT_EQ(r.code(), 127);
  EXPECT_NE(r.err().find("ringrun: program 'ringrun-no-such-program-xyz' not found"),
            std::string::npos)
      << r.err();

  Ringrun path({"-n", "2", "/nonexistent/dir/prog"});
  ASSERT_TRUE(path.finish(10s));
  EXPECT_EQ(path.code(), 127);
  EXPECT_NE(path.err().find("/nonexistent/dir/prog"), std::string::npos) << path.err();

  Ringrun dir({"-n", "2", "/"});
  ASSERT_TRUE(dir.finish(10s));
  EXPECT_EQ(dir.code(), 126) << dir.err();
}

TEST(Ringrun, UnexecutableProgramIsAClearError) {
  // Executable bit set but not a valid binary: the execve in the rank fails, and ringrun must say
  // so, tear down any rank already started, and not hang.
  char path[] = "/tmp/ringrun_test_badexec_XXXXXX";
  int fd = ::mkstemp(path);
  ASSERT_GE(fd, 0);
  const char kJunk[] =
      "\x7f"
      "ELF not really";
  ASSERT_EQ(::write(fd, kJunk, sizeof(kJunk) - 1), static_cast<ssize_t>(sizeof(kJunk) - 1));
  ::close(fd);
  ::chmod(path, 0755);
  Ringrun r({"-n", "3", path});
  bool finished = r.finish(10s);
  ::unlink(path);
  ASSERT_TRUE(finished);
  EXPECT_EQ(r.code(), 126) << r.err();
  EXPECT_NE(r.err().find(std::string("ringrun: cannot execute '") + path + "' for rank 0"),
            std::string::npos)
      << r.err();
}

// A port nobody listens on right now: the kernel's pick for port 0, released at once. Another
// process may take it before ringrun binds it; the test that uses it retries then.
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return 0;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0 &&
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0)
    port = ntohs(a.sin_port);
  ::close(fd);
  return port;
}

// One ringrun of a --nnodes 2 job of 2 ranks per node, started with RINGREDUCE_HOST_ID naming
// its node so that the library treats the two as separate hosts (shared memory within a node,
// TCP between them), as on a real cluster.
std::unique_ptr<Ringrun> start_node(int node, int port, std::vector<std::string> helper_args) {
  const std::string host_id = "ringrun-test-node" + std::to_string(node);
  ::setenv("RINGREDUCE_HOST_ID", host_id.c_str(), 1);
  auto r = std::make_unique<Ringrun>(
      ringrun_args(2, std::move(helper_args),
                   {"--nnodes", "2", "--node-rank", std::to_string(node), "--master",
                    "127.0.0.1:" + std::to_string(port), "--timeout", "30"}));
  ::unsetenv("RINGREDUCE_HOST_ID");
  return r;
}

TEST(Ringrun, TwoNodesMakeOneJob) {
  // Node 1 starts first: its ranks must wait for node 0's store (the store client retries), as
  // on a cluster where the hosts start in any order.
  for (int attempt = 1;; ++attempt) {
    const int port = free_port();
    ASSERT_GT(port, 0);
    auto node1 = start_node(1, port, {"allreduce"});
    ::poll(nullptr, 0, 300);
    auto node0 = start_node(0, port, {"allreduce"});
    ASSERT_TRUE(node0->finish(40s)) << node0->err();
    if (node0->code() == 1 && node0->err().find("cannot listen") != std::string::npos &&
        attempt < 5)
      continue;  // someone took the port in between; node1 and its ranks are killed here
    ASSERT_TRUE(node1->finish(40s)) << node1->err();
    EXPECT_EQ(node0->code(), 0) << node0->out() << node0->err();
    EXPECT_EQ(node1->code(), 0) << node1->out() << node1->err();
    for (int rank = 0; rank < 4; ++rank) {
      const Ringrun& node = rank < 2 ? *node0 : *node1;
      const std::string want =
          "[" + std::to_string(rank) + "] allreduce ok rank=" + std::to_string(rank) + " world=4\n";
      EXPECT_EQ(node.count_out(want), 1) << node.out() << node.err();
    }
    break;
  }
}

TEST(Ringrun, NodeRanksGetGlobalRanksAndTheMastersAddress) {
  // Node 1 hosts no store: its ranks only need to be told where node 0's is, so this needs no
  // node 0. An IPv6 master: RINGREDUCE_ADDR as given, MASTER_ADDR bare as torchrun has it, and
  // MASTER_PORT next to the store's port, which torch's rank 0 binds itself.
  ::unsetenv("MASTER_PORT");
  Ringrun r(
      {"-n", "3", "--nnodes", "4", "--node-rank", "1", "--master", "[::1]:29500", "--", "sh", "-c",
       "echo RINGREDUCE $RINGREDUCE_RANK $RINGREDUCE_WORLD_SIZE $RINGREDUCE_LOCAL_RANK "
       "$RINGREDUCE_LOCAL_SIZE $RINGREDUCE_ADDR $RINGREDUCE_STORE_SERVER; "
       "echo TORCH $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR $MASTER_PORT"});
  ASSERT_TRUE(r.finish(20s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();
  for (int local = 0; local < 3; ++local) {
    const std::string g = std::to_string(3 + local), l = std::to_string(local);
    EXPECT_EQ(r.count_out("[" + g + "] RINGREDUCE " + g + " 12 " + l + " 3 [::1]:29500 0\n"), 1)
        << r.out();
    EXPECT_EQ(r.count_out("[" + g + "] TORCH " + g + " 12 " + l + " 3 ::1 29501\n"), 1) << r.out();
  }
  EXPECT_EQ(lines_of(r.out()).size(), 6u) << r.out();
}

TEST(Ringrun, NodeOptionsBadUsageExits2) {
  // Each case: the arguments before the program, and what the one-line message must name.
  const std::vector<std::pair<std::vector<std::string>, std::vector<std::string>>> cases = {
      {{"-n", "2", "--nnodes", "2", "--node-rank", "2", "--master", "127.0.0.1:29500"},
       {"--node-rank", "'2'"}},
      {{"-n", "2", "--node-rank", "1"}, {"--node-rank", "'1'"}},
      {{"-n", "2", "--nnodes", "2", "--node-rank", "1"}, {"--nnodes 2", "--master"}},
      {{"-n", "2", "--nnodes", "2", "--master", "127.0.0.1"}, {"--master", "'127.0.0.1'"}},
      {{"-n", "2", "--nnodes", "2", "--master", "127.0.0.1:0"}, {"--master", "'127.0.0.1:0'"}},
      {{"-n", "2", "--nnodes=2", "--master=[::1]"}, {"--master", "'[::1]'"}},
      {{"-n", "2", "--nnodes", "2", "--master", "host:port"}, {"--master", "host:port"}},
      {{"-n", "2", "--nnodes", "2", "--master", "[::1:29500"}, {"--master", "[::1:29500"}},
      {{"-n", "2", "--nnodes", "0"}, {"--nnodes", "'0'"}},
      {{"-n", "2", "--nnodes", "two"}, {"--nnodes", "'two'"}},
      {{"-n", "2", "--node-rank", "-1"}, {"--node-rank", "'-1'"}},
      {{"-n", "1024", "--nnodes", "65", "--master", "127.0.0.1:29500"},
       {"-n 1024", "--nnodes 65", "66560", "65536"}},
  };
  for (const auto& [args, names] : cases) {
    std::vector<std::string> argv = args;
    argv.push_back(RANK_HELPER_PATH);
    argv.push_back("env");
    std::string joined;
    for (const auto& a : args) joined += a + " ";
    Ringrun r(argv);
    ASSERT_TRUE(r.finish(10s)) << joined;
    EXPECT_EQ(r.code(), 2) << joined << "\n" << r.err();
    const std::string first = r.err().substr(0, r.err().find('\n'));
    EXPECT_EQ(first.rfind("ringrun: ", 0), 0u) << joined << "\n" << r.err();
    for (const auto& name : names)
      EXPECT_NE(first.find(name), std::string::npos) << joined << ": '" << name << "' not in\n"
                                                     << first;
    EXPECT_NE(r.err().find("usage: ringrun"), std::string::npos) << joined;
    EXPECT_EQ(r.out(), "") << joined;
  }
}

TEST(Ringrun, NodeOptionsAtTheirLimits) {
  // 65536 ranks is the largest world, here one on each of 65536 nodes; the last node's is 65535.
  // Only the environment is printed, so no node 0 and no store are needed.
  Ringrun r({"-n", "1", "--nnodes", "65536", "--node-rank", "65535", "--master", "localhost:65535",
             RANK_HELPER_PATH, "env"});
  ASSERT_TRUE(r.finish(10s)) << r.err();
  EXPECT_EQ(r.code(), 0) << r.err();
  EXPECT_EQ(r.out(),
            "[65535] rank=65535 world=65536 local_rank=0 local_size=1 addr=localhost:65535 "
            "store_server=0\n");
  // --nnodes 1 with an explicit node rank and master: a one-node job whose store listens there.
  const int port = free_port();
  ASSERT_GT(port, 0);
  Ringrun one({"-n", "2", "--nnodes", "1", "--node-rank", "0", "--master",
               "127.0.0.1:" + std::to_string(port), "--timeout", "30", RANK_HELPER_PATH,
               "barrier"});
  ASSERT_TRUE(one.finish(40s)) << one.err();
  // The port may have been taken in between; then the failure must say so.
  if (one.code() != 0)
    EXPECT_NE(one.err().find("cannot listen"), std::string::npos) << one.out() << one.err();
  else
    EXPECT_EQ(one.count_out("barrier passed total=2\n"), 2) << one.out();
}

}  // namespace
