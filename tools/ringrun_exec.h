// What ringrun prepares for a rank's process and does in it between fork and exec: the
// program found on PATH, the environment, the cores, the child's set-up; and what it sets up for
// itself before that (signals, limits). Apart from ringrun.cc, which launches and watches the
// ranks.
#pragma once

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/types.h>

#include <optional>
#include <string>
#include <vector>

#include "core/fd.h"
#include "ringrun_args.h"

namespace ringrun {

// Finds the program the way execvp would, but before any fork: the answer can then be reported
// clearly and once, and the child needs only execve (execvp is not async-signal-safe).
// Returns the path, or sets *status to 127 (not found) / 126 (not executable) and explains.
std::optional<std::string> resolve_program(const std::string& program, int* status);

// A port for torch's store (MASTER_PORT), which rank 0's torch.distributed binds itself on
// MASTER_ADDR, so it cannot be the port of ringrun's store. A MASTER_PORT the user set is passed
// on (over several nodes, the user sets the same one on each).
// With --master, every node must arrive at the same port without asking the others: the one next
// to the store's (above it, or below 65535). Alone: one the kernel hands out for port 0 and we
// release at once. Unlike ringrun's own store port, another process could take either in between;
// a user who cannot have that sets MASTER_PORT.
int torch_master_port(const Args& args);

// This process's environment without the variables ringrun sets for each rank.
std::vector<std::string> inherited_environment();

// The cores ringrun may run on (its own affinity mask), in order.
std::vector<int> usable_cores();

// What a freshly forked child needs, prepared before fork: between fork and exec the child of a
// multi-threaded process (the store serves from a thread) may only make async-signal-safe calls.
struct ExecPlan {
  const char* path;
  char* const* argv;
  pid_t parent;
  int nice;                  // ringrun's original nice value, restored in the rank
  sigset_t mask;             // ringrun's original signal mask, restored in the rank
  struct sigaction sigpipe;  // original dispositions ringrun changed
  struct sigaction sigchld;
  rlimit nofile;  // original RLIMIT_NOFILE, which ringrun may have raised
  bool bind;
  cpu_set_t cpus;  // this rank's core when bind is set
  int stdin_fd, stdout_fd, stderr_fd, error_fd;
};

// In the forked child: sets it up as the plan says and execs the program; never returns (exit
// status 127 and errno on the plan's error pipe where anything failed).
[[noreturn]] void exec_child(const ExecPlan& p, char* const* envp);

// A missing stdin/stdout/stderr would let a pipe land on fd 0..2 and be clobbered by dup2: each
// missing one is opened on /dev/null.
void ensure_standard_fds();

// What ringrun sets up for itself before any thread exists, keeping the originals in *plan for
// the ranks: the signals it handles blocked and read from *signal_fd, SIGPIPE ignored and
// SIGCHLD at its default, the open-file limit raised for its pipes and store connections, and
// nice -10 where allowed. Returns "" or why it cannot go on.
std::string prepare_launcher(const Args& args, ExecPlan* plan, ringreduce::core::Fd* signal_fd);

}  // namespace ringrun
