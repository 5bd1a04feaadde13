#include "rendezvous/socket_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "core/fd.h"
#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {

AddrInfoList resolve_tcp(const std::string& host, int port, bool passive, std::string* error) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_protocol = IPPROTO_TCP;
  // No AI_ADDRCONFIG: it hides ::1 and 127.0.0.1 on hosts whose only addresses are loopback,
  // which is exactly where tests and single-node jobs run.
  hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
  addrinfo* result = nullptr;
  std::string service = std::to_string(port);
  int rc = getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &result);
  if (rc != 0) {
    *error = "cannot resolve '" + host + "': " + gai_strerror(rc);
    return nullptr;
  }
  return AddrInfoList(result);
}

std::string describe_address(const sockaddr* addr, socklen_t len) {
  char host[NI_MAXHOST] = {};
  char serv[NI_MAXSERV] = {};
  if (getnameinfo(addr, len, host, sizeof(host), serv, sizeof(serv),
                  NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "?";
  return join_host_port(host, std::atoi(serv));
}

std::string join_host_port(const std::string& host, int port) {
  // An IPv6 literal needs brackets, or its colons would run into the port's.
  if (host.find(':') != std::string::npos) return "[" + host + "]:" + std::to_string(port);
  return host + ":" + std::to_string(port);
}

std::string connect_before(int fd, const addrinfo* ai, const core::Deadline& deadline) {
  if (::connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) return "";
  // EINTR leaves a non-blocking connect running, just like EINPROGRESS.
  if (errno != EINPROGRESS && errno != EINTR) return core::errno_text();
  // Bounded: poll waits at most until the deadline; EINTR re-polls what is left of it.
  for (;;) {
    pollfd p{fd, POLLOUT, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc > 0) break;
    if (rc == 0 || deadline.expired()) return "connect timed out";
    if (errno != EINTR) return std::string("poll: ") + core::errno_text();
  }
  // Writable means the connect finished; SO_ERROR says whether it succeeded.
  int err = 0;
  socklen_t len = sizeof(err);
  if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return core::errno_text();
  return err == 0 ? "" : std::strerror(err);
}

void set_nodelay(int fd) {
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

namespace {

// Waits for `events` on fd until the deadline. Returns ok, timeout or error.
IoResult wait_for(int fd, short events, const core::Deadline& deadline) {
  // Bounded: poll() returns at the deadline at the latest; EINTR only re-polls what is left.
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, deadline.remaining_ms());
    if (rc > 0) return IoResult::ok;  // readiness or an error condition: the next call tells
    if (rc == 0) return IoResult::timeout;
    if (errno != EINTR) return IoResult::error;
    if (deadline.expired()) return IoResult::timeout;
  }
}

}  // namespace

IoResult send_exact(int fd, const void* data, size_t len, const core::Deadline& deadline) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  // Bounded: every pass sends bytes, or waits (bounded by the deadline), or returns.
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::error;
    if (deadline.expired()) return IoResult::timeout;
    IoResult w = wait_for(fd, POLLOUT, deadline);
    if (w != IoResult::ok) return w;
  }
  return IoResult::ok;
}

IoResult recv_exact(int fd, void* data, size_t len, const core::Deadline& deadline) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) return IoResult::closed;
    if (errno == EINTR) continue;
    if (errno != EAGAIN && errno != EWOULDBLOCK) return IoResult::error;
    if (deadline.expired()) return IoResult::timeout;
    IoResult w = wait_for(fd, POLLIN, deadline);
    if (w != IoResult::ok) return w;
  }
  return IoResult::ok;
}

core::Fd connect_with_retry(const std::string& name, std::chrono::milliseconds timeout,
                            const core::Deadline& deadline,
                            const std::function<core::Fd(const core::Deadline&)>& connect_once) {
  constexpr std::chrono::milliseconds kBackoffFirst(10), kBackoffMax(500);
  std::chrono::milliseconds backoff = kBackoffFirst;
  std::string last_error = "no attempt was made";
  // Bounded by the deadline: every pass returns, throws, or sleeps toward it.
  for (int attempt = 1;; ++attempt) {
    try {
      return connect_once(deadline);
    } catch (const Retryable& r) {
      last_error = r.reason;
    }
    if (deadline.expired())
      throw TimeoutError(name + ": could not connect within " + std::to_string(timeout.count()) +
                         " ms (" + std::to_string(attempt) + " attempts; last: " + last_error +
                         ")");
    if (attempt == 1)
      RR_LOG(info, store, -1, name, ": not reachable yet (", last_error, "); retrying");
    std::this_thread::sleep_until(std::min(core::Clock::now() + backoff, deadline.at()));
    backoff = std::min(backoff * 2, kBackoffMax);
  }
}

void split_host_port(const std::string& addr, std::string* host, int* port) {
  auto bad = [&](const std::string& why) {
    return InvalidArgument("store address '" + addr + "' " + why +
                           "; expected host:port, [ipv6]:port or an IPv6 address");
  };
  auto host_char_ok = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_';
  };
  auto parse_port = [&](const std::string& text) {
    if (text.empty() || text.size() > 5 ||
        !std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; }))
      throw bad("has port '" + text + "', which is not a number");
    int p = std::stoi(text);
    if (p > 65535) throw bad("has port " + text + ", which is above 65535");
    return p;
  };
  if (addr.empty()) throw bad("is empty");
  std::string h;
  int p = -1;
  if (addr.front() == '[') {
    size_t close = addr.find(']');
    if (close == std::string::npos) throw bad("has no closing ']'");
    h = addr.substr(1, close - 1);
    std::string rest = addr.substr(close + 1);
    if (!rest.empty()) {
      if (rest.front() != ':') throw bad("has '" + rest + "' after ']'");
      p = parse_port(rest.substr(1));
    }
    in6_addr ignored{};
    // A zone ("fe80::1%eth0") is not something inet_pton accepts; check the address part.
    if (h.empty() || inet_pton(AF_INET6, h.substr(0, h.find('%')).c_str(), &ignored) != 1)
      throw bad("has '" + h + "' in brackets, which is not an IPv6 address");
  } else if (size_t colon = addr.find(':'); colon == std::string::npos) {
    h = addr;  // a bare host; the caller supplies the port
  } else if (addr.find(':', colon + 1) == std::string::npos) {
    h = addr.substr(0, colon);
    p = parse_port(addr.substr(colon + 1));
  } else {
    // Several colons and no brackets: only a whole IPv6 address makes sense.
    in6_addr ignored{};
    if (inet_pton(AF_INET6, addr.substr(0, addr.find('%')).c_str(), &ignored) != 1)
      throw bad("is neither host:port nor an IPv6 address (write [ipv6]:port)");
    h = addr;
  }
  if (h.empty()) throw bad("has no host");
  if (addr.front() != '[' && h.find(':') == std::string::npos &&
      !std::all_of(h.begin(), h.end(), host_char_ok))
    throw bad("has host '" + h + "', which is not a host name or address");
  *host = h;
  *port = p;
}

}  // namespace ringreduce::rendezvous
