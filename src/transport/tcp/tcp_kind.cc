#include "transport/tcp/tcp_kind.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "core/security.h"
#include "ringreduce/error.h"
#include "transport/tcp/handshake.h"

namespace ringreduce::transport::tcp {

KindTraits TcpKind::static_traits() {
  KindTraits t;
  t.name = "tcp";
  // 512 KiB: on loopback every segment costs a frame, a wake-up and a syscall or two, and cutting
  // 1-8 MiB allreduces into quarter steps (64-256 KiB) lost 10-45% against whole 512 KiB segments
  // (docs/PERFORMANCE.md); above, 512 KiB pipelines as well as 2 MiB.
  t.segment_bytes = 512 << 10;
  // Ring schedules slice by slice once a step's chunk outgrows L2 (1 MiB here): step by step,
  // a rank's first sends run ahead of its forwards, so by the time a forward leaves, the chunk it
  // reduced has left the cache and the kernel's send copy reads it back from DRAM; slice by
  // slice, each slice is sent on right after it is reduced. Forced ring over loopback, 6
  // interleaved rounds, busbw GB/s, best (median), step by step -> slice by slice: N = 2 4 MiB
  // 1.93 (1.45) -> 2.60 (1.74), 16 MiB 1.60 (1.47) -> 2.69 (2.46), 256 MiB 1.75 (1.65) -> 2.63
  // (2.44); N = 4 16 MiB 0.87 (0.74) -> 1.38 (1.07); but N = 4 4 MiB (1 MiB chunks) 0.93 (0.85)
  // -> 0.75 (0.70) and N = 8 4 MiB 0.37-0.47 -> 0.32-0.43: below the threshold the first sends'
  // head start pays more than the cache (docs/PERFORMANCE.md).
  t.sliced_from_step_bytes = 2 << 20;
  // Round values of what the start-up probe measures on loopback here (docs/TUNING.md).
  t.costs = {20e-6, 1.0 / 2e9, false};
  return t;
}

TcpKind::TcpKind(TcpOptions opts, const core::Config& config) : opts_(std::move(opts)) {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) throw Error(std::string("epoll creation failed: ") + strerror(errno));
  if (opts_.nsocks < 1) opts_.nsocks = 1;
  links_.resize(static_cast<size_t>(opts_.size) * static_cast<size_t>(stride()));
  connect_.assign(static_cast<size_t>(opts_.size), opts_.peers.empty());
  for (int q : opts_.peers) connect_.at(static_cast<size_t>(q)) = true;
  connect_[static_cast<size_t>(opts_.rank)] = false;
  if (opts_.nsocks > 1)
    striped_.resize(static_cast<size_t>(opts_.size) * static_cast<size_t>(opts_.channels));
  if (opts_.size == 1 || !opts_.listener.valid()) {
    // Nothing to connect, but a bad interface setting should fail now, not when the job grows.
    choose_data_address(config, opts_.store_host);
    return;
  }
  HelloExpect expect;
  expect.comm_id = opts_.comm_id;
  expect.rank = opts_.rank;
  expect.size = opts_.size;
  expect.channels = stride();
  const core::Security security = core::security_settings(config);
  expect.encrypt = security.encrypt;
  // With certificates the hellos carry no proof of the token: the TLS handshake after them
  // authenticates both ends.
  expect.token = expect.encrypt == Encrypt::tls ? "" : security.token;
  expect.nonce = opts_.nonce;
  std::shared_ptr<const core::tls::Context> tls;
  if (expect.encrypt == Encrypt::tls)
    tls = std::make_shared<const core::tls::Context>(security.tls);
  connector_ = std::make_unique<Connector>(
      expect, std::move(opts_.listener), read_addresses(config), connect_, epoll_.get(),
      [this](int peer, int index, core::Fd fd, std::unique_ptr<SecureChannel> secure) {
        attach(peer, index, std::move(fd), std::move(secure));
      },
      std::move(tls));
  size_t n = 0;
  for (bool c : connect_) n += c ? 1 : 0;
  RR_LOG(info, net, opts_.rank, n, " peers over TCP, connected on first use, ", opts_.channels,
         " channel(s) x ", opts_.nsocks, " socket(s)");
}

TcpKind::~TcpKind() = default;

std::vector<PeerAddress> TcpKind::read_addresses(const core::Config& config) const {
  const int rank = opts_.rank, size = opts_.size;
  const bool token = !config.str("RINGREDUCE_TOKEN").empty();
  auto remote = [&](int q) {
    return static_cast<size_t>(q) < opts_.other_host.size() &&
           opts_.other_host[static_cast<size_t>(q)];
  };
  auto parse = [&](int q, PeerAddress* out) {
    std::string nonce;
    if (!parse_published(opts_.published.at(static_cast<size_t>(q)), &out->addr, &nonce))
      return false;
    if (token && !core::auth::nonce_from_hex(nonce, &out->nonce))
      throw InvalidArgument("rank " + std::to_string(rank) +
                            ": RINGREDUCE_TOKEN is set here but not on rank " + std::to_string(q) +
                            ": every rank needs the same token");
    if (!token && nonce != "-")
      throw InvalidArgument("rank " + std::to_string(rank) + ": rank " + std::to_string(q) +
                            " has RINGREDUCE_TOKEN set but this rank does not: every rank needs "
                            "the same token");
    return out->valid = true;
  };
  std::vector<PeerAddress> peers(static_cast<size_t>(size));
  PeerAddress own;
  if (!parse(rank, &own)) throw Error("rank " + std::to_string(rank) + ": no data address");
  // A loopback address cannot carry data between hosts: say so now, on every rank involved,
  // instead of letting connects be refused until the timeout.
  const std::string ifname = config.str("RINGREDUCE_SOCKET_IFNAME");
  const std::string ifname_note = ifname.empty() ? "no RINGREDUCE_SOCKET_IFNAME set"
                                                 : "RINGREDUCE_SOCKET_IFNAME='" + ifname + "'";
  for (int q = 0; q < size; ++q) {
    if (!connect_[static_cast<size_t>(q)]) continue;
    if (remote(q) && own.addr.is_loopback())
      throw InvalidArgument("rank " + std::to_string(rank) + ": the data address chosen is " +
                            own.addr.str() + " (loopback, " + ifname_note + "), but rank " +
                            std::to_string(q) +
                            " is on another host: pick an interface both can reach");
    PeerAddress& p = peers[static_cast<size_t>(q)];
    if (!parse(q, &p))
      throw Error("rank " + std::to_string(q) + " published an unreadable data address '" +
                  opts_.published[static_cast<size_t>(q)] + "'");
    if (remote(q) && p.addr.is_loopback())
      throw InvalidArgument("rank " + std::to_string(rank) + ": rank " + std::to_string(q) +
                            " is on another host but published the loopback address " +
                            p.addr.str() +
                            " for data: set RINGREDUCE_SOCKET_IFNAME there to an interface both "
                            "can reach");
  }
  return peers;
}

TcpLink& TcpKind::wire(int peer, int index) {
  if (peer < 0 || peer >= opts_.size || !connect_[static_cast<size_t>(peer)] || !connector_)
    throw Error("no link from rank " + std::to_string(opts_.rank) + " to rank " +
                std::to_string(peer));
  auto& l = links_[static_cast<size_t>(peer) * static_cast<size_t>(stride()) +
                   static_cast<size_t>(index)];
  if (!l) {
    l = std::make_unique<TcpLink>(this, peer, index, index == wires());
    if (aborted_) l->fail(0, -1, "");
  }
  return *l;
}

Link& TcpKind::link(int peer, int channel) {
  if (opts_.nsocks == 1) return wire(peer, channel);
  auto& s = striped_.at(static_cast<size_t>(peer) * static_cast<size_t>(opts_.channels) +
                        static_cast<size_t>(channel));
  if (!s) {
    std::vector<TcpLink*> w;
    for (int k = 0; k < opts_.nsocks; ++k) w.push_back(&wire(peer, channel * opts_.nsocks + k));
    s = std::make_unique<StripedLink>(w, opts_.min_stripe);
  }
  return *s;
}

Link& TcpKind::lane(int peer) {
  try {
    return wire(peer, wires());
  } catch (const Error&) {
    throw Error("no lane from rank " + std::to_string(opts_.rank) + " to rank " +
                std::to_string(peer));
  }
}

void TcpKind::attach(int peer, int index, core::Fd fd, std::unique_ptr<SecureChannel> secure) {
  if (!tune_data_socket(fd.get(), opts_.socket_buffer, opts_.congestion) && !congestion_warned_) {
    congestion_warned_ = true;
    RR_LOG(info, net, opts_.rank, "TCP congestion control '", opts_.congestion,
           "' is not available here; data sockets keep the system's default");
  }
  TcpLink& l = wire(peer, index);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.ptr = &l;
  if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd.get(), &ev) != 0)
    throw Error(std::string("epoll_ctl failed: ") + strerror(errno));
  l.registered_events = EPOLLIN;
  l.registered = true;
  l.attach(std::move(fd), std::move(secure));
  // The point-to-point layer watches a lane from its connection on (it may be the peer's).
  if (index == wires()) {
    opened_lanes_.push_back(peer);
    ++lane_events_;
  }
}

void TcpKind::check_idle() {
  if (!connector_) return;
  connector_->expire();
  bool waiting = false;
  for (const auto& l : links_)
    waiting = waiting || (l && !l->connected() && !l->lane() && l->has_pending_recv());
  // Once a second at most: every waiting rank's look is a request to one store thread.
  const auto now = core::Clock::now();
  if (!waiting || now - last_failure_check_ < std::chrono::seconds(1)) return;
  last_failure_check_ = now;
  try {
    check_job_failed(opts_.check_failed, connector_->last_drop());
  } catch (const Error& e) {
    if (e.code() == ErrorCode::aborted) throw;
    // The store's own trouble (gone with the rank that hosted it, say) is not this op's failure.
  }
}

void TcpKind::update_interest(TcpLink& link) {
  if (!link.registered) return;
  if (link.finished()) {
    epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, link.fd(), nullptr);
    link.registered = false;
    return;
  }
  uint32_t want = link.wanted_events();
  if (want == link.registered_events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.ptr = &link;
  epoll_ctl(epoll_.get(), EPOLL_CTL_MOD, link.fd(), &ev);
  link.registered_events = want;
}

bool TcpKind::poll_events(int timeout_ms) {
  epoll_event events[64];
  int n = epoll_wait(epoll_.get(), events, 64, timeout_ms);
  if (n < 0) {
    if (errno == EINTR) return false;
    throw Error(std::string("epoll_wait failed: ") + strerror(errno));
  }
  bool any = false;
  for (int i = 0; i < n; ++i) {
    any = true;
    if (Connector::owns(events[i].data.u64)) {
      connector_->on_event(events[i].data.u64, events[i].events);
      continue;
    }
    auto* link = static_cast<TcpLink*>(events[i].data.ptr);
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) link->on_readable();
    if (events[i].events & (EPOLLOUT | EPOLLERR)) link->on_writable();
    update_interest(*link);
  }
  return any;
}

void TcpKind::throw_if_notice() {
  if (!notices_) return;
  for (const auto& l : links_)
    if (l && l->notice()) std::rethrow_exception(l->notice());
}

int TcpKind::stuck_peer(bool* sending) const {
  // Lanes always have a receive posted; point-to-point requests name their own peers.
  *sending = false;
  for (const auto& l : links_)
    if (l && !l->lane() && l->has_pending_recv()) return l->peer();
  *sending = true;
  for (const auto& l : links_)
    if (l && !l->lane() && l->has_pending_send()) return l->peer();
  return -1;
}

int TcpKind::unreachable_peer(int64_t* ms) const {
  // A live host acknowledges within a round trip, its process stopped or not, and retransmits
  // over a lossy link are answered within a few hundred ms: a second is far beyond either.
  constexpr int64_t kUnreachableMs = 1000;
  int q = -1;
  *ms = 0;
  for (const auto& l : links_) {
    if (!l) continue;
    const int64_t silent = l->unanswered_ms();
    if (silent >= kUnreachableMs && silent > *ms) *ms = silent, q = l->peer();
  }
  return q;
}

std::string TcpKind::unreachable_text() const {
  int64_t ms = 0;
  const int q = unreachable_peer(&ms);
  if (q < 0) return {};
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.1f", static_cast<double>(ms) / 1000.0);
  return "timed out waiting for rank " + std::to_string(q) +
         ": its host has acknowledged nothing for " + secs + " s (is the network to it down?)";
}

void TcpKind::abort(int code, int blamed_rank, const std::string& reason) {
  if (aborted_) return;
  aborted_ = true;
  // No new connections: a peer that wants one now is told by the refusal.
  if (connector_) connector_->close_all();
  for (auto& l : links_) {
    if (!l) continue;
    l->fail(code, blamed_rank, reason);
    update_interest(*l);
  }
}

std::exception_ptr TcpKind::find_cause(int blamed) {
  // One look at what each peer has sent so far; the engine looks again until its grace is over.
  for (const auto& l : links_) {
    if (!l) continue;
    l->salvage_notice();
    if (l->notice() && is_deeper_cause(l->notice(), blamed)) return l->notice();
  }
  return nullptr;
}

}  // namespace ringreduce::transport::tcp
