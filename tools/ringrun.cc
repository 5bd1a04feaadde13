// ringrun: the launcher, for one host or for one host's share of a job over several.
//
//   ringrun -n N [--nnodes K --node-rank I --master HOST:PORT] [--timeout SECONDS]
//           [--bind core|none] [--elastic] [--store-stats] [--] program [args...]
//
// Starts N processes of program on this host, each told its place by RINGREDUCE_RANK,
// RINGREDUCE_WORLD_SIZE, RINGREDUCE_LOCAL_RANK, RINGREDUCE_LOCAL_SIZE and RINGREDUCE_ADDR (and
// torchrun's variables), and the ringrun of node 0 hosts the rendezvous TCP store itself
// (RINGREDUCE_STORE_SERVER=0 tells rank 0 not to).
//  * Alone (K = 1, no --master), the store listens on 127.0.0.1 port 0 and its real port is
//    handed to the ranks, so there is no window in which another process could take a port we
//    picked.
//  * Over K hosts, one ringrun runs on each, and node I's ranks are I*N .. I*N+N-1 of K*N. The
//    store's address must be known to every node in advance, hence --master: node 0 listens on
//    it, the other nodes start no store and their ranks connect to it, whichever starts first
//    (the ranks' store client retries until RINGREDUCE_TIMEOUT, see connect_with_retry in
//    rendezvous/tcp_store_client.cc). Each ringrun knows only its own ranks: a failure on one
//    node ends the others' ranks through the library (a lost peer, the store gone), not through
//    ringrun.
// The options and the usage text are in ringrun_args.{h,cc}; the ranks' output (the lines with
// their prefix) in ringrun_output.{h,cc}; what a rank's process gets (the program found, its
// environment and core, the child's set-up before exec) and what ringrun sets up for itself
// first (signals, limits) in ringrun_exec.{h,cc}. With --elastic a rank's failure does not end
// the job: it is named when it happens and again at the end.
//
// Invariants the rest of this file keeps:
//  * Every rank's stdout and stderr come back through a pipe and leave ringrun one whole line at
//    a time, prefixed "[rank] " with its global rank, with one write() per batch of whole lines:
//    since ringrun is the only writer, lines of different ranks never interleave mid-line.
//  * Each rank leads its own process group, so a signal to -pid reaches whatever it spawned.
//    Ranks that have exited stay unreaped zombies (waitid WNOWAIT) until the very end: a zombie
//    keeps its pid, hence its group id, from being reused, so signalling -pid can never hit an
//    unrelated process group.
//  * Signals reach ringrun only through a signalfd (they are blocked in every thread, the store's
//    included), so there is no async handler at all and every wake-up comes from one poll().
//  * Every wait is bounded: grace before SIGKILL, a limit on how long SIGKILLed ranks may take to
//    vanish, and a limit on draining output that descendants keep open after the ranks exited.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/fd.h"
#include "core/security.h"
#include "rendezvous/tcp_store.h"
#include "ringrun_args.h"
#include "ringrun_exec.h"
#include "ringrun_output.h"
#include "tool_version.h"

namespace {

using Clock = std::chrono::steady_clock;

using ringrun::Args;
using ringrun::ensure_standard_fds;
using ringrun::exec_child;
using ringrun::ExecPlan;
using ringrun::g_err;
using ringrun::g_out;
using ringrun::inherited_environment;
using ringrun::make_pipe;
using ringrun::prepare_launcher;
using ringrun::Pump;
using ringrun::pump;
using ringrun::rank_list;
using ringrun::resolve_program;
using ringrun::say;
using ringrun::signal_name;
using ringrun::Stream;
using ringrun::torch_master_port;
using ringrun::usable_cores;

// How long ranks get between SIGTERM and SIGKILL when ringrun tears the job down.
constexpr auto kGrace = std::chrono::seconds(3);
// How long SIGKILLed ranks may take to disappear before ringrun stops waiting for them (a process
// stuck in uninterruptible sleep cannot be hurried, and ringrun must not hang with it).
constexpr auto kKillWait = std::chrono::seconds(10);
// How long to keep forwarding output after every rank exited: descendants that escaped the
// process groups (setsid) could otherwise hold a pipe open forever.
constexpr auto kDrainWait = std::chrono::seconds(1);

struct Rank {
  int index = 0;         // local rank: where it is in ranks_, which core it gets
  int global = 0;        // RINGREDUCE_RANK: what the prefix and ringrun's messages call it
  pid_t pid = -1;        // also its process group id; -1 before fork or after reaping
  bool running = false;  // forked and not yet seen exiting
  Stream out, err;
};

// Parses the command line (ringrun_args.cc); returns the arguments, or an exit status: 0 after
// --help or --version, 2 after a usage error.
std::optional<Args> parse_args(int argc, char** argv, int* status) {
  ringrun::Parsed p = ringrun::parse_args(argc, argv);
  switch (p.kind) {
    case ringrun::Parsed::Kind::run:
      return std::move(p.args);
    case ringrun::Parsed::Kind::help:
      g_out.write(ringrun::kUsage);
      *status = 0;
      return std::nullopt;
    case ringrun::Parsed::Kind::version:
      g_out.write(ringreduce_tools::version_text("ringrun") + "\n");
      *status = 0;
      return std::nullopt;
    case ringrun::Parsed::Kind::usage_error:
      break;
  }
  g_err.write("ringrun: " + p.error + "\n" + ringrun::kUsage);
  *status = 2;
  return std::nullopt;
}

class Launcher {
 public:
  // store: the store ringrun hosts, or nullptr on a node other than 0, whose ranks use the one
  // at store_addr that node 0's ringrun hosts.
  Launcher(const Args& args, std::string path, ringreduce::rendezvous::TcpStoreServer* store,
           std::string store_addr, int signal_fd, const ExecPlan& plan_base)
      : args_(args),
        path_(std::move(path)),
        store_(store),
        store_addr_(std::move(store_addr)),
        signal_fd_(signal_fd),
        plan_(plan_base) {
    ranks_.resize(static_cast<size_t>(args.n));
    for (int i = 0; i < args.n; ++i) {
      ranks_[i].index = i;
      ranks_[i].global = args.first_rank() + i;
      ranks_[i].out.sink = &g_out;
      ranks_[i].err.sink = &g_err;
      prefixes_.push_back("[" + std::to_string(ranks_[i].global) + "] ");
    }
  }

  // The safety net for early exits (exceptions, a failed exec): nothing outlives ringrun.
  ~Launcher() {
    quiet_store();
    signal_all(SIGKILL);
    reap_all(std::chrono::seconds(2));
  }

  Launcher(const Launcher&) = delete;
  Launcher& operator=(const Launcher&) = delete;

  // Forks every rank. Returns 0, or the exit status if a rank could not be started.
  int start() {
    ringreduce::core::Fd devnull(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (!devnull.valid())
      throw std::runtime_error(std::string("/dev/null: ") + std::strerror(errno));

    std::vector<std::string> argv_storage = args_.command;
    std::vector<char*> argv;
    for (auto& a : argv_storage) argv.push_back(a.data());
    argv.push_back(nullptr);

    std::vector<std::string> env = inherited_environment();
    const std::string world = std::to_string(args_.world_size());
    env.push_back("RINGREDUCE_WORLD_SIZE=" + world);
    env.push_back("RINGREDUCE_LOCAL_SIZE=" + std::to_string(args_.n));
    env.push_back("RINGREDUCE_ADDR=" + store_addr_);
    env.push_back("RINGREDUCE_STORE_SERVER=0");
    env.push_back("WORLD_SIZE=" + world);
    env.push_back("LOCAL_WORLD_SIZE=" + std::to_string(args_.n));
    // torchrun passes an IPv6 MASTER_ADDR bare, without the brackets of --master.
    env.push_back("MASTER_ADDR=" + (args_.master ? args_.master_host : std::string("127.0.0.1")));
    env.push_back("MASTER_PORT=" + std::to_string(torch_master_port(args_)));
    size_t common = env.size();
    for (int i = 0; i < 4; ++i) env.emplace_back();

    // Each rank's close-on-exec status pipe, read once every rank is forked: EOF means its
    // execve succeeded, an errno that it did not. (Waiting for each exec before the next fork
    // made the launch wait for each child to be scheduled: 5 s for 256 ranks on two cores.)
    std::vector<ringreduce::core::Fd> statuses;
    for (Rank& r : ranks_) {
      env[common] = "RINGREDUCE_RANK=" + std::to_string(r.global);
      env[common + 1] = "RINGREDUCE_LOCAL_RANK=" + std::to_string(r.index);
      env[common + 2] = "RANK=" + std::to_string(r.global);
      env[common + 3] = "LOCAL_RANK=" + std::to_string(r.index);
      std::vector<char*> envp;
      for (auto& e : env) envp.push_back(e.data());
      envp.push_back(nullptr);

      ringreduce::core::Fd out_w, err_w, status_r, status_w;
      make_pipe(&r.out.fd, &out_w);
      make_pipe(&r.err.fd, &err_w);
      make_pipe(&status_r, &status_w);
      ::fcntl(r.out.fd.get(), F_SETFL, O_NONBLOCK);
      ::fcntl(r.err.fd.get(), F_SETFL, O_NONBLOCK);

      ExecPlan plan = plan_;
      plan.bind = args_.bind && !cores_.empty();
      if (plan.bind) {
        CPU_ZERO(&plan.cpus);
        CPU_SET(cores_[static_cast<size_t>(r.index) % cores_.size()], &plan.cpus);
      }
      plan.path = path_.c_str();
      plan.argv = argv.data();
      plan.stdin_fd = devnull.get();
      plan.stdout_fd = out_w.get();
      plan.stderr_fd = err_w.get();
      plan.error_fd = status_w.get();

      pid_t pid = ::fork();
      if (pid < 0) {
        say("fork failed for rank " + std::to_string(r.global) + ": " + std::strerror(errno));
        return 1;
      }
      if (pid == 0) exec_child(plan, envp.data());
      r.pid = pid;
      r.running = true;
      // Also set from this side, so that the group exists whichever process runs first.
      ::setpgid(pid, pid);
      out_w.reset();
      err_w.reset();
      status_w.reset();
      statuses.push_back(std::move(status_r));
    }
    // The child does nothing that can block before its execve, so these waits are short.
    for (size_t i = 0; i < statuses.size(); ++i) {
      int child_errno = 0;
      ssize_t n;
      do {
        n = ::read(statuses[i].get(), &child_errno, sizeof(child_errno));
      } while (n < 0 && errno == EINTR);
      if (n > 0) {
        say("cannot execute '" + args_.command[0] + "' for rank " +
            std::to_string(ranks_[i].global) + ": " + std::strerror(child_errno));
        return child_errno == ENOENT ? 127 : 126;
      }
    }
    if (args_.timeout_s) {
      timeout_at_ = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(*args_.timeout_s));
    }
    return 0;
  }

  // Runs the job to its end and returns ringrun's exit status.
  int run() {
    std::vector<pollfd> fds;
    std::vector<std::pair<Stream*, int>> streams;  // parallel to fds[1..]: stream, its rank
    for (;;) {
      auto now = Clock::now();
      if (running_count() == 0) {
        if (!drain_until_) {
          // Whatever the ranks left in their process groups goes with them.
          signal_all(SIGKILL);
          drain_until_ = now + kDrainWait;
        }
        if (open_streams() == 0 || now >= *drain_until_) break;
      }
      check_deadlines(now);
      if (gave_up_) break;

      fds.clear();
      streams.clear();
      fds.push_back({signal_fd_, POLLIN, 0});
      for (Rank& r : ranks_) {
        for (Stream* s : {&r.out, &r.err}) {
          if (!s->fd.valid()) continue;
          fds.push_back({s->fd.get(), POLLIN, 0});
          streams.emplace_back(s, r.index);
        }
      }
      int rc = ::poll(fds.data(), fds.size(), poll_timeout_ms(Clock::now()));
      if (rc < 0 && errno != EINTR)
        throw std::runtime_error(std::string("poll: ") + std::strerror(errno));
      if (rc <= 0) continue;
      if (fds[0].revents != 0) handle_signals();
      for (size_t i = 1; i < fds.size(); ++i) {
        auto [stream, rank] = streams[i - 1];
        // A stream may have been drained to EOF already when its rank's exit was handled.
        if (fds[i].revents != 0 && stream->fd.valid()) pump(*stream, prefixes_[rank]);
      }
    }
    // Output still held open by escaped descendants: emit what arrived, then stop listening.
    for (Rank& r : ranks_) {
      for (Stream* s : {&r.out, &r.err}) {
        if (s->fd.valid() && !s->pending.empty()) {
          s->sink->write(prefixes_[r.index] + s->pending + "\n");
          s->pending.clear();
        }
        s->fd.reset();
      }
    }
    reap_all(std::chrono::seconds(1));
    if (!failures_.empty()) {
      std::string all;
      for (const std::string& f : failures_) all += (all.empty() ? "" : "; ") + f;
      say("--elastic: the job ended with " + std::to_string(failures_.size()) +
          " rank(s) lost: " + all);
    }
    // Ranks killed by a signal count only when no rank exited by itself.
    if (args_.elastic && !exit_code_ && !exited_normally_ && first_signal_code_)
      return *first_signal_code_;
    if (exit_code_) return *exit_code_;
    if (interrupted_by_ != 0) return 128 + interrupted_by_;
    return 0;
  }

 private:
  enum class Phase { running, terminating, killing };

  void quiet_store() {
    if (store_ != nullptr) store_->quiet();
  }

  int running_count() const {
    int n = 0;
    for (const Rank& r : ranks_) n += r.running ? 1 : 0;
    return n;
  }

  int open_streams() const {
    int n = 0;
    for (const Rank& r : ranks_) n += (r.out.fd.valid() ? 1 : 0) + (r.err.fd.valid() ? 1 : 0);
    return n;
  }

  std::vector<int> running_ranks() const {
    std::vector<int> out;
    for (const Rank& r : ranks_)
      if (r.running) out.push_back(r.global);
    return out;
  }

  // Signals every rank's process group, and a running rank directly if it left its group. Groups
  // of exited ranks are signalled too: their zombies keep the group id reserved (see the top).
  void signal_all(int sig) {
    for (Rank& r : ranks_) {
      if (r.pid <= 0) continue;
      ::kill(-r.pid, sig);
      if (r.running && ::getpgid(r.pid) != r.pid) ::kill(r.pid, sig);
    }
  }

  // TERM, and CONT so that a stopped rank can act on it; SIGKILL follows after the grace.
  void begin_shutdown(Clock::time_point now) {
    if (phase_ != Phase::running) return;
    // The ranks' store connections will break off mid-request: the reason is said already.
    quiet_store();
    signal_all(SIGTERM);
    signal_all(SIGCONT);
    phase_ = Phase::terminating;
    phase_deadline_ = now + kGrace;
  }

  void kill_now(Clock::time_point now) {
    quiet_store();
    signal_all(SIGKILL);
    phase_ = Phase::killing;
    phase_deadline_ = now + kKillWait;
  }

  void check_deadlines(Clock::time_point now) {
    if (running_count() == 0) return;
    if (phase_ == Phase::running && timeout_at_ && now >= *timeout_at_) {
      say("timeout after " + args_.timeout_text + " s, killing ranks " +
          rank_list(running_ranks()));
      exit_code_ = 124;
      begin_shutdown(now);
    } else if (phase_ == Phase::terminating && now >= phase_deadline_) {
      say("ranks " + rank_list(running_ranks()) + " still running " +
          std::to_string(std::chrono::duration_cast<std::chrono::seconds>(kGrace).count()) +
          " s after SIGTERM, sending SIGKILL");
      kill_now(now);
    } else if (phase_ == Phase::killing && now >= phase_deadline_) {
      say("ranks " + rank_list(running_ranks()) + " did not exit after SIGKILL; giving up on them");
      gave_up_ = true;
    }
  }

  int poll_timeout_ms(Clock::time_point now) const {
    std::optional<Clock::time_point> next;
    auto consider = [&](Clock::time_point t) {
      if (!next || t < *next) next = t;
    };
    if (phase_ == Phase::running && timeout_at_) consider(*timeout_at_);
    if (phase_ != Phase::running) consider(phase_deadline_);
    if (drain_until_) consider(*drain_until_);
    if (!next) return -1;  // nothing is due: only a signal or output can change anything
    auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(*next - now).count() + 1;
    return static_cast<int>(std::clamp<long long>(ms, 0, 1 << 30));
  }

  void handle_signals() {
    // Bounded: the signalfd holds at most one pending instance of each blocked signal.
    for (int i = 0; i < 64; ++i) {
      signalfd_siginfo info;
      ssize_t n = ::read(signal_fd_, &info, sizeof(info));
      if (n != static_cast<ssize_t>(sizeof(info))) break;
      int sig = static_cast<int>(info.ssi_signo);
      auto now = Clock::now();
      if (sig == SIGCHLD) {
        collect_exits(now);
      } else if (sig == SIGINT && ++sigint_count_ >= 2) {
        say("second SIGINT, killing ranks " + rank_list(running_ranks()));
        if (interrupted_by_ == 0) interrupted_by_ = sig;
        kill_now(now);
      } else {
        say(signal_name(sig) + " received, forwarding it to the ranks" +
            (sig == SIGINT ? " (a second SIGINT kills them)" : ""));
        if (interrupted_by_ == 0) interrupted_by_ = sig;
        quiet_store();
        signal_all(sig);
      }
    }
  }

  // Notes every rank that has exited, leaving it a zombie (WNOWAIT). SIGCHLDs merge, so all
  // running ranks are checked on each one.
  void collect_exits(Clock::time_point now) {
    for (Rank& r : ranks_) {
      if (!r.running) continue;
      siginfo_t si{};
      if (::waitid(P_PID, static_cast<id_t>(r.pid), &si, WEXITED | WNOHANG | WNOWAIT) != 0)
        continue;
      if (si.si_pid != r.pid) continue;
      r.running = false;
      // What the rank wrote before it died comes out before the news of its death: a dead
      // writer's pipe holds at most its capacity, so a few reads drain it.
      for (Stream* s : {&r.out, &r.err}) {
        for (int i = 0; i < 64 && s->fd.valid(); ++i)
          if (pump(*s, prefixes_[r.index]) != Pump::more) break;
      }
      int code = 0;
      std::string how;
      if (si.si_code == CLD_EXITED) {
        code = si.si_status;
        how = "exited with code " + std::to_string(code);
      } else {
        code = 128 + si.si_status;
        how = "killed by signal " + std::to_string(si.si_status) + " (" +
              signal_name(si.si_status) + (si.si_code == CLD_DUMPED ? ", core dumped)" : ")");
      }
      // A failure while the job runs is news and ends the job; deaths ringrun causes while tearing
      // down are not. After an interrupt was forwarded, a rank dying by a signal is the expected
      // consequence, and the exit status stays 128 + that interrupt.
      if (code != 0 && phase_ == Phase::running && args_.elastic && interrupted_by_ == 0) {
        // The others go on (they shrink their communicator); the job ends with the last rank.
        const double at = std::chrono::duration<double>(now - started_).count();
        char when[32];
        std::snprintf(when, sizeof when, "%.3f", at);
        failures_.push_back("rank " + std::to_string(r.global) + " " + how + " after " + when +
                            " s");
        say("rank " + std::to_string(r.global) + " " + how + "; --elastic: the other ranks go on");
        if (si.si_code == CLD_EXITED) {
          if (!exit_code_) exit_code_ = code;
        } else if (!first_signal_code_) {
          first_signal_code_ = code;
        }
      } else if (code != 0 && phase_ == Phase::running) {
        bool caused_by_us = interrupted_by_ != 0 && si.si_code != CLD_EXITED;
        if (!caused_by_us) say("rank " + std::to_string(r.global) + " " + how);
        if (interrupted_by_ == 0) exit_code_ = code;
        begin_shutdown(now);
      } else if (code == 0 && args_.elastic) {
        exited_normally_ = true;
      }
    }
  }

  // Reaps every forked rank, waiting at most `limit` for those still alive.
  void reap_all(Clock::duration limit) {
    auto until = Clock::now() + limit;
    for (Rank& r : ranks_) {
      while (r.pid > 0) {
        pid_t got = ::waitpid(r.pid, nullptr, WNOHANG);
        if (got == r.pid || (got < 0 && errno != EINTR)) {
          r.pid = -1;
          r.running = false;
        } else if (Clock::now() >= until) {
          break;
        } else {
          ::poll(nullptr, 0, 10);  // SIGKILLed already; only a short wait for the kernel
        }
      }
    }
  }

  const Args& args_;
  std::string path_;
  ringreduce::rendezvous::TcpStoreServer* store_;  // nullptr: node 0's ringrun hosts it
  std::string store_addr_;
  int signal_fd_;
  ExecPlan plan_;
  std::vector<int> cores_ = usable_cores();
  std::vector<Rank> ranks_;
  std::vector<std::string> prefixes_;

  std::optional<Clock::time_point> timeout_at_;
  std::optional<Clock::time_point> drain_until_;
  Phase phase_ = Phase::running;
  Clock::time_point phase_deadline_;
  std::optional<int> exit_code_;
  // --elastic: the failures so far (named again at the end), the code of the first rank killed
  // by a signal, and whether any rank exited 0 by itself.
  std::vector<std::string> failures_;
  std::optional<int> first_signal_code_;
  bool exited_normally_ = false;
  const Clock::time_point started_ = Clock::now();
  int interrupted_by_ = 0;
  int sigint_count_ = 0;
  bool gave_up_ = false;
};

int run(int argc, char** argv) {
  ensure_standard_fds();
  int status = 0;
  auto args = parse_args(argc, argv, &status);
  if (!args) return status;
  auto path = resolve_program(args->command[0], &status);
  if (!path) return status;

  ExecPlan plan{};
  ringreduce::core::Fd signal_fd;
  if (const std::string why = prepare_launcher(*args, &plan, &signal_fd); !why.empty()) {
    say(why);
    return 1;
  }

  // Node 0 hosts the store: alone on loopback, port 0 (its real port goes to the ranks); over
  // several nodes on --master's address, the one the other nodes' ranks were told. The ranks
  // inherit RINGREDUCE_TOKEN and RINGREDUCE_ENCRYPT (with its files) from this environment and
  // meet this store with them.
  std::optional<ringreduce::rendezvous::TcpStoreServer> store;
  std::string store_addr = args->master.value_or("");
  if (args->hosts_store()) {
    store.emplace(args->master ? args->master_host : "127.0.0.1", args->master_port,
                  ringreduce::core::security_settings(ringreduce::core::Config()));
    if (!args->master) store_addr = "127.0.0.1:" + std::to_string(store->port());
  }
  // Declared after the store: ranks are killed and reaped before the store they use goes away.
  Launcher launcher(*args, *path, store ? &*store : nullptr, store_addr, signal_fd.get(), plan);
  if (int rc = launcher.start(); rc != 0) return rc;
  const int rc = launcher.run();
  // Elsewhere than node 0 there is no store to count; the usage text says so.
  if (args->store_stats && store) {
    const auto served = store->stats();
    say("the store served " + std::to_string(served.requests) + " requests over " +
        std::to_string(served.connections) + " connections");
  }
  return rc;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    say(e.what());
    return 1;
  }
}
