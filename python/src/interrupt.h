// Ctrl-C in a blocking call. The module's blocking calls run without the GIL, in C++, where
// Python cannot raise KeyboardInterrupt; so at import the module adds itself in front of the
// process's SIGINT handler (chaining to Python's, which still records the signal): a SIGINT
// during a blocking call aborts that call's communicator (its peers learn "rank r aborted:
// ... interrupted"), the call returns, and the interrupt is raised in Python as usual. If the
// program installs another SIGINT handler later (signal.signal), it replaces this one and the
// calls are no longer interruptible. The torch backend's module compiles this file too: its
// Works' waits and its calls run the same way, under a hook of its own chained to this one.
#pragma once

#include <atomic>

#include "ringreduce/ringreduce.hpp"

namespace ringreduce::python {

// Adds the SIGINT hook and its watcher thread (once; at module import).
void install_interrupt_hook();

// A blocking call in progress on `comm`, from construction (GIL held) to destruction.
class Interruptible {
 public:
  explicit Interruptible(Communicator& comm);
  ~Interruptible();
  Interruptible(const Interruptible&) = delete;
  Interruptible& operator=(const Interruptible&) = delete;
  // With the GIL held, after the call failed: if a SIGINT aborted it, runs Python's signal
  // handlers (KeyboardInterrupt by default) and throws that as py::error_already_set.
  void rethrow_if_interrupted();
  // Whether a SIGINT aborted the call (the torch backend raises it in torch's own way).
  bool interrupted() const { return interrupted_.load(); }

 private:
  Communicator& comm_;
  std::atomic<bool> interrupted_{false};
  friend struct InterruptWatch;
};

}  // namespace ringreduce::python
