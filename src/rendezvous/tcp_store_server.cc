// The TCP store server: one background thread and an epoll set around a StoreEngine
// (store_engine.h), which holds the protocol, the data and the defences against broken or
// hostile clients; and TcpStoreProtocol, the same engine without sockets, for the fuzzer.
// Nothing a client does can block the thread: reads and writes never wait, and a get/wait on a
// missing key parks the connection until a set (or its timeout) instead of having the client
// poll.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "core/auth.h"
#include "core/config.h"
#include "core/fd.h"
#include "core/log.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/store_engine.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"
#include "rendezvous/tls_handshakes.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using std::chrono::milliseconds;
using store_server::Clock;
using store_server::Conn;
using store_server::kHandshakeLimit;
using store_server::kOutputHighWater;
using store_server::StoreEngine;

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kTlsId = 2;  // a TLS handshake has ended (tls_handshakes.h)
constexpr uint64_t kFirstConnId = 3;

// Per wake-up limits, so that one busy client cannot starve the others.
constexpr size_t kReadBudget = size_t{4} << 20;
constexpr int kAcceptBudget = 256;
// How long accept() stays paused after running out of file descriptors.
constexpr milliseconds kAcceptPause(100);
// An upper bound on how long the loop sleeps, as insurance against a missed timer update.
constexpr int kMaxSleepMs = 1000;

using core::errno_text;

}  // namespace

struct TcpStoreServer::Impl final : StoreEngine {
  Impl(const std::string& host, int port, const core::Security& security,
       milliseconds stall_timeout);
  ~Impl() override {
    // Wake the loop; it returns, and the jthread (declared last, destroyed first) joins it
    // before any descriptor it uses is closed.
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd.get(), &one, sizeof(one));
    (void)ignored;
  }

  void run();
  void accept_all();
  void on_event(Conn& c, uint32_t events);
  void read_some(Conn& c);
  void tls_ended();

  Clock::time_point now() const override { return Clock::now(); }
  void flush(Conn& c) override;
  void update_interest(Conn& c) override;
  void start_tls(Conn& c) override;
  void begin_tls(Conn& c);

  core::Fd listen_fd;
  core::Fd epoll_fd;
  core::Fd wake_fd;
  int bound_port = -1;

  // Everything below, and the engine's state, is touched only by the server thread.
  bool listener_paused = false;
  Clock::time_point listener_resume;
  std::vector<uint8_t> scratch = std::vector<uint8_t>(256 * 1024);
  std::unique_ptr<TlsHandshakes> tls;  // RINGREDUCE_ENCRYPT=tls

  std::jthread thread;  // last: joined before the members above are destroyed
};

// The server takes no Options, so the stall bound comes from the RINGREDUCE_TIMEOUT setting.
milliseconds stall_timeout_setting() {
  double timeout_s = core::Config().number("RINGREDUCE_TIMEOUT");
  if (timeout_s > 0 && timeout_s < 1e7) return milliseconds(int64_t(timeout_s * 1000));
  return milliseconds(300000);
}

TcpStoreServer::Impl::Impl(const std::string& host, int port, const core::Security& security,
                           milliseconds stall_timeout)
    : StoreEngine(security, stall_timeout, /*log_drops=*/true, kFirstConnId) {
  // Proofs are made in the serving thread, where a missing libcrypto would only drop clients.
  if (!security.token.empty() || security.encrypt != core::Encrypt::off)
    core::auth::require_crypto();
  if (security.encrypt == core::Encrypt::tls) tls = std::make_unique<TlsHandshakes>(security.tls);
  if (port < 0 || port > 65535)
    throw InvalidArgument("TCP store: port " + std::to_string(port) + " is not in 0..65535");

  std::string error;
  AddrInfoList addrs = resolve_tcp(host, port, /*passive=*/true, &error);
  if (!addrs)
    throw Error("TCP store: cannot listen on " + join_host_port(host, port) + ": " + error);
  std::string failures;
  for (addrinfo* ai = addrs.get(); ai != nullptr && !listen_fd.valid(); ai = ai->ai_next) {
    core::Fd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      failures += " socket: " + errno_text() + ";";
      continue;
    }
    int one = 1;
    // A restarted server must be able to bind while old connections linger in TIME_WAIT.
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      // "::" should also accept IPv4 clients, whatever the system default for v6only is.
      int zero = 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    std::string addr = describe_address(ai->ai_addr, ai->ai_addrlen);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      failures += " bind " + addr + ": " + errno_text() + ";";
      continue;
    }
    // Every rank connects at start-up at about the same moment: ask for the longest backlog.
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      failures += " listen " + addr + ": " + errno_text() + ";";
      continue;
    }
    listen_fd = std::move(fd);
  }
  if (!listen_fd.valid())
    throw Error("TCP store: cannot listen on " + join_host_port(host, port) + ":" + failures);

  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(listen_fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw Error("TCP store: getsockname: " + errno_text());
  bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  where = "TCP store on port " + std::to_string(bound_port);

  epoll_fd.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) throw Error("TCP store: epoll_create1: " + errno_text());
  wake_fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd.valid()) throw Error("TCP store: eventfd: " + errno_text());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, listen_fd.get(), &ev) != 0)
    throw Error("TCP store: epoll_ctl: " + errno_text());
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) != 0)
    throw Error("TCP store: epoll_ctl: " + errno_text());
  ev.data.u64 = kTlsId;
  if (tls && ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, tls->ready_fd(), &ev) != 0)
    throw Error("TCP store: epoll_ctl: " + errno_text());

  RR_LOG(info, store, -1, "TCP store listening on ",
         join_host_port(host.empty() ? "*" : host, bound_port),
         security.encrypt == core::Encrypt::tls
             ? " (TLS: clients must present a certificate signed by RINGREDUCE_TLS_CA; "
               "connections encrypted)"
         : security.encrypt == core::Encrypt::psk
             ? " (clients must prove they hold RINGREDUCE_TOKEN; connections encrypted)"
         : security.token.empty() ? " (no RINGREDUCE_TOKEN: connections are not authenticated)"
                                  : " (clients must prove they hold RINGREDUCE_TOKEN)");
  thread = std::jthread([this] { run(); });
}

void TcpStoreServer::Impl::run() {
  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  // Runs until the destructor signals wake_fd; each pass is bounded by epoll_wait's timeout.
  for (;;) {
    int timeout_ms = kMaxSleepMs;
    auto t = Clock::now();
    auto next = next_timer_check;
    if (listener_paused) next = std::min(next, listener_resume);
    if (next != Clock::time_point::max()) {
      auto ms = std::chrono::duration_cast<milliseconds>(next - t).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, kMaxSleepMs));
    }
    int n = ::epoll_wait(epoll_fd.get(), events, kMaxEvents, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      RR_LOG(warn, store, -1, where, ": epoll_wait failed (", errno_text(), "); the store stops");
      return;
    }
    try {
      for (int i = 0; i < n; ++i) {
        uint64_t id = events[i].data.u64;
        if (id == kWakeId) return;
        if (id == kListenerId) {
          accept_all();
          continue;
        }
        if (id == kTlsId) {
          tls_ended();
          continue;
        }
        auto it = conns.find(id);
        if (it == conns.end() || it->second.dead) continue;
        on_event(it->second, events[i].events);
      }
      run_runnable();
      if (listener_paused && Clock::now() >= listener_resume) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenerId;
        ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
        listener_paused = false;
      }
      check_timers();
      run_runnable();
    } catch (const std::exception& e) {
      // Per-connection failures are handled where they happen; this is the last line of
      // defence (bad_alloc in a timer pass, ...), and the store is worth keeping alive.
      RR_LOG(warn, store, -1, where, ": internal error: ", e.what());
    }
    sweep();
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (int i = 0; i < kAcceptBudget; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays in the backlog; stop polling the listener for a while
        // rather than spinning on it until a descriptor is freed.
        RR_LOG(warn, store, -1, where, ": accept failed (", errno_text(), "); pausing accepts for ",
               kAcceptPause.count(), " ms");
        epoll_event ev{};
        ev.data.u64 = kListenerId;
        ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
        listener_paused = true;
        listener_resume = Clock::now() + kAcceptPause;
        return;
      }
      RR_LOG(warn, store, -1, where, ": accept failed: ", errno_text());
      return;
    }
    core::Fd owned(fd);
    set_nodelay(fd);
    int one = 1;
    // Lets the kernel notice a peer host that vanished without closing the connection.
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    std::string peer = describe_address(reinterpret_cast<sockaddr*>(&ss), len);
    Conn& c = add_conn(std::move(owned), std::move(peer));
    update_interest(c);  // into the set
    if (c.dead) continue;
    RR_LOG(trace, store, -1, where, ": client ", c.peer, " connected");
  }
}

void TcpStoreServer::Impl::on_event(Conn& c, uint32_t events) {
  if (c.state == Conn::State::tls) {
    // Its ClientHello (or its end) has arrived: the handshake thread reads it, not this loop.
    if (!c.tls_started) begin_tls(c);
    return;
  }
  try {
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_some(c);
    if (!c.dead && (events & EPOLLOUT)) flush(c);
    if (!c.dead) process(c);
    if (!c.dead) update_interest(c);
  } catch (const std::exception& e) {
    // bad_alloc and the like: lose this client, never the server.
    drop(c, std::string("internal error: ") + e.what());
  }
}

void TcpStoreServer::Impl::read_some(Conn& c) {
  size_t budget = kReadBudget;
  // Bounded by the budget: every pass reads at least one byte or returns.
  while (budget > 0 && !c.dead) {
    // Into a scratch buffer first: growing c.in by a chunk per recv would zero the chunk each
    // time, which costs more than copying the few bytes a typical request has.
    ssize_t n = ::recv(c.fd.get(), scratch.data(), std::min(budget, scratch.size()), MSG_DONTWAIT);
    if (n > 0) {
      on_input(c, scratch.data(), static_cast<size_t>(n));
      budget -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      on_eof(c);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    drop(c, "receive failed: " + errno_text());
    return;
  }
}

void TcpStoreServer::Impl::flush(Conn& c) {
  // Bounded: every pass sends at least one byte or returns.
  while (c.out_pending() && !c.dead) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent(c, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c, "send failed: " + errno_text());
    return;
  }
  if (!c.dead) sent(c, 0);  // nothing was pending: a refusal already delivered closes now
}

void TcpStoreServer::Impl::start_tls(Conn& c) {
  // The socket stays in the set, unread, until the client's first TLS bytes arrive (on_event):
  // only then does a handshake thread take it, so a stranger that says hello and then nothing
  // holds no thread.
  update_interest(c);
}

void TcpStoreServer::Impl::begin_tls(Conn& c) {
  // The socket is the handshake thread's until it ends: out of the set meanwhile.
  ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_DEL, c.fd.get(), nullptr);
  c.events = 0;
  c.tls_started = true;
  tls->start(c.id, c.fd.get(), c.key_context, core::Deadline(c.handshake_deadline));
}

void TcpStoreServer::Impl::tls_ended() {
  for (auto& r : tls->take()) {
    auto it = conns.find(r.id);
    if (it == conns.end() || it->second.dead) continue;
    Conn& c = it->second;
    tls_done(c, r.secret ? &*r.secret : nullptr, r.error);
    update_interest(c);  // back into the set
  }
}

void TcpStoreServer::Impl::update_interest(Conn& c) {
  if (c.dead || (c.state == Conn::State::tls && c.tls_started)) return;
  uint32_t want = EPOLLIN | (c.out_pending() ? EPOLLOUT : 0u);
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  // events 0: not in the set (a new connection, or one back from its TLS handshake).
  if (::epoll_ctl(epoll_fd.get(), c.events == 0 ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, c.fd.get(), &ev) !=
      0) {
    drop(c, "epoll_ctl failed: " + errno_text());
    return;
  }
  c.events = want;
}

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const std::string& token)
    : TcpStoreServer(host, port, core::Security{token, core::Encrypt::off, {}}) {}

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const core::Security& security)
    : impl_(std::make_unique<Impl>(host, port, security, stall_timeout_setting())) {}

TcpStoreServer::~TcpStoreServer() = default;

int TcpStoreServer::port() const {
  return impl_->bound_port;
}

void TcpStoreServer::quiet() {
  impl_->quiet.store(true, std::memory_order_relaxed);
}

TcpStoreServer::Stats TcpStoreServer::stats() const {
  return {impl_->requests_served.load(std::memory_order_relaxed),
          impl_->connections_accepted.load(std::memory_order_relaxed)};
}

// ---------------------------------------------------------------------------------------------
// TcpStoreProtocol: the engine with a hand-moved clock and output kept for the caller.

struct TcpStoreProtocol::Impl final : StoreEngine {
  Impl(const std::string& token, milliseconds stall_timeout)
      : StoreEngine(core::Security{token, core::Encrypt::off, {}}, stall_timeout,
                    /*log_drops=*/false, 1) {
    where = "TCP store protocol";
  }
  Clock::time_point now() const override { return clock; }
  void flush(Conn&) override {}  // output stays in c.out until take_output()
  void update_interest(Conn&) override {}

  Conn* find(uint64_t id) {
    auto it = conns.find(id);
    return it == conns.end() ? nullptr : &it->second;
  }

  // Far from the epoch, so that nothing computed from it can underflow.
  Clock::time_point clock = Clock::time_point() + std::chrono::hours(24);
};

TcpStoreProtocol::TcpStoreProtocol(const std::string& token, std::chrono::milliseconds stall)
    : impl_(std::make_unique<Impl>(token, stall)) {}

TcpStoreProtocol::~TcpStoreProtocol() = default;

uint64_t TcpStoreProtocol::connect() {
  impl_->sweep();
  return impl_->add_conn(core::Fd(), "client " + std::to_string(impl_->conns.size())).id;
}

bool TcpStoreProtocol::receive(uint64_t conn, const uint8_t* data, size_t len) {
  Conn* c = impl_->find(conn);
  if (c == nullptr || c->dead) return false;
  try {
    impl_->on_input(*c, data, len);
    impl_->process(*c);
    impl_->run_runnable();
  } catch (const std::exception& e) {
    impl_->drop(*c, std::string("internal error: ") + e.what());
  }
  return !c->dead;
}

void TcpStoreProtocol::client_closed(uint64_t conn) {
  if (Conn* c = impl_->find(conn)) impl_->on_eof(*c);
  impl_->sweep();
}

std::vector<uint8_t> TcpStoreProtocol::take_output(uint64_t conn) {
  Conn* c = impl_->find(conn);
  if (c == nullptr) return {};
  std::vector<uint8_t> out(c->out.begin() + static_cast<ptrdiff_t>(c->out_off), c->out.end());
  impl_->sent(*c, out.size());
  if (!c->dead) {
    // Output delivered may let a connection held back by kOutputHighWater go on.
    impl_->process(*c);
    impl_->run_runnable();
  }
  return out;
}

bool TcpStoreProtocol::is_open(uint64_t conn) const {
  auto it = impl_->conns.find(conn);
  return it != impl_->conns.end() && !it->second.dead;
}

void TcpStoreProtocol::advance(std::chrono::milliseconds d) {
  impl_->clock +=
      std::clamp(d, std::chrono::milliseconds(0), std::chrono::milliseconds(int64_t{1} << 40));
  impl_->check_timers();
  impl_->run_runnable();
}

size_t TcpStoreProtocol::connections() const {
  size_t n = 0;
  for (const auto& [id, c] : impl_->conns) n += c.dead ? 0 : 1;
  return n;
}

}  // namespace ringreduce::rendezvous
