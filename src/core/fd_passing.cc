#include "core/fd_passing.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

namespace ringreduce::core {

ssize_t send_with_fds(int sock, const void* data, size_t len, const int* fds, size_t nfds) {
  iovec iov{const_cast<void*>(data), len};
  std::vector<char> control(CMSG_SPACE(nfds * sizeof(int)), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(nfds * sizeof(int));
  std::memcpy(CMSG_DATA(c), fds, nfds * sizeof(int));
  return sendmsg(sock, &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
}

ssize_t recv_with_fds(int sock, void* data, size_t len, size_t max_fds, std::vector<Fd>* fds,
                      std::string* err) {
  iovec iov{data, len};
  std::vector<char> control(CMSG_SPACE(max_fds * sizeof(int)), 0);
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control.data();
  msg.msg_controllen = control.size();
  const ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return -1;
  if (r < 0) {
    *err = std::string("receiving: ") + strerror(errno);
    return -2;
  }
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds->emplace_back(fd);
    }
  }
  if (msg.msg_flags & MSG_CTRUNC) {
    // The kernel drops what does not fit, or what this process has no descriptors left for.
    *err = "descriptors were lost (too many open files? ulimit -n is " +
           std::to_string(sysconf(_SC_OPEN_MAX)) + ")";
    return -2;
  }
  return r;
}

}  // namespace ringreduce::core
