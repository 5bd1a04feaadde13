#include "ringrun_exec.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string_view>

#include "core/config.h"
#include "core/fd.h"
#include "ringrun_output.h"

extern char** environ;

namespace ringrun {

std::optional<std::string> resolve_program(const std::string& program, int* status) {
  auto usable = [](const std::string& path, int* err) {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) {
      *err = errno;
      return false;
    }
    if (!S_ISREG(st.st_mode)) {
      *err = EACCES;
      return false;
    }
    if (::access(path.c_str(), X_OK) != 0) {
      *err = errno;
      return false;
    }
    return true;
  };
  int err = ENOENT;
  if (program.find('/') != std::string::npos) {
    if (usable(program, &err)) return program;
  } else {
    // The default search path is glibc's, used when PATH is unset.
    std::string path = ringreduce::core::env("PATH").value_or("/bin:/usr/bin");
    bool denied = false;
    size_t start = 0;
    for (;;) {
      size_t colon = path.find(':', start);
      std::string dir = path.substr(start, colon == std::string::npos ? colon : colon - start);
      std::string candidate = (dir.empty() ? "." : dir) + "/" + program;
      int e = 0;
      if (usable(candidate, &e)) return candidate;
      denied = denied || e == EACCES;
      if (colon == std::string::npos) break;
      start = colon + 1;
    }
    err = denied ? EACCES : ENOENT;
    if (err == ENOENT) {
      say("program '" + program + "' not found in PATH");
      *status = 127;
      return std::nullopt;
    }
  }
  say("cannot execute '" + program + "': " + std::strerror(err));
  *status = err == ENOENT ? 127 : 126;
  return std::nullopt;
}

// Every variable ringrun sets; inherited copies are dropped so the ranks see exactly one of each.
// The last ones are torchrun's set, so that torch.distributed.init_process_group() (any
// backend) works under ringrun as under torchrun; a MASTER_PORT the user set is passed on.
const char* const kOwnVariables[] = {
    "RINGREDUCE_RANK",
    "RINGREDUCE_WORLD_SIZE",
    "RINGREDUCE_LOCAL_RANK",
    "RINGREDUCE_LOCAL_SIZE",
    "RINGREDUCE_ADDR",
    "RINGREDUCE_STORE_SERVER",
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
};

int torch_master_port(const Args& args) {
  if (const char* p = std::getenv("MASTER_PORT"); p != nullptr && *p != '\0') return std::atoi(p);
  if (args.master) return args.master_port < 65535 ? args.master_port + 1 : args.master_port - 1;
  ringreduce::core::Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (!fd.valid() || ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error(std::string("choosing MASTER_PORT: ") + std::strerror(errno));
  return ntohs(a.sin_port);
}

std::vector<std::string> inherited_environment() {
  std::vector<std::string> out;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string_view entry(*e);
    std::string_view name = entry.substr(0, entry.find('='));
    bool own = false;
    for (const char* v : kOwnVariables) own = own || name == v;
    if (!own) out.emplace_back(entry);
  }
  return out;
}

std::vector<int> usable_cores() {
  cpu_set_t set;
  std::vector<int> out;
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

[[noreturn]] void exec_child(const ExecPlan& p, char* const* envp) {
  int err = 0;
  // Own process group: ringrun can signal the rank with everything it starts, and Ctrl-C at a
  // terminal reaches ringrun alone, which decides what the ranks get.
  if (::setpgid(0, 0) != 0) err = errno;
  // If ringrun dies, even by SIGKILL, the rank goes too. The check after catches a ringrun that
  // died before the prctl took effect.
  if (err == 0 && ::prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) err = errno;
  if (err == 0 && ::getppid() != p.parent) ::_exit(127);
  if (err == 0 && (::dup2(p.stdin_fd, STDIN_FILENO) < 0 || ::dup2(p.stdout_fd, STDOUT_FILENO) < 0 ||
                   ::dup2(p.stderr_fd, STDERR_FILENO) < 0))
    err = errno;
  if (err == 0) {
    ::sigaction(SIGPIPE, &p.sigpipe, nullptr);
    ::sigaction(SIGCHLD, &p.sigchld, nullptr);
    ::setrlimit(RLIMIT_NOFILE, &p.nofile);
    ::setpriority(PRIO_PROCESS, 0, p.nice);  // raising a nice value is always allowed
    if (p.bind) ::sched_setaffinity(0, sizeof(p.cpus), &p.cpus);  // best effort
    // Descriptors ringrun did not open close-on-exec (the store's, or inherited ones) must not
    // leak into the ranks; the error pipe stays usable until execve succeeds. Old kernels lack
    // close_range; then O_CLOEXEC on our own descriptors is what we rely on.
    ::close_range(3, ~0U, CLOSE_RANGE_CLOEXEC);
    ::sigprocmask(SIG_SETMASK, &p.mask, nullptr);
    ::execve(p.path, p.argv, envp);
    err = errno;
  }
  ssize_t ignored = ::write(p.error_fd, &err, sizeof(err));
  (void)ignored;
  ::_exit(127);
}

void ensure_standard_fds() {
  for (int fd = 0; fd <= 2; ++fd) {
    if (::fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
      int n = ::open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
      if (n >= 0 && n != fd) {
        ::dup2(n, fd);
        ::close(n);
      }
    }
  }
}

std::string prepare_launcher(const Args& args, ExecPlan* plan, ringreduce::core::Fd* signal_fd) {
  plan->parent = ::getpid();

  // Block the signals ringrun handles before any thread exists (the store's thread inherits the
  // mask), so that they are only ever delivered through the signalfd.
  sigset_t handled;
  sigemptyset(&handled);
  sigaddset(&handled, SIGINT);
  sigaddset(&handled, SIGTERM);
  sigaddset(&handled, SIGCHLD);
  ::pthread_sigmask(SIG_BLOCK, &handled, &plan->mask);
  signal_fd->reset(::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC));
  if (!signal_fd->valid()) return std::string("signalfd: ") + std::strerror(errno);
  // A consumer of our stdout going away must not kill the launcher (and orphan output handling);
  // an inherited SIGCHLD=SIG_IGN would make the kernel reap the ranks before we see their status.
  struct sigaction dfl {
  }, ign{};
  dfl.sa_handler = SIG_DFL;
  ign.sa_handler = SIG_IGN;
  ::sigaction(SIGPIPE, &ign, &plan->sigpipe);
  ::sigaction(SIGCHLD, &dfl, &plan->sigchld);

  // Per local rank two pipe ends here, and per rank of the whole job one store connection where
  // the store is, plus slack. Raise the soft limit if needed; the ranks get the original back.
  ::getrlimit(RLIMIT_NOFILE, &plan->nofile);
  const rlim_t needed =
      static_cast<rlim_t>(2 * args.n + (args.hosts_store() ? args.world_size() : 0) + 64);
  if (const rlim_t now = ringreduce::core::raise_open_files_limit(needed, needed); now < needed)
    return "-n " + std::to_string(args.n) +
           (args.nnodes > 1 ? " --nnodes " + std::to_string(args.nnodes) : std::string()) +
           " needs about " + std::to_string(needed) + " open files, but the limit is " +
           std::to_string(now) + " (see ulimit -n)";

  // ringrun's threads serve every rank: the store's answers each rank's join, and the main one
  // forwards output and watches exits. Where ranks crowd the cores they are two runnable threads
  // among hundreds (bench/drivers/startup.sh -c 8 runs 1,024 ranks on two cores: the store's thread
  // ran 0.1 s in each 10 s and every join waited on it). Where allowed (root, CAP_SYS_NICE) ringrun
  // runs at nice -10, before the store's thread starts (it inherits it); the ranks get the
  // original back before their exec.
  errno = 0;
  plan->nice = ::getpriority(PRIO_PROCESS, 0);
  if (errno == 0) ::setpriority(PRIO_PROCESS, 0, std::max(-20, plan->nice - 10));
  return "";
}

}  // namespace ringrun
