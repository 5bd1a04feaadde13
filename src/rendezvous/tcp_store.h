// The TCP store: a small key-value server (hosted by rank 0, by ringrun, or standalone via
// tools/ringreduce-store) and its client. One request/response protocol over TCP; every length
// read from the wire is bounded before use.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

class TcpStoreServer {
 public:
  // Listens on host:port ("0.0.0.0", "::", "127.0.0.1"...; port 0 picks a free one) and serves
  // from a background thread until destroyed. Throws ringreduce::Error if it cannot listen.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();  // stops the thread, closes every socket
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Connects to a TCP store at host:port, retrying until timeout (the server may start later than
// its clients). TimeoutError names the address if it never answers.
std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds timeout);

// Splits "host:port", "[v6addr]:port" or "v6addr" forms; InvalidArgument on garbage.
void split_host_port(const std::string& addr, std::string* host, int* port);

}  // namespace ringreduce::rendezvous
