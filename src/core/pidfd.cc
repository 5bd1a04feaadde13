#include "core/pidfd.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ringreduce::core {

int pidfd_open(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

std::string pidfd_namespace() {
  struct stat st {};
  if (stat("/proc/self/ns/pid", &st) != 0) return "-";
  Fd probe(pidfd_open(getpid()));
  if (!probe.valid()) return "-";
  char s[64];
  snprintf(s, sizeof s, "%llx:%llx", static_cast<unsigned long long>(st.st_dev),
           static_cast<unsigned long long>(st.st_ino));
  return s;
}

Fd take_peer_fd(pid_t pid, int pidfd, int fd, std::string* why) {
  Fd out;
  if (pidfd >= 0) {
    out.reset(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0)));
    if (out.valid()) return out;
    *why = std::string("pidfd_getfd: ") + std::strerror(errno);
  }
  const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(fd);
  out.reset(open(path.c_str(), O_RDWR | O_CLOEXEC));
  if (!out.valid()) *why += (why->empty() ? "" : "; ") + path + ": " + std::strerror(errno);
  return out;
}

bool pidfd_exited(int pidfd) {
  pollfd p{pidfd, POLLIN, 0};
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLIN | POLLHUP)) != 0;
}

}  // namespace ringreduce::core
