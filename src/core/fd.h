// RAII owner of a file descriptor: every socket, eventfd and epoll fd in the library is one.
#pragma once

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <utility>

namespace ringreduce::core {

// The text of an errno value (by default the current one), for messages about a failed call.
inline std::string errno_text(int err = errno) {
  return std::strerror(err);
}

// Where this process's soft limit on open files is below `needed`, raises it to `want` (at least
// `needed`), as far as the hard limit allows; returns the soft limit then in force.
inline rlim_t raise_open_files_limit(rlim_t needed, rlim_t want) {
  rlimit l{};
  if (::getrlimit(RLIMIT_NOFILE, &l) != 0) return RLIM_INFINITY;  // nothing known: not in the way
  if (l.rlim_cur == RLIM_INFINITY || l.rlim_cur >= needed) return l.rlim_cur;
  rlimit raised = l;
  raised.rlim_cur = l.rlim_max == RLIM_INFINITY ? want : std::min(want, l.rlim_max);
  return raised.rlim_cur > l.rlim_cur && ::setrlimit(RLIMIT_NOFILE, &raised) == 0 ? raised.rlim_cur
                                                                                  : l.rlim_cur;
}

class Fd {
 public:
  Fd() = default;
  explicit Fd(int fd) : fd_(fd) {}
  ~Fd() { reset(); }
  Fd(Fd&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
  Fd& operator=(Fd&& o) noexcept {
    if (this != &o) {
      reset();
      fd_ = std::exchange(o.fd_, -1);
    }
    return *this;
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;

  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  int release() { return std::exchange(fd_, -1); }
  void reset(int fd = -1) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = fd;
  }

 private:
  int fd_ = -1;
};

}  // namespace ringreduce::core
