#include "transport/control.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::transport {
namespace {

// Epoll tags: the kind in the top bits, a peer or an incoming connection's id below.
constexpr uint64_t kListenerTag = 0;
constexpr uint64_t kOutTag = 1ull << 62;
constexpr uint64_t kInTag = 2ull << 62;
constexpr uint64_t kTagMask = 3ull << 62;

// A connection that has not finished its hello within this is a stranger and is dropped (the
// data listener's rule): a hello is 100 bytes written at once after the connect.
constexpr auto kHelloGrace = std::chrono::seconds(10);

// Control connections of communicator `id` carry this id in their hello, so that a data
// connection sent to the control port by mistake, or the reverse, is a stranger.
uint64_t control_id(uint64_t id) {
  return id ^ 0xc0a7c0a7c0a7c0a7ull;
}

}  // namespace

ControlPlane::ControlPlane(Options options) : opts_(std::move(options)) {
  const auto n = static_cast<size_t>(opts_.size);
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) throw Error("control plane: epoll_create1 failed: " + core::errno_text());
  expect_.comm_id = control_id(opts_.comm_id);
  expect_.rank = opts_.rank;
  expect_.size = opts_.size;
  expect_.channels = 1;
  expect_.token = opts_.token;
  expect_.nonce = opts_.nonce;
  addr_.resize(n);
  nonce_.resize(n);
  addr_ok_.assign(n, false);
  for (size_t q = 0; q < n && q < opts_.published.size(); ++q) {
    std::string nonce;
    if (!tcp::parse_published(opts_.published[q], &addr_[q], &nonce)) continue;
    // The token's presence was checked by the data listener's address (TcpKind, the join's
    // settings); a peer whose nonce does not parse simply cannot be reached here.
    if (!opts_.token.empty() && !core::auth::nonce_from_hex(nonce, &nonce_[q])) continue;
    addr_ok_[q] = true;
  }
  out_.resize(n);
  in_of_.assign(n, 0);
  out_why_.assign(n, "");
  reported_.assign(n, false);
  sent_.assign(n, 0);
  received_.assign(n, 0);
  last_heard_.assign(n, core::Clock::time_point{});
  if (opts_.listener.valid()) {
    tcp::set_nonblocking(opts_.listener.get());
    watch(opts_.listener.get(), kListenerTag, false);
  }
}

ControlPlane::~ControlPlane() = default;

void ControlPlane::watch(int fd, uint64_t tag, bool write) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (write ? EPOLLOUT : 0u);
  ev.data.u64 = tag;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
    throw Error("control plane: epoll_ctl failed: " + core::errno_text());
}

void ControlPlane::rewatch(int fd, uint64_t tag, bool write) {
  epoll_event ev{};
  ev.events = EPOLLIN | EPOLLRDHUP | (write ? EPOLLOUT : 0u);
  ev.data.u64 = tag;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, fd, &ev);
}

void ControlPlane::send(int peer, std::string message) {
  if (peer < 0 || peer >= opts_.size || peer == opts_.rank || reported_[static_cast<size_t>(peer)])
    return;
  Outgoing& o = out_[static_cast<size_t>(peer)];
  if (o.state == Outgoing::State::failed) return;
  const auto len = static_cast<uint32_t>(message.size());
  ++sent_[static_cast<size_t>(peer)];
  o.pending.append(reinterpret_cast<const char*>(&len), sizeof len);
  o.pending += message;
  if (o.state == Outgoing::State::none)
    start_connect(peer);
  else if (o.state == Outgoing::State::open)
    flush(peer);
}

void ControlPlane::start_connect(int peer) {
  const auto q = static_cast<size_t>(peer);
  Outgoing& o = out_[q];
  if (!addr_ok_[q]) {
    fail_outgoing(peer, "published no control address this rank can read");
    return;
  }
  core::Fd fd(socket(addr_[q].family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) {
    fail_outgoing(peer, "socket() failed: " + core::errno_text());
    return;
  }
  int one = 1;
  setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  const int rc =
      ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&addr_[q].storage), addr_[q].len);
  if (rc != 0 && errno != EINPROGRESS) {
    fail_outgoing(peer, "could not connect to " + addr_[q].str() + ": " + core::errno_text());
    return;
  }
  tcp::Hello h;
  h.comm_id = control_id(opts_.comm_id);
  h.rank = opts_.rank;
  h.world_size = opts_.size;
  h.channel = 0;
  core::auth::Nonce own{};
  const std::vector<uint8_t> hello = tcp::connector_hello(h, opts_.token, nonce_[q], &own);
  o.pending.insert(0, reinterpret_cast<const char*>(hello.data()), hello.size());
  o.fd = std::move(fd);
  o.state = Outgoing::State::connecting;
  o.want_write = true;
  watch(o.fd.get(), kOutTag | q, true);
}

void ControlPlane::flush(int peer) {
  Outgoing& o = out_[static_cast<size_t>(peer)];
  while (!o.pending.empty()) {
    const ssize_t n = ::send(o.fd.get(), o.pending.data(), o.pending.size(), MSG_NOSIGNAL);
    if (n > 0) {
      o.pending.erase(0, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
    fail_outgoing(peer, std::string("its connection failed: ") + core::errno_text());
    return;
  }
  const bool want = !o.pending.empty();
  if (want != o.want_write) {
    o.want_write = want;
    rewatch(o.fd.get(), kOutTag | static_cast<uint64_t>(peer), want);
  }
}

void ControlPlane::fail_outgoing(int peer, const std::string& why) {
  const auto q = static_cast<size_t>(peer);
  Outgoing& o = out_[q];
  if (o.fd.valid()) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, o.fd.get(), nullptr);
  o.fd.reset();
  o.pending.clear();
  o.state = Outgoing::State::failed;
  if (out_why_[q].empty()) out_why_[q] = why;
  RR_LOG(info, ft, opts_.rank, "control connection to rank ", peer, ": ", why);
}

void ControlPlane::on_outgoing(int peer, uint32_t events) {
  Outgoing& o = out_[static_cast<size_t>(peer)];
  if (o.state == Outgoing::State::connecting && (events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(o.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      fail_outgoing(peer, (err == ECONNREFUSED ? std::string("refused the connection")
                                               : "could not be reached: " + core::errno_text(err)));
      return;
    }
    o.state = Outgoing::State::open;
  }
  if (o.state != Outgoing::State::open) return;
  if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
    // The acceptor never writes: readable means closed or reset.
    char c;
    const ssize_t n = ::recv(o.fd.get(), &c, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      fail_outgoing(peer, n == 0 ? std::string("closed its end of the control connection")
                                 : "its control connection failed: " + core::errno_text());
      return;
    }
  }
  if (events & EPOLLOUT) flush(peer);
}

void ControlPlane::accept_all() {
  for (int i = 0; i < 1024; ++i) {
    core::Fd fd(accept4(opts_.listener.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
    if (!fd.valid()) return;
    const uint64_t id = next_in_++;
    Incoming in;
    in.hello = std::make_unique<tcp::HelloReader>(&expect_);
    in.accepted = core::Clock::now();
    watch(fd.get(), kInTag | id, false);
    in.fd = std::move(fd);
    in_.emplace(id, std::move(in));
    // What has arrived with the connection (the hello, often a message) is read now.
    on_incoming(id, EPOLLIN);
  }
}

void ControlPlane::close_incoming(uint64_t id, const std::string& why) {
  auto it = in_.find(id);
  if (it == in_.end()) return;
  const int peer = it->second.peer;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
  in_.erase(it);
  if (peer < 0) {
    RR_LOG(info, ft, opts_.rank, "control plane: dropped a connection: ", why);
    return;
  }
  const auto q = static_cast<size_t>(peer);
  if (in_of_[q] == id) in_of_[q] = 0;
  if (!reported_[q]) {
    reported_[q] = true;
    Event e;
    e.kind = Event::Kind::lost;
    e.peer = peer;
    e.why = why;
    events_.push_back(std::move(e));
  }
}

void ControlPlane::on_incoming(uint64_t id, uint32_t events) {
  auto it = in_.find(id);
  if (it == in_.end()) return;
  Incoming& in = it->second;
  char buf[16384];
  bool ended = false;
  std::string why;
  for (;;) {
    size_t want = sizeof buf;
    if (in.hello) want = in.hello->want();
    const ssize_t n = ::recv(in.fd.get(), buf, want, MSG_DONTWAIT);
    if (n == 0) {
      ended = true;
      why = "closed its control connection";
      break;
    }
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        ended = true;
        why = "its control connection failed: " + core::errno_text();
      }
      break;
    }
    if (in.hello) {
      const auto st = in.hello->feed(reinterpret_cast<const uint8_t*>(buf), static_cast<size_t>(n));
      if (st == tcp::HelloReader::State::rejected) {
        close_incoming(id, in.hello->why());
        return;
      }
      if (st == tcp::HelloReader::State::done) {
        const int peer = in.hello->hello().rank;
        const auto q = static_cast<size_t>(peer);
        if (in_of_[q] != 0 || reported_[q]) {
          close_incoming(id, "a second control connection from rank " + std::to_string(peer));
          return;
        }
        in.hello.reset();
        in.peer = peer;
        in_of_[q] = id;
      }
      continue;
    }
    in.buf.append(buf, static_cast<size_t>(n));
    // Whole frames become messages.
    size_t off = 0;
    while (in.buf.size() - off >= sizeof(uint32_t)) {
      uint32_t len;
      std::memcpy(&len, in.buf.data() + off, sizeof len);
      if (len > kMaxMessage) {
        ended = true;
        why = "sent a control message of " + std::to_string(len) + " bytes";
        break;
      }
      if (in.buf.size() - off - sizeof len < len) break;
      Event e;
      e.peer = in.peer;
      e.bytes = in.buf.substr(off + sizeof len, len);
      ++received_[static_cast<size_t>(in.peer)];
      last_heard_[static_cast<size_t>(in.peer)] = core::Clock::now();
      events_.push_back(std::move(e));
      off += sizeof len + len;
    }
    in.buf.erase(0, off);
    if (ended) break;
  }
  (void)events;
  if (ended) close_incoming(id, why);
}

void ControlPlane::settle_losses() {
  // A peer that could not be reached may have connected before it closed its listener: its
  // connection waits in the backlog with its last words.
  if (opts_.listener.valid()) accept_all();
  bool hello_pending = false;
  for (const auto& [id, in] : in_) hello_pending |= in.hello != nullptr;
  if (hello_pending) return;  // one of them may be the peer's
  for (int q = 0; q < opts_.size; ++q) {
    const auto i = static_cast<size_t>(q);
    if (reported_[i] || out_[i].state != Outgoing::State::failed || in_of_[i] != 0) continue;
    reported_[i] = true;
    Event e;
    e.kind = Event::Kind::lost;
    e.peer = q;
    e.why = out_why_[i];
    events_.push_back(std::move(e));
  }
}

std::optional<ControlPlane::Event> ControlPlane::next(const core::Deadline& deadline) {
  // At least one look at the sockets, even with the deadline past (a caller checking in passing).
  for (bool looked = false;; looked = true) {
    settle_losses();
    if (!events_.empty()) {
      Event e = std::move(events_.front());
      events_.pop_front();
      return e;
    }
    if (looked && deadline.expired()) return std::nullopt;
    // Strangers that never finish their hello go (bounded by the grace, checked once a second).
    const auto now = core::Clock::now();
    for (auto it = in_.begin(); it != in_.end();) {
      const uint64_t id = it->first;
      const bool stale = it->second.hello && now - it->second.accepted > kHelloGrace;
      ++it;
      if (stale) close_incoming(id, "no hello within 10 s");
    }
    poll_once(deadline.remaining_ms(1000));
  }
}

void ControlPlane::poll_once(int timeout_ms) {
  epoll_event evs[32];
  const int n = epoll_wait(epoll_.get(), evs, 32, timeout_ms);
  if (n < 0 && errno != EINTR)
    throw Error("control plane: epoll_wait failed: " + core::errno_text());
  for (int i = 0; i < n; ++i) {
    const uint64_t tag = evs[i].data.u64;
    if (tag == kListenerTag)
      accept_all();
    else if ((tag & kTagMask) == kOutTag)
      on_outgoing(static_cast<int>(tag & ~kTagMask), evs[i].events);
    else
      on_incoming(tag & ~kTagMask, evs[i].events);
  }
}

void ControlPlane::flush_all(const core::Deadline& deadline) {
  for (;;) {
    bool pending = false;
    for (const Outgoing& o : out_) pending |= !o.pending.empty() && o.fd.valid();
    if (!pending || deadline.expired()) return;
    poll_once(deadline.remaining_ms(100));
  }
}

std::string ControlPlane::state_text(int peer) const {
  if (peer < 0 || peer >= opts_.size) return "";
  const auto q = static_cast<size_t>(peer);
  const Outgoing& o = out_[q];
  static const char* const kState[] = {"no", "a connecting", "an open", "a failed"};
  std::string s = "sent " + std::to_string(sent_[q]) + " message(s) (" +
                  std::to_string(o.pending.size()) + " bytes unwritten) on " +
                  kState[static_cast<int>(o.state)] + " connection";
  if (!out_why_[q].empty()) s += " (" + out_why_[q] + ")";
  s += "; received " + std::to_string(received_[q]);
  if (received_[q] > 0)
    s += ", the last " +
         std::to_string(static_cast<int64_t>(core::seconds_since(last_heard_[q]) * 1000)) +
         " ms ago";
  s += in_of_[q] != 0 ? ", its connection open" : ", no connection from it";
  size_t hellos = 0;
  for (const auto& [id, in] : in_) hellos += in.hello != nullptr ? 1 : 0;
  if (hellos > 0) s += "; " + std::to_string(hellos) + " connection(s) here with a hello pending";
  return s;
}

void ControlPlane::forget(int peer) {
  if (peer < 0 || peer >= opts_.size) return;
  const auto q = static_cast<size_t>(peer);
  reported_[q] = true;
  Outgoing& o = out_[q];
  if (o.fd.valid()) epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, o.fd.get(), nullptr);
  o.fd.reset();
  o.pending.clear();
  o.state = Outgoing::State::failed;
  if (in_of_[q] != 0) {
    auto it = in_.find(in_of_[q]);
    if (it != in_.end()) {
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, it->second.fd.get(), nullptr);
      in_.erase(it);
    }
    in_of_[q] = 0;
  }
  for (auto it = events_.begin(); it != events_.end();)
    it = it->peer == peer ? events_.erase(it) : it + 1;
}

}  // namespace ringreduce::transport
