// The TCP store: a small key-value server (hosted by rank 0, by ringrun, or standalone via
// tools/ringreduce-store) and its client. One request/response protocol over TCP; every length
// read from the wire is bounded before use. With a token (RINGREDUCE_TOKEN), server and client
// prove to each other that they hold it (HMAC-SHA256 challenge-response, tcp_store_wire.h) before
// any request; without one, connections are not authenticated. With RINGREDUCE_ENCRYPT=psk or tls
// every byte after the hello is sealed (store_records.h), as on the data links.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/security.h"
#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

class TcpStoreServer {
 public:
  // Listens on host:port ("0.0.0.0", "::", "127.0.0.1"...; port 0 picks a free one) and serves
  // from a background thread until destroyed. With a non-empty token, only clients that prove
  // they hold it are served. Throws ringreduce::Error if it cannot listen.
  TcpStoreServer(const std::string& host, int port, const std::string& token = "");
  // The same with RINGREDUCE_ENCRYPT's protection too (core::security_settings): psk seals every
  // connection under keys from the token, tls also requires a certificate signed by the CA of
  // each client (store_records.h, tcp_store_wire.h).
  TcpStoreServer(const std::string& host, int port, const core::Security& security);
  ~TcpStoreServer();  // stops the thread, closes every socket
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;
  // Requests served and connections accepted so far (bench/drivers/startup.sh: store traffic per
  // rank).
  struct Stats {
    uint64_t requests = 0;
    uint64_t connections = 0;
  };
  Stats stats() const;
  // From now on, the clients it drops (one that broke off in the middle of a message, say) are not
  // warned about: the owner is ending the job (ringrun killing its ranks) and knows why.
  void quiet();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Connects to a TCP store at host:port, retrying until timeout (the server may start later than
// its clients). TimeoutError names the address if it never answers. With a non-empty token the
// client checks the server's proof of it and proves it in turn; a token on one side only, or two
// different tokens, is an Error at once (not retried) that says which.
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds timeout,
                                         const std::string& token = "");
// The same with RINGREDUCE_ENCRYPT's protection (the server's must be the same, else an Error
// says which setting differs where); tls presents this process's certificate and checks the
// server's against the CA.
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds timeout,
                                         const core::Security& security);

// The server's protocol without sockets, for the fuzzer (tests/fuzz/fuzz_store.cc) and tests:
// the same per-connection state machine (hello, proof, requests) and key-value data that a
// TcpStoreServer runs, fed bytes by the caller, with a clock that moves only in advance().
// Single-threaded; nothing is logged.
class TcpStoreProtocol {
 public:
  explicit TcpStoreProtocol(const std::string& token = "",
                            std::chrono::milliseconds stall_timeout = std::chrono::seconds(300));
  ~TcpStoreProtocol();
  TcpStoreProtocol(const TcpStoreProtocol&) = delete;
  TcpStoreProtocol& operator=(const TcpStoreProtocol&) = delete;

  // A new client connection, as accepted now; returns its id.
  uint64_t connect();
  // Bytes from the client, processed at once. False once the server has dropped or refused the
  // connection (later calls for it do nothing).
  bool receive(uint64_t conn, const uint8_t* data, size_t len);
  // The client closed its side.
  void client_closed(uint64_t conn);
  // What the server has sent the client since the last call (a refusal's bytes included).
  std::vector<uint8_t> take_output(uint64_t conn);
  bool is_open(uint64_t conn) const;
  // Moves the clock forward and runs what falls due: get/wait timeouts, handshake deadlines and
  // stall timeouts.
  void advance(std::chrono::milliseconds d);
  size_t connections() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ringreduce::rendezvous
