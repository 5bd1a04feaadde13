// The TCP store server: one background thread, an epoll set, and a non-blocking state machine
// per connection (hello -> ready <-> parked, or closing after a refused hello). Nothing a client
// does can block the thread: reads and writes never wait, a request is parsed only once all of
// it has arrived, and a get/wait on a missing key parks the connection until a set (or its
// timeout) instead of having the client poll.
//
// Defences against broken or hostile clients, each of which drops only that client (with a log
// line): bad magic or version, an unknown op, a length over the wire limits, a malformed
// payload, more pipelined input than one maximal request, and a stall (no byte moved for
// RINGREDUCE_TIMEOUT) while a hello, a request or a response is half-transferred. A client idle
// between requests is left alone: rank 0's connection may rightly sit idle for the whole job.
#include "rendezvous/tcp_store.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "core/config.h"
#include "core/fd.h"
#include "core/log.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store_wire.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using core::Clock;
using std::chrono::milliseconds;

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnId = 2;

// Per wake-up limits, so that one busy client cannot starve the others.
constexpr size_t kReadBudget = size_t{4} << 20;
constexpr int kAcceptBudget = 256;
// Requests are not processed while this much response is waiting for the client to read it.
constexpr size_t kOutputHighWater = size_t{4} << 20;
// Unprocessed input beyond one maximal request means the client pipelines without reading.
constexpr size_t kMaxBufferedInput =
    wire::kFrameHeaderBytes + wire::max_request_payload(wire::Op::set) + 4096;
// How long accept() stays paused after running out of file descriptors.
constexpr milliseconds kAcceptPause(100);
// An upper bound on how long the loop sleeps, as insurance against a missed timer update.
constexpr int kMaxSleepMs = 1000;
// Prefix of the messages in bad_request responses; the client puts its own name before it.
constexpr const char* kRejected = "the server rejected the request";

std::string errno_text() {
  return std::strerror(errno);
}

struct Conn {
  enum class State { hello, ready, parked, closing };

  uint64_t id = 0;
  core::Fd fd;
  std::string peer;
  State state = State::hello;
  std::vector<uint8_t> in;  // received bytes; in[in_off..] are not yet consumed
  size_t in_off = 0;
  std::vector<uint8_t> out;  // bytes to send; out[out_off..] are not yet sent
  size_t out_off = 0;
  Clock::time_point last_progress;
  uint32_t events = 0;  // current epoll interest
  bool dead = false;

  // While parked: the request's op, the keys it still waits for, and its deadline.
  wire::Op parked_op = wire::Op::get;
  std::string parked_get_key;
  std::vector<std::string> parked_missing;
  Clock::time_point parked_deadline;

  size_t in_avail() const { return in.size() - in_off; }
  bool out_pending() const { return out_off < out.size(); }
  // True while the connection waits on the client in the middle of something.
  bool mid_transfer() const {
    return state == State::hello || out_pending() || (state == State::ready && in_avail() > 0);
  }
};

}  // namespace

struct TcpStoreServer::Impl {
  Impl(const std::string& host, int port);
  ~Impl() {
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
  void process(Conn& c);
  bool handle_hello(Conn& c);
  bool handle_request(Conn& c);
  void execute(Conn& c, wire::Op op, wire::Reader& r);
  void park(Conn& c, wire::Op op, const std::string& get_key, std::vector<std::string> missing,
            milliseconds timeout);
  void unpark(Conn& c);
  void key_set(const std::string& key);
  void respond(Conn& c, wire::Status status, const std::vector<uint8_t>& payload);
  void flush(Conn& c);
  void update_interest(Conn& c);
  void drop(Conn& c, const std::string& why);
  void check_timers();
  void run_runnable();
  void sweep();
  std::string where() const { return "TCP store on port " + std::to_string(bound_port); }

  core::Fd listen_fd;
  core::Fd epoll_fd;
  core::Fd wake_fd;
  int bound_port = -1;
  milliseconds stall_timeout{300000};

  // Everything below is touched only by the server thread.
  std::unordered_map<uint64_t, Conn> conns;
  uint64_t next_id = kFirstConnId;
  std::unordered_map<std::string, std::vector<uint8_t>> data;
  // Key -> connections parked until it is set.
  std::unordered_map<std::string, std::vector<uint64_t>> watchers;
  // Connections a set() un-parked; processed after the current event so that one connection's
  // request never runs nested inside another's.
  std::vector<uint64_t> runnable;
  bool listener_paused = false;
  Clock::time_point listener_resume;
  Clock::time_point next_timer_check = Clock::time_point::max();
  std::vector<uint8_t> scratch = std::vector<uint8_t>(256 * 1024);

  std::jthread thread;  // last: joined before the members above are destroyed
};

TcpStoreServer::Impl::Impl(const std::string& host, int port) {
  if (port < 0 || port > 65535)
    throw InvalidArgument("TCP store: port " + std::to_string(port) + " is not in 0..65535");
  // The server takes no Options, so the stall bound comes from the RINGREDUCE_TIMEOUT setting.
  double timeout_s = core::Config().number("RINGREDUCE_TIMEOUT");
  if (timeout_s > 0 && timeout_s < 1e7) stall_timeout = milliseconds(int64_t(timeout_s * 1000));

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

  RR_LOG(info, -1, "TCP store listening on ",
         join_host_port(host.empty() ? "*" : host, bound_port));
  thread = std::jthread([this] { run(); });
}

void TcpStoreServer::Impl::run() {
  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  // Runs until the destructor signals wake_fd; each pass is bounded by epoll_wait's timeout.
  for (;;) {
    int timeout_ms = kMaxSleepMs;
    auto now = Clock::now();
    auto next = next_timer_check;
    if (listener_paused) next = std::min(next, listener_resume);
    if (next != Clock::time_point::max()) {
      auto ms = std::chrono::duration_cast<milliseconds>(next - now).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, kMaxSleepMs));
    }
    int n = ::epoll_wait(epoll_fd.get(), events, kMaxEvents, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      RR_LOG(warn, -1, where(), ": epoll_wait failed (", errno_text(), "); the store stops");
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
        auto it = conns.find(id);
        if (it == conns.end() || it->second.dead) continue;
        on_event(it->second, events[i].events);
      }
      run_runnable();
      check_timers();
      run_runnable();
    } catch (const std::exception& e) {
      // Per-connection failures are handled where they happen; this is the last line of
      // defence (bad_alloc in a timer pass, ...), and the store is worth keeping alive.
      RR_LOG(warn, -1, where(), ": internal error: ", e.what());
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
        RR_LOG(warn, -1, where(), ": accept failed (", errno_text(), "); pausing accepts for ",
               kAcceptPause.count(), " ms");
        epoll_event ev{};
        ev.data.u64 = kListenerId;
        ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
        listener_paused = true;
        listener_resume = Clock::now() + kAcceptPause;
        return;
      }
      RR_LOG(warn, -1, where(), ": accept failed: ", errno_text());
      return;
    }
    core::Fd owned(fd);
    set_nodelay(fd);
    int one = 1;
    // Lets the kernel notice a peer host that vanished without closing the connection.
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    uint64_t id = next_id++;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = id;
    if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      RR_LOG(warn, -1, where(), ": epoll_ctl on a new connection failed: ", errno_text());
      continue;
    }
    Conn& c = conns[id];
    c.id = id;
    c.fd = std::move(owned);
    c.peer = describe_address(reinterpret_cast<sockaddr*>(&ss), len);
    c.events = EPOLLIN;
    c.last_progress = Clock::now();
    next_timer_check = std::min(next_timer_check, c.last_progress + stall_timeout);
    RR_LOG(trace, -1, where(), ": client ", c.peer, " connected");
  }
}

void TcpStoreServer::Impl::on_event(Conn& c, uint32_t events) {
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
  while (budget > 0) {
    if (c.in_off > 0 && c.in_off == c.in.size()) {
      c.in.clear();
      c.in_off = 0;
    }
    if (c.in_avail() > kMaxBufferedInput) {
      drop(c, "sent more than one maximal request without reading the responses");
      return;
    }
    // Into a scratch buffer first: growing c.in by a chunk per recv would zero the chunk each
    // time, which costs more than copying the few bytes a typical request has.
    ssize_t n = ::recv(c.fd.get(), scratch.data(), std::min(budget, scratch.size()), MSG_DONTWAIT);
    if (n > 0) c.in.insert(c.in.end(), scratch.data(), scratch.data() + n);
    if (n > 0) {
      budget -= static_cast<size_t>(n);
      c.last_progress = Clock::now();
      next_timer_check = std::min(next_timer_check, c.last_progress + stall_timeout);
      continue;
    }
    if (n == 0) {
      if (c.mid_transfer() && !(c.state == Conn::State::hello && c.in_avail() == 0))
        drop(c, "closed the connection in the middle of a message");
      else {
        RR_LOG(trace, -1, where(), ": client ", c.peer, " disconnected");
        c.dead = true;
      }
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    drop(c, "receive failed: " + errno_text());
    return;
  }
}

void TcpStoreServer::Impl::process(Conn& c) {
  // Bounded: every pass consumes a complete hello or request from c.in, or returns.
  while (!c.dead) {
    if (c.state == Conn::State::parked || c.state == Conn::State::closing) return;
    if (c.out.size() - c.out_off > kOutputHighWater) return;
    bool progressed = false;
    try {
      progressed = c.state == Conn::State::hello ? handle_hello(c) : handle_request(c);
    } catch (const wire::ProtocolError& e) {
      drop(c, std::string("malformed request: ") + e.what());
      return;
    }
    if (!progressed) return;
  }
}

bool TcpStoreServer::Impl::handle_hello(Conn& c) {
  if (c.in_avail() < wire::kHelloBytes) return false;
  const uint8_t* p = c.in.data() + c.in_off;
  uint32_t magic = wire::load32(p);
  uint16_t version = wire::load16(p + 4);
  uint16_t auth = wire::load16(p + 6);
  uint32_t auth_len = wire::load32(p + 8);
  if (magic != wire::kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x (not a ringreduce store client)", magic);
    drop(c, buf);
    return false;
  }
  if (auth_len > wire::kMaxAuthBytes) {
    drop(c, "hello announces " + std::to_string(auth_len) + " bytes of authentication data");
    return false;
  }
  if (c.in_avail() < wire::kHelloBytes + auth_len) return false;
  c.in_off += wire::kHelloBytes + auth_len;
  if (version != wire::kVersion) {
    // Answer before closing, so that the client can say which versions disagree.
    RR_LOG(warn, -1, where(), ": client ", c.peer, " speaks protocol version ", version,
           ", this server ", wire::kVersion, "; closing");
    wire::append_server_hello(&c.out, wire::HelloStatus::bad_version);
    c.state = Conn::State::closing;
    flush(c);
    return false;
  }
  // The authentication step goes here: for an auth method other than none the server will send
  // a challenge in its hello and enter an `auth` state that checks the client's proof.
  if (auth != static_cast<uint16_t>(wire::Auth::none) || auth_len != 0) {
    RR_LOG(warn, -1, where(), ": client ", c.peer, " asks for authentication method ", auth,
           ", which this server does not offer; closing");
    wire::append_server_hello(&c.out, wire::HelloStatus::auth_unsupported);
    c.state = Conn::State::closing;
    flush(c);
    return false;
  }
  wire::append_server_hello(&c.out, wire::HelloStatus::ok);
  c.state = Conn::State::ready;
  RR_LOG(trace, -1, where(), ": client ", c.peer, " said hello");
  flush(c);
  return !c.dead;
}

bool TcpStoreServer::Impl::handle_request(Conn& c) {
  if (c.in_avail() < wire::kFrameHeaderBytes) return false;
  const uint8_t* p = c.in.data() + c.in_off;
  uint8_t op = p[0];
  uint32_t len = wire::load32(p + 1);
  if (!wire::valid_op(op)) {
    drop(c, "unknown op " + std::to_string(op));
    return false;
  }
  if (len > wire::max_request_payload(static_cast<wire::Op>(op))) {
    drop(c, std::string(wire::op_name(static_cast<wire::Op>(op))) + " request of " +
                std::to_string(len) + " bytes exceeds the limit of " +
                std::to_string(wire::max_request_payload(static_cast<wire::Op>(op))));
    return false;
  }
  if (c.in_avail() < wire::kFrameHeaderBytes + len) return false;
  wire::Reader r(p + wire::kFrameHeaderBytes, len);
  execute(c, static_cast<wire::Op>(op), r);
  c.in_off += wire::kFrameHeaderBytes + len;
  if (c.in_off == c.in.size()) {
    // Keep the buffer's capacity only while it is small: a 64 MiB set should not pin 64 MiB.
    if (c.in.capacity() > (size_t{1} << 20)) std::vector<uint8_t>().swap(c.in);
    c.in.clear();
    c.in_off = 0;
  }
  return !c.dead;
}

void TcpStoreServer::Impl::execute(Conn& c, wire::Op op, wire::Reader& r) {
  std::vector<uint8_t> payload;
  wire::Writer w(&payload);
  switch (op) {
    case wire::Op::set: {
      std::string key = r.key();
      std::vector<uint8_t> value = r.value();
      r.expect_end();
      data[key] = std::move(value);
      respond(c, wire::Status::ok, payload);
      key_set(key);
      return;
    }
    case wire::Op::get: {
      milliseconds timeout(static_cast<int64_t>(std::min<uint64_t>(r.u64(), INT64_MAX / 2)));
      std::string key = r.key();
      r.expect_end();
      auto it = data.find(key);
      if (it != data.end()) {
        w.bytes(it->second.data(), it->second.size());
        respond(c, wire::Status::ok, payload);
      } else {
        park(c, op, key, {key}, timeout);
      }
      return;
    }
    case wire::Op::add: {
      std::string key = r.key();
      int64_t delta = static_cast<int64_t>(r.u64());
      r.expect_end();
      int64_t result = 0;
      try {
        auto it = data.find(key);
        int64_t current = it == data.end() ? 0 : parse_counter(kRejected, key, it->second);
        result = add_counter(kRejected, key, current, delta);
      } catch (const InvalidArgument& e) {
        std::string msg = std::string(e.what()).substr(0, wire::kMaxMessageBytes);
        w.str(msg);
        respond(c, wire::Status::bad_request, payload);
        return;
      }
      data[key] = format_counter(result);
      w.u64(static_cast<uint64_t>(result));
      respond(c, wire::Status::ok, payload);
      key_set(key);
      return;
    }
    case wire::Op::wait: {
      milliseconds timeout(static_cast<int64_t>(std::min<uint64_t>(r.u64(), INT64_MAX / 2)));
      std::vector<std::string> keys = r.keys();
      r.expect_end();
      std::vector<std::string> missing;
      for (auto& k : keys)
        if (data.count(k) == 0) missing.push_back(std::move(k));
      if (missing.empty())
        respond(c, wire::Status::ok, payload);
      else
        park(c, op, "", std::move(missing), timeout);
      return;
    }
    case wire::Op::check: {
      std::vector<std::string> keys = r.keys();
      r.expect_end();
      bool all = std::all_of(keys.begin(), keys.end(),
                             [&](const std::string& k) { return data.count(k) > 0; });
      w.u8(all ? 1 : 0);
      respond(c, wire::Status::ok, payload);
      return;
    }
  }
}

void TcpStoreServer::Impl::park(Conn& c, wire::Op op, const std::string& get_key,
                                std::vector<std::string> missing, milliseconds timeout) {
  // The deadline is kept here, on the server, so that the client's connection stays in step: it
  // always gets exactly one response, a value or a timeout naming the missing keys.
  auto deadline = store_deadline(timeout).at();
  if (Clock::now() >= deadline) {
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(static_cast<uint32_t>(missing.size()));
    for (const auto& k : missing) w.str(k);
    respond(c, wire::Status::timeout, payload);
    return;
  }
  c.state = Conn::State::parked;
  c.parked_op = op;
  c.parked_get_key = get_key;
  c.parked_missing = std::move(missing);
  c.parked_deadline = deadline;
  for (const auto& k : c.parked_missing) watchers[k].push_back(c.id);
  next_timer_check = std::min(next_timer_check, deadline);
}

void TcpStoreServer::Impl::unpark(Conn& c) {
  for (const auto& k : c.parked_missing) {
    auto it = watchers.find(k);
    if (it == watchers.end()) continue;
    std::erase(it->second, c.id);
    if (it->second.empty()) watchers.erase(it);
  }
  c.parked_missing.clear();
  c.parked_get_key.clear();
  c.state = Conn::State::ready;
}

void TcpStoreServer::Impl::key_set(const std::string& key) {
  auto node = watchers.extract(key);
  if (node.empty()) return;
  for (uint64_t id : node.mapped()) {
    auto it = conns.find(id);
    if (it == conns.end() || it->second.dead || it->second.state != Conn::State::parked) continue;
    Conn& w = it->second;
    std::erase_if(w.parked_missing, [&](const std::string& k) { return data.count(k) > 0; });
    if (!w.parked_missing.empty()) continue;  // still registered under its other keys
    std::vector<uint8_t> payload;
    if (w.parked_op == wire::Op::get) {
      const auto& v = data.at(w.parked_get_key);
      wire::Writer(&payload).bytes(v.data(), v.size());
    }
    unpark(w);
    respond(w, wire::Status::ok, payload);
    runnable.push_back(w.id);
  }
}

void TcpStoreServer::Impl::respond(Conn& c, wire::Status status,
                                   const std::vector<uint8_t>& payload) {
  if (!c.out_pending()) {
    c.out.clear();
    c.out_off = 0;
    // The stall clock for a response starts when it is queued, not when the request arrived.
    c.last_progress = Clock::now();
    next_timer_check = std::min(next_timer_check, c.last_progress + stall_timeout);
  }
  wire::Writer w(&c.out);
  w.begin(static_cast<uint8_t>(status));
  w.raw(payload.data(), payload.size());
  w.end();
  // Most responses fit the socket buffer: sending now saves an epoll round trip.
  flush(c);
}

void TcpStoreServer::Impl::flush(Conn& c) {
  // Bounded: every pass sends at least one byte or returns.
  while (c.out_pending() && !c.dead) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      c.out_off += static_cast<size_t>(n);
      c.last_progress = Clock::now();
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c, "send failed: " + errno_text());
    return;
  }
  if (!c.out_pending()) {
    if (c.out.capacity() > (size_t{1} << 20)) std::vector<uint8_t>().swap(c.out);
    c.out.clear();
    c.out_off = 0;
    if (c.state == Conn::State::closing) c.dead = true;  // the refusal has been delivered
  }
}

void TcpStoreServer::Impl::update_interest(Conn& c) {
  if (c.dead) return;
  uint32_t want = EPOLLIN | (c.out_pending() ? EPOLLOUT : 0u);
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    drop(c, "epoll_ctl failed: " + errno_text());
    return;
  }
  c.events = want;
}

void TcpStoreServer::Impl::drop(Conn& c, const std::string& why) {
  if (c.dead) return;
  RR_LOG(warn, -1, where(), ": dropping client ", c.peer, ": ", why);
  c.dead = true;
}

void TcpStoreServer::Impl::check_timers() {
  auto now = Clock::now();
  if (listener_paused && now >= listener_resume) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kListenerId;
    ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
    listener_paused = false;
  }
  if (now < next_timer_check) return;
  auto next = Clock::time_point::max();
  for (auto& [id, c] : conns) {
    if (c.dead) continue;
    if (c.state == Conn::State::parked) {
      if (now >= c.parked_deadline) {
        std::vector<uint8_t> payload;
        wire::Writer w(&payload);
        w.u32(static_cast<uint32_t>(c.parked_missing.size()));
        for (const auto& k : c.parked_missing) w.str(k);
        unpark(c);
        respond(c, wire::Status::timeout, payload);
        runnable.push_back(c.id);
      } else {
        next = std::min(next, c.parked_deadline);
      }
    }
    if (!c.dead && c.mid_transfer()) {
      if (now - c.last_progress >= stall_timeout) {
        drop(c, "stalled for " + std::to_string(stall_timeout.count()) + " ms in the middle of a " +
                    (c.state == Conn::State::hello ? "hello"
                     : c.out_pending()             ? "response"
                                                   : "request"));
      } else {
        next = std::min(next, c.last_progress + stall_timeout);
      }
    }
    if (!c.dead) update_interest(c);
  }
  next_timer_check = next;
}

void TcpStoreServer::Impl::run_runnable() {
  // Bounded: each pass takes the whole queue, and a connection is queued again only when
  // another connection's set() un-parks it, which consumes that set's input.
  while (!runnable.empty()) {
    std::vector<uint64_t> batch;
    batch.swap(runnable);
    for (uint64_t id : batch) {
      auto it = conns.find(id);
      if (it == conns.end() || it->second.dead) continue;
      Conn& c = it->second;
      try {
        process(c);
        update_interest(c);
      } catch (const std::exception& e) {
        drop(c, std::string("internal error: ") + e.what());
      }
    }
  }
}

void TcpStoreServer::Impl::sweep() {
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second.dead) {
      if (it->second.state == Conn::State::parked) unpark(it->second);
      it = conns.erase(it);  // closes the socket, which also removes it from the epoll set
    } else {
      ++it;
    }
  }
}

TcpStoreServer::TcpStoreServer(const std::string& host, int port)
    : impl_(std::make_unique<Impl>(host, port)) {}

TcpStoreServer::~TcpStoreServer() = default;

int TcpStoreServer::port() const {
  return impl_->bound_port;
}

}  // namespace ringreduce::rendezvous
