// Small socket helpers for the TCP store: name resolution with RAII, address formatting, and
// deadline-bounded blocking I/O on non-blocking sockets.
#pragma once

#include <netdb.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "core/deadline.h"
#include "core/fd.h"

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
// Splits "host:port", "[v6addr]:port" or "v6addr" forms; InvalidArgument on garbage.
void split_host_port(const std::string& addr, std::string* host, int* port);

// connect() on a non-blocking socket, waiting no later than deadline for it to finish. Returns ""
// once connected, else the reason ("Connection refused", "connect timed out", ...).
std::string connect_before(int fd, const addrinfo* ai, const core::Deadline& deadline);

// A failure worth retrying until the deadline: refused, unreachable, reset, unresolvable.
struct Retryable {
  std::string reason;
};

// Calls connect_once until it returns a connection, retrying after a Retryable with a back-off
// that is quick at first (the server is usually just starting) and then gentle (10 ms doubling to
// 500 ms), never past the deadline; then a TimeoutError "<name>: could not connect within
// <timeout> ms (<n> attempts; last: <reason>)". The first retry is logged at INFO.
core::Fd connect_with_retry(const std::string& name, std::chrono::milliseconds timeout,
                            const core::Deadline& deadline,
                            const std::function<core::Fd(const core::Deadline&)>& connect_once);

// Best effort: a store exchange is a few small messages, so Nagle would only add latency.
void set_nodelay(int fd);

enum class IoResult { ok, timeout, closed, error };

// Sends or receives exactly len bytes on a non-blocking socket, waiting with poll() no later
// than deadline. On error, errno describes it.
IoResult send_exact(int fd, const void* data, size_t len, const core::Deadline& deadline);
IoResult recv_exact(int fd, void* data, size_t len, const core::Deadline& deadline);

}  // namespace ringreduce::rendezvous
