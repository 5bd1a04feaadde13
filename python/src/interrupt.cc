#include "interrupt.h"

#include <errno.h>
#include <fcntl.h>
#include <pybind11/pybind11.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

namespace ringreduce::python {

namespace py = pybind11;

struct InterruptWatch {
  int pipe_fds[2] = {-1, -1};
  struct sigaction previous {};
  std::mutex mu;
  std::vector<Interruptible*> calls;  // the blocking calls in progress
  std::thread watcher;

  // The watcher: one byte per SIGINT; each aborts every communicator in a blocking call.
  void watch() {
    char b;
    for (;;) {
      const ssize_t n = read(pipe_fds[0], &b, 1);
      if (n == 0) return;  // the write end closed: the process is ending
      if (n < 0) {
        if (errno == EINTR) continue;
        return;
      }
      std::lock_guard<std::mutex> lk(mu);
      for (Interruptible* c : calls) {
        c->interrupted_.store(true);
        try {
          c->comm_.abort("interrupted (SIGINT: KeyboardInterrupt)");
        } catch (...) {
        }
      }
    }
  }

  ~InterruptWatch() {
    if (pipe_fds[1] >= 0) close(pipe_fds[1]);
    if (watcher.joinable()) watcher.join();
    if (pipe_fds[0] >= 0) close(pipe_fds[0]);
  }
};

namespace {

InterruptWatch& state() {
  static InterruptWatch w;
  return w;
}

// Async-signal-safe: a write to a pipe, then the handler that was there before (Python's records
// the signal for KeyboardInterrupt).
void on_sigint(int sig, siginfo_t* info, void* ctx) {
  const int saved = errno;
  InterruptWatch& w = state();
  const char b = 1;
  if (w.pipe_fds[1] >= 0) (void)!write(w.pipe_fds[1], &b, 1);
  errno = saved;
  const struct sigaction& prev = w.previous;
  if (prev.sa_flags & SA_SIGINFO) {
    if (prev.sa_sigaction) prev.sa_sigaction(sig, info, ctx);
  } else if (prev.sa_handler == SIG_DFL) {
    // No one handles it: the default (end the process), as without this hook.
    signal(sig, SIG_DFL);
    raise(sig);
  } else if (prev.sa_handler != SIG_IGN) {
    prev.sa_handler(sig);
  }
}

}  // namespace

void install_interrupt_hook() {
  static std::once_flag once;
  std::call_once(once, [] {
    InterruptWatch& w = state();
    if (pipe2(w.pipe_fds, O_CLOEXEC) != 0) return;
    fcntl(w.pipe_fds[1], F_SETFL, O_NONBLOCK);  // a burst of signals must never block the handler
    w.watcher = std::thread([&w] { w.watch(); });
    struct sigaction ours {};
    ours.sa_sigaction = on_sigint;
    ours.sa_flags = SA_SIGINFO | SA_RESTART;
    sigemptyset(&ours.sa_mask);
    sigaction(SIGINT, &ours, &w.previous);
  });
}

Interruptible::Interruptible(Communicator& comm) : comm_(comm) {
  InterruptWatch& w = state();
  std::lock_guard<std::mutex> lk(w.mu);
  w.calls.push_back(this);
}

Interruptible::~Interruptible() {
  InterruptWatch& w = state();
  std::lock_guard<std::mutex> lk(w.mu);
  w.calls.erase(std::remove(w.calls.begin(), w.calls.end(), this), w.calls.end());
}

void Interruptible::rethrow_if_interrupted() {
  if (!interrupted_.load()) return;
  if (PyErr_CheckSignals() != 0) throw py::error_already_set();
  // A Python handler that raised nothing: the call's own error stands.
}

}  // namespace ringreduce::python
