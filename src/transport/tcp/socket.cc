#include "transport/tcp/socket.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <string.h>

#include <chrono>
#include <sstream>
#include <thread>
#include <vector>

#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::transport::tcp {

int SockAddr::port() const {
  if (family() == AF_INET) return ntohs(reinterpret_cast<const sockaddr_in*>(&storage)->sin_port);
  if (family() == AF_INET6)
    return ntohs(reinterpret_cast<const sockaddr_in6*>(&storage)->sin6_port);
  return -1;
}

void SockAddr::set_port(int port) {
  if (family() == AF_INET)
    reinterpret_cast<sockaddr_in*>(&storage)->sin_port = htons(static_cast<uint16_t>(port));
  else if (family() == AF_INET6)
    reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port = htons(static_cast<uint16_t>(port));
}

std::string SockAddr::str() const {
  char buf[INET6_ADDRSTRLEN] = {};
  if (family() == AF_INET) {
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(&storage)->sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(port());
  }
  if (family() == AF_INET6) {
    const auto* a6 = reinterpret_cast<const sockaddr_in6*>(&storage);
    inet_ntop(AF_INET6, &a6->sin6_addr, buf, sizeof buf);
    std::string s = "[" + std::string(buf);
    if (a6->sin6_scope_id != 0) s += "%" + std::to_string(a6->sin6_scope_id);
    return s + "]:" + std::to_string(port());
  }
  return "?";
}

bool parse_numeric(const std::string& host_in, int port, SockAddr* out) {
  std::string host = host_in;
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  *out = SockAddr{};
  auto* a4 = reinterpret_cast<sockaddr_in*>(&out->storage);
  if (inet_pton(AF_INET, host.c_str(), &a4->sin_addr) == 1) {
    a4->sin_family = AF_INET;
    out->len = sizeof(sockaddr_in);
    out->set_port(port);
    return true;
  }
  auto* a6 = reinterpret_cast<sockaddr_in6*>(&out->storage);
  std::string h6 = host;
  uint32_t scope = 0;
  if (auto pct = h6.find('%'); pct != std::string::npos) {
    scope = if_nametoindex(h6.substr(pct + 1).c_str());
    h6 = h6.substr(0, pct);
  }
  if (inet_pton(AF_INET6, h6.c_str(), &a6->sin6_addr) == 1) {
    a6->sin6_family = AF_INET6;
    a6->sin6_scope_id = scope;
    out->len = sizeof(sockaddr_in6);
    out->set_port(port);
    return true;
  }
  return false;
}

bool SockAddr::is_loopback() const {
  if (family() == AF_INET) {
    const auto* a = reinterpret_cast<const sockaddr_in*>(&storage);
    return (ntohl(a->sin_addr.s_addr) >> 24) == 127;
  }
  if (family() == AF_INET6) {
    const auto* a = reinterpret_cast<const sockaddr_in6*>(&storage);
    return IN6_IS_ADDR_LOOPBACK(&a->sin6_addr);
  }
  return false;
}

namespace {

bool is_loopback_host(const std::string& h) {
  return h == "localhost" || h.rfind("127.", 0) == 0 || h == "::1" || h == "[::1]";
}

// Splits "a,b,c" into parts.
std::vector<std::string> split_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  std::string part;
  while (std::getline(in, part, ',')) {
    if (!part.empty()) out.push_back(part);
  }
  return out;
}

// NCCL_SOCKET_IFNAME semantics: a leading '^' excludes, a leading '=' matches exactly, otherwise
// each entry is a prefix.
bool interface_matches(const std::string& spec, const std::string& name) {
  std::string s = spec;
  bool exclude = false, exact = false;
  if (!s.empty() && s[0] == '^') exclude = true, s = s.substr(1);
  if (!s.empty() && s[0] == '=') exact = true, s = s.substr(1);
  bool hit = false;
  for (const auto& p : split_list(s)) {
    if (exact ? name == p : name.rfind(p, 0) == 0) hit = true;
  }
  return exclude ? !hit : hit;
}

}  // namespace

SockAddr choose_data_address(const core::Config& config, const std::string& store_host) {
  const std::string ifname = config.str("RINGREDUCE_SOCKET_IFNAME");
  const std::string family_name = config.str("RINGREDUCE_SOCKET_FAMILY");
  int want_family = AF_UNSPEC;
  if (family_name == "AF_INET" || family_name == "inet" || family_name == "4")
    want_family = AF_INET;
  else if (family_name == "AF_INET6" || family_name == "inet6" || family_name == "6")
    want_family = AF_INET6;
  else if (!family_name.empty())
    throw InvalidArgument("RINGREDUCE_SOCKET_FAMILY='" + family_name +
                          "' is not AF_INET or AF_INET6");

  SockAddr out;
  if (ifname.empty() && is_loopback_host(store_host)) {
    bool v6 = want_family == AF_INET6 ||
              (want_family == AF_UNSPEC && store_host.find(':') != std::string::npos);
    parse_numeric(v6 ? "::1" : "127.0.0.1", 0, &out);
    return out;
  }

  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) throw Error(std::string("getifaddrs failed: ") + strerror(errno));
  struct Candidate {
    std::string name;
    SockAddr addr;
  };
  std::vector<Candidate> found;
  for (ifaddrs* ifa = list; ifa != nullptr; ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr || !(ifa->ifa_flags & IFF_UP)) continue;
    int fam = ifa->ifa_addr->sa_family;
    if (fam != AF_INET && fam != AF_INET6) continue;
    if (want_family != AF_UNSPEC && fam != want_family) continue;
    std::string name = ifa->ifa_name;
    if (!ifname.empty()) {
      if (!interface_matches(ifname, name)) continue;
    } else {
      // Automatic choice: skip loopback and container bridges when anything else exists.
      if ((ifa->ifa_flags & IFF_LOOPBACK) || name.rfind("docker", 0) == 0 ||
          name.rfind("virbr", 0) == 0 || name.rfind("br-", 0) == 0)
        continue;
    }
    Candidate c{name, {}};
    c.addr.len = fam == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    memcpy(&c.addr.storage, ifa->ifa_addr, c.addr.len);
    if (fam == AF_INET6) {
      auto* a6 = reinterpret_cast<sockaddr_in6*>(&c.addr.storage);
      // Link-local IPv6 needs a scope; prefer global addresses by skipping link-local.
      if (IN6_IS_ADDR_LINKLOCAL(&a6->sin6_addr)) continue;
    }
    c.addr.set_port(0);
    found.push_back(c);
  }
  freeifaddrs(list);
  // IPv4 first unless the family was forced: it is what most clusters route.
  for (int pass = 0; pass < 2; ++pass) {
    for (const auto& c : found) {
      if ((pass == 0) == (c.addr.family() == AF_INET)) return c.addr;
    }
  }
  if (!ifname.empty())
    throw InvalidArgument("RINGREDUCE_SOCKET_IFNAME='" + ifname +
                          "' matches no interface that is up with a usable address");
  // Nothing but loopback: a single-host job.
  parse_numeric(want_family == AF_INET6 ? "::1" : "127.0.0.1", 0, &out);
  return out;
}

void set_nonblocking(int fd) {
  int flags = fcntl(fd, F_GETFL, 0);
  if (flags < 0 || fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0)
    throw Error(std::string("fcntl(O_NONBLOCK) failed: ") + strerror(errno));
}

bool tune_data_socket(int fd, int buffer_bytes, const std::string& congestion) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  bool ok = true;
  if (!congestion.empty())
    ok = setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, congestion.data(),
                    static_cast<socklen_t>(congestion.size())) == 0;
  if (buffer_bytes > 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buffer_bytes, sizeof buffer_bytes);
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buffer_bytes, sizeof buffer_bytes);
  }
  return ok;
}

bool parse_published(const std::string& v, SockAddr* addr, std::string* nonce) {
  const auto a = v.find('|'), b = a == std::string::npos ? a : v.find('|', a + 1);
  if (b == std::string::npos) return false;
  const std::string port = v.substr(a + 1, b - a - 1);
  if (port.empty() || port.size() > 5 || port.find_first_not_of("0123456789") != port.npos)
    return false;
  if (!parse_numeric(v.substr(0, a), std::stoi(port), addr)) return false;
  *nonce = v.substr(b + 1);
  return true;
}

core::Fd listen_on(const SockAddr& addr, SockAddr* bound) {
  core::Fd fd(socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw Error(std::string("socket() failed: ") + strerror(errno));
  int one = 1;
  setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len) != 0)
    throw Error("bind(" + addr.str() + ") failed: " + strerror(errno));
  // A deep backlog: every higher rank connects at once, before this rank starts accepting.
  if (::listen(fd.get(), 4096) != 0)
    throw Error(std::string("listen() failed: ") + strerror(errno));
  bound->len = sizeof(bound->storage);
  if (getsockname(fd.get(), reinterpret_cast<sockaddr*>(&bound->storage), &bound->len) != 0)
    throw Error(std::string("getsockname() failed: ") + strerror(errno));
  return fd;
}

PublishedListener listen_published(const core::Config& config, bool with_token,
                                   const std::string& store_host) {
  PublishedListener l;
  SockAddr bound;
  l.fd = listen_on(choose_data_address(config, store_host), &bound);
  if (with_token) l.nonce = core::auth::random_nonce();
  const std::string addr = bound.str();
  l.published = addr.substr(0, addr.rfind(':')) + "|" + std::to_string(bound.port()) + "|" +
                (with_token ? core::auth::nonce_to_hex(l.nonce) : "-");
  return l;
}

core::Fd connect_to(const SockAddr& addr, const core::Deadline& deadline) {
  auto backoff = std::chrono::milliseconds(1);
  for (;;) {
    core::Fd fd(socket(addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd.valid()) throw Error(std::string("socket() failed: ") + strerror(errno));
    int rc = ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr.storage), addr.len);
    int err = rc == 0 ? 0 : errno;
    if (err == EINPROGRESS) {
      pollfd p{fd.get(), POLLOUT, 0};
      int n = poll(&p, 1, deadline.remaining_ms());
      if (n == 0) throw TimeoutError("connect to " + addr.str() + " timed out");
      socklen_t len = sizeof err;
      getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    }
    if (err == 0) return fd;
    if ((err != ECONNREFUSED && err != ETIMEDOUT && err != EAGAIN) || deadline.expired())
      throw Error("connect to " + addr.str() + " failed: " + strerror(err));
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(100));
  }
}

}  // namespace ringreduce::transport::tcp
