// Small socket helpers for the TCP store: name resolution with RAII, address formatting, and
// deadline-bounded blocking I/O on non-blocking sockets.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/deadline.h"

namespace ringreduce::rendezvous {

struct AddrInfoDeleter {
  void operator()(addrinfo* ai) const { freeaddrinfo(ai); }
};
using AddrInfoList = std::unique_ptr<addrinfo, AddrInfoDeleter>;

// getaddrinfo for TCP. host may be empty (with passive: every interface). On failure returns
// null and sets *error to a readable reason.
AddrInfoList resolve_tcp(const std::string& host, int port, bool passive, std::string* error);

// "10.0.0.1:29500" or "[::1]:29500".
std::string describe_address(const sockaddr* addr, socklen_t len);
std::string join_host_port(const std::string& host, int port);

// connect() on a non-blocking socket, waiting no later than deadline for it to finish. Returns ""
// once connected, else the reason ("Connection refused", "connect timed out", ...).
std::string connect_before(int fd, const addrinfo* ai, const core::Deadline& deadline);

// Best effort: a store exchange is a few small messages, so Nagle would only add latency.
void set_nodelay(int fd);

enum class IoResult { ok, timeout, closed, error };

// Sends or receives exactly len bytes on a non-blocking socket, waiting with poll() no later
// than deadline. On error, errno describes it.
IoResult send_exact(int fd, const void* data, size_t len, const core::Deadline& deadline);
IoResult recv_exact(int fd, void* data, size_t len, const core::Deadline& deadline);

}  // namespace ringreduce::rendezvous
