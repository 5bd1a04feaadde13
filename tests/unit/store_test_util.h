// What the store tests share: small helpers, a raw socket that plays a broken client, and
// scoped environment settings.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "core/auth.h"
#include "core/fd.h"
#include "rendezvous/file_store.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"
#include "ringreduce/error.h"
#include "ringreduce/store.h"

namespace ringreduce::rendezvous::store_testing {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

inline std::vector<uint8_t> bytes(const std::string& s) {
  return std::vector<uint8_t>(s.begin(), s.end());
}

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A private directory for a file store, removed with everything in it at the end of the test.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "rr_store_test.XXXXXX").string();
    if (::mkdtemp(tmpl.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Joins on destruction, so that a failing assertion cannot leave a thread running (and
// std::terminate the test binary).
class JoiningThread {
 public:
  template <typename F>
  explicit JoiningThread(F&& f) : t_(std::forward<F>(f)) {}
  ~JoiningThread() { join(); }
  JoiningThread(const JoiningThread&) = delete;
  JoiningThread& operator=(const JoiningThread&) = delete;
  void join() {
    if (t_.joinable()) t_.join();
  }

 private:
  std::thread t_;
};

inline bool ipv6_loopback_available() {
  core::Fd fd(::socket(AF_INET6, SOCK_STREAM, 0));
  if (!fd.valid()) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  return ::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
}

// A port that was free a moment ago (nothing listens on it once this returns).
inline int free_port() {
  core::Fd fd(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0 ||
      ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
    throw std::runtime_error("cannot find a free port");
  return ntohs(a.sin_port);
}

class RawClient {
 public:
  RawClient(const std::string& host, int port) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (host.find(':') != std::string::npos) {
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET6, host.c_str(), &a->sin6_addr);
      len = sizeof(*a);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_port = htons(static_cast<uint16_t>(port));
      ::inet_pton(AF_INET, host.c_str(), &a->sin_addr);
      len = sizeof(*a);
    }
    fd_.reset(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd_.valid() || ::connect(fd_.get(), reinterpret_cast<sockaddr*>(&ss), len) != 0)
      throw std::runtime_error("raw connect failed");
  }

  void send(const std::vector<uint8_t>& data) {
    size_t off = 0;
    while (off < data.size()) {
      ssize_t n = ::send(fd_.get(), data.data() + off, data.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return;  // the server may already have dropped us; the caller checks that
      off += static_cast<size_t>(n);
    }
  }

  // "127.0.0.1:PORT" of this end, as the server's log lines name it.
  std::string local_address() const {
    sockaddr_in a{};
    socklen_t len = sizeof(a);
    ::getsockname(fd_.get(), reinterpret_cast<sockaddr*>(&a), &len);
    return "127.0.0.1:" + std::to_string(ntohs(a.sin_port));
  }

  // Reads exactly n bytes within the timeout; nullopt on EOF, error or timeout.
  std::optional<std::vector<uint8_t>> read(size_t n, std::chrono::milliseconds timeout) {
    std::vector<uint8_t> out(n);
    size_t have = 0;
    auto deadline = Clock::now() + timeout;
    while (have < n) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      if (left.count() <= 0) return std::nullopt;
      pollfd p{fd_.get(), POLLIN, 0};
      if (::poll(&p, 1, static_cast<int>(left.count())) <= 0) return std::nullopt;
      ssize_t r = ::recv(fd_.get(), out.data() + have, n - have, 0);
      if (r <= 0) return std::nullopt;
      have += static_cast<size_t>(r);
    }
    return out;
  }

  // Performs the hello; true if the server accepted it.
  bool hello() {
    std::vector<uint8_t> h;
    wire::append_client_hello(&h);
    send(h);
    auto reply = read(wire::kHelloBytes, 2s);
    return reply && wire::load32(reply->data()) == wire::kMagic &&
           wire::load16(reply->data() + 6) == 0;
  }

  // True once the server has closed the connection (EOF or reset), within the timeout. Any
  // bytes the server sends before closing are read and ignored.
  bool closed_by_server(std::chrono::milliseconds timeout) {
    auto deadline = Clock::now() + timeout;
    uint8_t buf[4096];
    while (Clock::now() < deadline) {
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
      pollfd p{fd_.get(), POLLIN, 0};
      int rc = ::poll(&p, 1, static_cast<int>(std::max<int64_t>(left.count(), 1)));
      if (rc <= 0) continue;
      ssize_t r = ::recv(fd_.get(), buf, sizeof(buf), MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return true;
    }
    return false;
  }

 private:
  core::Fd fd_;
};

inline std::vector<uint8_t> frame(wire::Op op, const std::vector<uint8_t>& payload) {
  std::vector<uint8_t> out;
  wire::Writer w(&out);
  w.begin(static_cast<uint8_t>(op));
  w.raw(payload.data(), payload.size());
  w.end();
  return out;
}

inline std::vector<uint8_t> set_request(const std::string& key, const std::string& value) {
  std::vector<uint8_t> payload;
  wire::Writer w(&payload);
  w.str(key);
  w.str(value);
  return frame(wire::Op::set, payload);
}

// Scoped setenv for one setting; restores the previous value.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = ::getenv(name)) old_ = old;
    ::setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_)
      ::setenv(name_, old_->c_str(), 1);
    else
      ::unsetenv(name_);
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  const char* name_;
  std::optional<std::string> old_;
};

}  // namespace ringreduce::rendezvous::store_testing
