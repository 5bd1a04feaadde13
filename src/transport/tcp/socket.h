// Socket plumbing for the TCP transport: addresses, interface choice, listen/connect, options.
#pragma once

#include <sys/socket.h>

#include <string>

#include "core/auth.h"
#include "core/config.h"
#include "core/deadline.h"
#include "core/fd.h"

namespace ringreduce::transport::tcp {

struct SockAddr {
  sockaddr_storage storage{};
  socklen_t len = 0;
  int family() const { return storage.ss_family; }
  int port() const;
  void set_port(int port);
  std::string str() const;   // "127.0.0.1:4242" or "[::1]:4242"
  bool is_loopback() const;  // 127.0.0.0/8 or ::1
};

// Parses a numeric IPv4/IPv6 address (no name lookup) with a port.
bool parse_numeric(const std::string& host, int port, SockAddr* out);
// Parses what a listener publishes in its join record, "<host>|<port>|<nonce hex, or ->"
// (transport::Listeners): the address, and the nonce's text in *nonce. False if it does not parse.
bool parse_published(const std::string& v, SockAddr* addr, std::string* nonce);

// The address this rank listens on for data connections:
// - RINGREDUCE_SOCKET_IFNAME: "eth0" (prefix), "=eth0" (exact), "^docker,lo" (exclude);
// - otherwise, if the store is on loopback the job is local: 127.0.0.1 (or ::1);
// - otherwise the first up interface that is not loopback nor a docker/virbr bridge.
// RINGREDUCE_SOCKET_FAMILY (AF_INET / AF_INET6) restricts the family. Port is 0.
SockAddr choose_data_address(const core::Config& config, const std::string& store_host);

// Listening socket on addr (port 0 = ephemeral); *bound receives the real address.
core::Fd listen_on(const SockAddr& addr, SockAddr* bound);
// A listening socket on the data interface (choose_data_address) and its part of a join record,
// "<host>|<port>|<nonce hex, or ->": with a token, a fresh nonce that connectors prove it against.
struct PublishedListener {
  core::Fd fd;
  core::auth::Nonce nonce{};
  std::string published;
};
PublishedListener listen_published(const core::Config& config, bool with_token,
                                   const std::string& store_host);
// Blocking connect bounded by the deadline; retries refused connections (the peer's listener
// exists before its address is published, but a SYN backlog overflow looks like a refusal).
core::Fd connect_to(const SockAddr& addr, const core::Deadline& deadline);

void set_nonblocking(int fd);
// TCP_NODELAY (every message is latency-critical), send/receive buffers of the given size so
// that a whole pipeline of segments fits in flight (0 leaves the kernel's autotuning alone), and
// the congestion control (empty: the system's default). Returns false if the kernel refused the
// congestion control (the socket keeps the default then).
bool tune_data_socket(int fd, int buffer_bytes, const std::string& congestion);

}  // namespace ringreduce::transport::tcp
