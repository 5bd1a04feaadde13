// A stand-in rank for the ringrun tests: each mode exercises one launcher behaviour.
//
//   rank_helper env                 print this rank's RINGREDUCE_* variables and exit 0
//   rank_helper lines K             write K numbered lines to stdout and to stderr, each line in
//                                   several write() calls, so the launcher must reassemble them
//   rank_helper partial             write a last line without newline to stdout and stderr
//   rank_helper longline BYTES      write one line of BYTES digits (and its newline), then "end"
//   rank_helper sleep SECONDS       print pid and "ready", sleep, exit 0
//   rank_helper fail RANK CODE      rank RANK exits with CODE after 0.5 s; the others sleep 60 s
//   rank_helper die RANK SIGNAL     rank RANK kills itself with SIGNAL after 0.5 s; others sleep
//   rank_helper on-term             on SIGTERM print "got SIGTERM" and exit 0; else sleep 60 s
//   rank_helper on-int              on SIGINT print "got SIGINT" and keep sleeping (60 s)
//   rank_helper barrier             add() barrier across all ranks through RINGREDUCE_ADDR
//   rank_helper allreduce           Communicator::from_env, then one allreduce whose every element
//                                   is checked; prints "allreduce ok rank=R world=W", exits 1 if
//                                   any element is wrong
// Options after the mode's arguments:
//   --ignore-term                   ignore SIGTERM (only the launcher's SIGKILL can end it)
//   --grandchild                    fork a child that sleeps 60 s and print "grandchild=PID"
// Sleeping modes print "pid=PID" and then "ready" first, so tests know whom to check and when
// the ranks are in place.
#include <signal.h>
#include <sys/types.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/config.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/error.h"
#include "ringreduce/ringreduce.hpp"

namespace {

// Unbuffered, so that what the test sees is exactly the write() calls made here.
void put(int fd, const std::string& s) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::write(fd, s.data() + done, s.size() - done);
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

std::string var(const char* name) {
  return ringreduce::core::env(name).value_or("<unset>");
}

int my_rank() {
  return std::atoi(var("RINGREDUCE_RANK").c_str());
}

// The payload of line j: long enough that lines cross pipe reads, and checkable by the test.
std::string payload(int j) {
  return std::string(static_cast<size_t>(j % 50) * 7, 'a' + j % 26);
}

void sleep_s(double s) {
  std::this_thread::sleep_for(std::chrono::duration<double>(s));
}

void announce() {
  put(1, "pid=" + std::to_string(::getpid()) + "\n");
  put(1, "ready\n");
}

// Async-signal-safe handlers: only write() and _exit().
void on_term(int) {
  static const char kMsg[] = "got SIGTERM\n";
  ssize_t ignored = ::write(1, kMsg, sizeof(kMsg) - 1);
  (void)ignored;
  ::_exit(0);
}

void on_int(int) {
  static const char kMsg[] = "got SIGINT\n";
  ssize_t ignored = ::write(1, kMsg, sizeof(kMsg) - 1);
  (void)ignored;
}

int barrier() {
  using namespace std::chrono_literals;
  std::string host;
  int port = 0;
  ringreduce::rendezvous::split_host_port(var("RINGREDUCE_ADDR"), &host, &port);
  int world = std::atoi(var("RINGREDUCE_WORLD_SIZE").c_str());
  // ringrun hosts the store with the RINGREDUCE_TOKEN it was given, if any, as its ranks inherit.
  auto store = ringreduce::rendezvous::connect_tcp_store(
      host, port, 10s, ringreduce::core::Config().str("RINGREDUCE_TOKEN"));
  int64_t arrived = store->add("barrier/arrived", 1);
  put(1, "arrived=" + std::to_string(arrived) + "\n");
  // The last to arrive opens the gate; everyone waits for it. No rank can pass before all added.
  if (arrived == world) store->set("barrier/open", {1});
  store->wait({"barrier/open"}, 20s);
  int64_t total = store->add("barrier/arrived", 0);
  put(1, "barrier passed total=" + std::to_string(total) + "\n");
  return total == world ? 0 : 1;
}

// The library end to end over whatever ringrun gave this rank (e.g. one of several ringruns of a
// multi-node job): rank r contributes (r + 1) * (i % 7 + 1) at element i, small integers whose
// float sum is exact, so every element has one right answer.
int allreduce() {
  using namespace std::chrono_literals;
  ringreduce::Options o;
  o.timeout = 30s;  // the tests' own limits are shorter: a hang fails there, not here
  auto comm = ringreduce::Communicator::from_env(o);
  const int rank = comm.rank(), world = comm.size();
  constexpr size_t kCount = 100000;
  std::vector<float> buf(kCount);
  for (size_t i = 0; i < kCount; ++i)
    buf[i] = static_cast<float>((rank + 1) * static_cast<int>(i % 7 + 1));
  comm.allreduce(std::span<float>(buf), ringreduce::ReduceOp::sum);
  const int sum_of_factors = world * (world + 1) / 2;
  for (size_t i = 0; i < kCount; ++i) {
    const float want = static_cast<float>(sum_of_factors * static_cast<int>(i % 7 + 1));
    if (buf[i] != want) {
      put(1, "allreduce wrong at " + std::to_string(i) + ": " + std::to_string(buf[i]) +
                 " instead of " + std::to_string(want) + "\n");
      return 1;
    }
  }
  put(1, "allreduce ok rank=" + std::to_string(rank) + " world=" + std::to_string(world) + "\n");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    put(2, "usage: rank_helper MODE [ARGS...] [--ignore-term] [--grandchild]\n");
    return 2;
  }
  for (const auto& a : args) {
    if (a == "--ignore-term") ::signal(SIGTERM, SIG_IGN);
  }
  for (const auto& a : args) {
    if (a != "--grandchild") continue;
    pid_t child = ::fork();
    if (child == 0) {
      sleep_s(60);
      ::_exit(0);
    }
    put(1, "grandchild=" + std::to_string(child) + "\n");
  }
  const std::string& mode = args[0];
  auto arg = [&](size_t i) { return i < args.size() ? std::atoi(args[i].c_str()) : 0; };
  int rank = my_rank();

  try {
    if (mode == "env") {
      put(1, "rank=" + var("RINGREDUCE_RANK") + " world=" + var("RINGREDUCE_WORLD_SIZE") +
                 " local_rank=" + var("RINGREDUCE_LOCAL_RANK") +
                 " local_size=" + var("RINGREDUCE_LOCAL_SIZE") + " addr=" + var("RINGREDUCE_ADDR") +
                 " store_server=" + var("RINGREDUCE_STORE_SERVER") + "\n");
      return 0;
    }
    if (mode == "lines") {
      for (int j = 0; j < arg(1); ++j) {
        std::string line =
            "rank " + std::to_string(rank) + " line " + std::to_string(j) + " " + payload(j) + "\n";
        // Three writes per line: the launcher must never emit a line before its newline arrived.
        size_t third = line.size() / 3;
        put(1, line.substr(0, third));
        put(1, line.substr(third, third));
        put(1, line.substr(2 * third));
        put(2, "err " + line.substr(0, third));
        put(2, line.substr(third));
      }
      return 0;
    }
    if (mode == "partial") {
      put(1, "first line\n");
      put(1, "rank " + std::to_string(rank) + " partial");
      put(2, "rank " + std::to_string(rank) + " err-partial");
      return 0;
    }
    if (mode == "longline") {
      std::string line;
      for (int i = 0; i < arg(1); ++i) line.push_back(static_cast<char>('0' + i % 10));
      put(1, line + "\n");
      put(1, "end\n");
      return 0;
    }
    if (mode == "sleep") {
      announce();
      sleep_s(std::atof(args.size() > 1 ? args[1].c_str() : "60"));
      return 0;
    }
    if (mode == "fail" || mode == "die") {
      announce();
      if (rank != arg(1)) {
        // The others wait (for ringrun to stop them), or, with a third argument, end by
        // themselves after that many seconds (ringrun --elastic lets them).
        const bool ends = args.size() > 3 && std::isdigit(static_cast<unsigned char>(args[3][0]));
        sleep_s(ends ? std::atof(args[3].c_str()) : 60);
        if (ends) put(1, "done\n");
        return 0;
      }
      sleep_s(0.5);  // lets the other ranks print their pids first
      if (mode == "fail") return arg(2);
      ::signal(arg(2), SIG_DFL);
      ::kill(::getpid(), arg(2));
      sleep_s(10);
      return 99;  // not reached: the signal kills us
    }
    if (mode == "on-term") {
      ::signal(SIGTERM, on_term);
      announce();
      sleep_s(60);
      return 0;
    }
    if (mode == "on-int") {
      struct sigaction sa {};
      sa.sa_handler = on_int;
      sa.sa_flags = SA_RESTART;
      ::sigaction(SIGINT, &sa, nullptr);
      announce();
      sleep_s(60);
      return 0;
    }
    if (mode == "barrier") return barrier();
    if (mode == "allreduce") return allreduce();
  } catch (const std::exception& e) {
    put(2, std::string("rank_helper: ") + e.what() + "\n");
    return 1;
  }
  put(2, "rank_helper: unknown mode '" + mode + "'\n");
  return 2;
}
