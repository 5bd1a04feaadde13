#include "transport/tcp/tcp_kind.h"

#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/log.h"
#include "rendezvous/socket_util.h"
#include "ringreduce/error.h"
#include "transport/tcp/handshake.h"

namespace ringreduce::transport::tcp {
namespace {

std::vector<uint8_t> to_bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string from_bytes(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

std::string local_hostname() {
  char buf[256] = {};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

// A connection accepted during start-up whose hello has not fully arrived yet.
struct PendingAccept {
  core::Fd fd;
  HelloReader reader;
  core::Clock::time_point since;
};

// How long a stranger may take to send its hello before it is dropped.
constexpr auto kHelloGrace = std::chrono::seconds(10);

}  // namespace

KindTraits TcpKind::static_traits() {
  KindTraits t;
  t.name = "tcp";
  // 512 KiB: on loopback every segment costs a frame, a wake-up and a syscall or two, and cutting
  // 1-8 MiB allreduces into quarter steps (64-256 KiB) lost 10-45% against whole 512 KiB segments
  // (docs/PERFORMANCE.md); above, 512 KiB pipelines as well as 2 MiB.
  t.segment_bytes = 512 << 10;
  // Round values of what the start-up probe measures on loopback here (docs/TUNING.md).
  t.costs = {20e-6, 1.0 / 2e9, false};
  return t;
}

TcpKind::TcpKind(const TcpOptions& opts, const core::Config& config, Store& store,
                 const core::Deadline& deadline)
    : opts_(opts) {
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_.valid()) throw Error(std::string("epoll creation failed: ") + strerror(errno));
  if (opts_.nsocks < 1) opts_.nsocks = 1;
  links_.resize(static_cast<size_t>(opts_.size) * static_cast<size_t>(stride()));
  connect_.assign(static_cast<size_t>(opts_.size), opts_.peers.empty());
  for (int q : opts_.peers) connect_.at(static_cast<size_t>(q)) = true;
  connect_[static_cast<size_t>(opts_.rank)] = false;
  if (opts_.size > 1) {
    connect_mesh(config, store, deadline);
  } else {
    // Nothing to connect, but a bad interface setting should fail now, not when the job grows.
    choose_data_address(config, opts_.store_host);
  }
}

TcpKind::~TcpKind() = default;

Link& TcpKind::link(int peer, int channel) {
  if (opts_.nsocks > 1) {
    auto& s = striped_[static_cast<size_t>(peer) * static_cast<size_t>(opts_.channels) +
                       static_cast<size_t>(channel)];
    if (!s)
      throw Error("no link from rank " + std::to_string(opts_.rank) + " to rank " +
                  std::to_string(peer));
    return *s;
  }
  auto& l = links_[static_cast<size_t>(peer) * static_cast<size_t>(stride()) +
                   static_cast<size_t>(channel)];
  if (!l)
    throw Error("no link from rank " + std::to_string(opts_.rank) + " to rank " +
                std::to_string(peer));
  return *l;
}

Link& TcpKind::lane(int peer) {
  auto* l = peer >= 0 && peer < opts_.size
                ? links_[static_cast<size_t>(peer) * static_cast<size_t>(stride()) +
                         static_cast<size_t>(wires())]
                      .get()
                : nullptr;
  if (!l)
    throw Error("no lane from rank " + std::to_string(opts_.rank) + " to rank " +
                std::to_string(peer));
  return *l;
}

void TcpKind::connect_mesh(const core::Config& config, Store& store,
                           const core::Deadline& deadline) {
  // Every connection is a "channel" here: the wires of striped links count as channels too, and
  // the point-to-point lane is the last.
  const int rank = opts_.rank, size = opts_.size, channels = stride();
  SockAddr want = choose_data_address(config, opts_.store_host);
  listener_ = listen_on(want, &listen_addr_);
  // With a token, connectors prove it against this nonce (handshake.h), published with the
  // address; the store it goes through is authenticated by the same token.
  const std::string token = config.str("RINGREDUCE_TOKEN");
  HelloExpect expect;
  expect.comm_id = opts_.comm_id;
  expect.rank = rank;
  expect.size = size;
  expect.channels = channels;
  expect.token = token;
  if (!token.empty()) expect.nonce = core::auth::random_nonce();
  // Publish "numeric host|port|hostname|nonce". The listener exists before anyone can read this,
  // so a peer's connect can only be refused by an overflowing backlog, which connect_to retries.
  std::string host = listen_addr_.str();
  host = host.substr(0, host.rfind(':'));
  store.set("addr/" + std::to_string(rank),
            to_bytes(host + "|" + std::to_string(listen_addr_.port()) + "|" + local_hostname() +
                     "|" + (token.empty() ? "-" : core::auth::nonce_to_hex(expect.nonce))));
  RR_LOG(info, rank, "listening for data connections on ", listen_addr_.str());

  std::vector<SockAddr> peers(static_cast<size_t>(size));
  std::vector<core::auth::Nonce> peer_nonces(static_cast<size_t>(size));
  const auto timeout_ms = std::chrono::milliseconds(deadline.remaining_ms());
  auto wanted = [&](int q) { return connect_[static_cast<size_t>(q)]; };
  auto remote = [&](int q) {
    return static_cast<size_t>(q) < opts_.other_host.size() &&
           opts_.other_host[static_cast<size_t>(q)];
  };
  // A loopback address cannot carry data between hosts: say so now, on every rank involved,
  // instead of letting connects be refused until the timeout.
  const std::string ifname = config.str("RINGREDUCE_SOCKET_IFNAME");
  const std::string ifname_note = ifname.empty() ? "no RINGREDUCE_SOCKET_IFNAME set"
                                                 : "RINGREDUCE_SOCKET_IFNAME='" + ifname + "'";
  if (listen_addr_.is_loopback()) {
    for (int q = 0; q < size; ++q)
      if (wanted(q) && remote(q))
        throw InvalidArgument("rank " + std::to_string(rank) + ": the data address chosen is " +
                              listen_addr_.str() + " (loopback, " + ifname_note + "), but rank " +
                              std::to_string(q) +
                              " is on another host: pick an interface both can reach");
  }
  // Lower ranks are connected to; higher ranks' addresses are read only when they run elsewhere,
  // to name a loopback address there too.
  for (int q = 0; q < size; ++q) {
    if (!wanted(q) || (q > rank && !remote(q))) continue;
    std::string v = from_bytes(store.get("addr/" + std::to_string(q), timeout_ms));
    auto a = v.find('|'), b = v.find('|', a + 1);
    auto c = b == std::string::npos ? b : v.find('|', b + 1);
    if (a == std::string::npos || b == std::string::npos || c == std::string::npos ||
        !parse_numeric(v.substr(0, a), std::stoi(v.substr(a + 1, b - a - 1)),
                       &peers[static_cast<size_t>(q)]))
      throw Error("rank " + std::to_string(q) + " published an unreadable address '" + v + "'");
    const std::string nonce = v.substr(c + 1);
    if (!token.empty() && !core::auth::nonce_from_hex(nonce, &peer_nonces[static_cast<size_t>(q)]))
      throw InvalidArgument("rank " + std::to_string(rank) +
                            ": RINGREDUCE_TOKEN is set here but "
                            "not on rank " +
                            std::to_string(q) + ": every rank needs the same token");
    if (token.empty() && nonce != "-")
      throw InvalidArgument("rank " + std::to_string(rank) + ": rank " + std::to_string(q) +
                            " has RINGREDUCE_TOKEN set but this rank does not: every rank needs "
                            "the same token");
    if (remote(q) && peers[static_cast<size_t>(q)].is_loopback())
      throw InvalidArgument("rank " + std::to_string(rank) + ": rank " + std::to_string(q) +
                            " is on another host but published the loopback address " +
                            peers[static_cast<size_t>(q)].str() +
                            " for data: set RINGREDUCE_SOCKET_IFNAME there to an interface both "
                            "can reach");
  }

  bool congestion_warned = false;
  auto tune = [&](int fd) {
    if (!tune_data_socket(fd, opts_.socket_buffer, opts_.congestion) && !congestion_warned) {
      congestion_warned = true;
      RR_LOG(info, rank, "TCP congestion control '", opts_.congestion,
             "' is not available here; data sockets keep the system's default");
    }
  };
  auto slot = [&](int peer, int ch) -> std::unique_ptr<TcpLink>& {
    return links_[static_cast<size_t>(peer) * static_cast<size_t>(channels) +
                  static_cast<size_t>(ch)];
  };
  auto make_hello = [&](int ch) {
    Hello h;
    h.comm_id = opts_.comm_id;
    h.rank = rank;
    h.world_size = size;
    h.channel = ch;
    return h;
  };

  // Phase 1: connect to every lower rank and send our hello. Neither step waits on the peer's
  // program: the kernel completes the TCP handshake from the listen backlog and the hello fits in
  // the socket buffer. So no ordering of ranks can deadlock here.
  struct Outgoing {
    int peer, channel;
    core::Fd fd;
    Hello sent;
    core::auth::Nonce nonce;
  };
  std::vector<Outgoing> outgoing;
  for (int q = 0; q < rank; ++q) {
    if (!wanted(q)) continue;
    for (int ch = 0; ch < channels; ++ch) {
      core::Fd fd = connect_to(peers[static_cast<size_t>(q)], deadline);
      Hello h = make_hello(ch);
      core::auth::Nonce nonce{};
      const std::vector<uint8_t> msg =
          connector_hello(h, token, peer_nonces[static_cast<size_t>(q)], &nonce);
      if (rendezvous::send_exact(fd.get(), msg.data(), msg.size(), deadline) !=
          rendezvous::IoResult::ok)
        throw PeerError("could not send hello to rank " + std::to_string(q) + " at " +
                            peers[static_cast<size_t>(q)].str() + ": " + strerror(errno),
                        q);
      outgoing.push_back({q, ch, std::move(fd), h, nonce});
    }
  }

  // Phase 2: accept every higher rank. Hellos are read with non-blocking state machines so that a
  // stranger that connects and says nothing (or trickles bytes) cannot hold up the job.
  int expected = 0;
  for (int q = rank + 1; q < size; ++q) expected += wanted(q) ? channels : 0;
  std::vector<PendingAccept> pending;
  set_nonblocking(listener_.get());
  // The last connection dropped, named in the timeout: a rank whose RINGREDUCE_TOKEN differs
  // is dropped like any stranger (failing at once would let a stranger fail the job), and this is
  // how its operator learns why it never connected.
  std::string last_drop;
  while (expected > 0) {
    if (deadline.expired()) {
      std::string missing;
      for (int q = rank + 1; q < size; ++q) {
        bool all = true;
        for (int ch = 0; ch < channels; ++ch) all = all && (!wanted(q) || slot(q, ch));
        if (!all) missing += " " + std::to_string(q);
      }
      throw TimeoutError(
          "timed out waiting for ranks" + missing + " to connect" +
          (last_drop.empty() ? "" : " (last connection dropped: " + last_drop + ")"));
    }
    std::vector<pollfd> pfds;
    pfds.push_back({listener_.get(), POLLIN, 0});
    for (auto& p : pending) pfds.push_back({p.fd.get(), POLLIN, 0});
    int n = ::poll(pfds.data(), pfds.size(), std::min(deadline.remaining_ms(), 100));
    if (n < 0 && errno != EINTR) throw Error(std::string("poll failed: ") + strerror(errno));
    // A peer that failed at start-up never connects: its failure mark says so.
    if (n == 0) check_job_failed(opts_.check_failed, last_drop);
    if (pfds[0].revents & POLLIN) {
      for (int i = 0; i < 64; ++i) {
        int fd = accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) break;
        pending.push_back({core::Fd(fd), HelloReader(&expect), core::Clock::now()});
      }
    }
    for (size_t i = 0; i < pending.size();) {
      PendingAccept& p = pending[i];
      bool drop = false;
      std::string why;
      // Only as many bytes as the hello has: anything after it is the peer's data.
      uint8_t buf[sizeof(Hello) + kConnectorAuthBytes];
      ssize_t r = ::recv(p.fd.get(), buf, p.reader.want(), 0);
      if (r > 0) {
        if (p.reader.feed(buf, static_cast<size_t>(r)) == HelloReader::State::rejected)
          drop = true, why = p.reader.why();
      } else if (r == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        drop = true, why = "closed before finishing its hello";
      }
      if (!drop && p.reader.state() == HelloReader::State::done) {
        const Hello& h = p.reader.hello();
        if (!wanted(h.rank))
          why = "unexpected rank " + std::to_string(h.rank);
        else if (slot(h.rank, h.channel))
          why = "duplicate connection";
        if (!why.empty()) {
          drop = true;
        } else {
          const std::vector<uint8_t> mine =
              acceptor_hello(p.reader, make_hello(h.channel), token, expect.nonce);
          if (rendezvous::send_exact(p.fd.get(), mine.data(), mine.size(), deadline) !=
              rendezvous::IoResult::ok) {
            drop = true, why = "could not answer its hello";
          } else {
            tune(p.fd.get());
            slot(h.rank, h.channel) = std::make_unique<TcpLink>(
                this, h.rank, h.channel, std::move(p.fd), h.channel == wires());
            --expected;
            pending.erase(pending.begin() + static_cast<long>(i));
            continue;
          }
        }
      }
      if (!drop && core::Clock::now() - p.since > kHelloGrace)
        drop = true, why = "sent no hello in time";
      if (drop) {
        RR_LOG(warn, rank, "dropped a data connection during start-up: ", why);
        last_drop = why;
        pending.erase(pending.begin() + static_cast<long>(i));
        continue;
      }
      ++i;
    }
  }
  // Every link exists now; nobody else may connect, so stop listening.
  listener_.reset();

  // Phase 3: every lower rank has answered by now or will shortly (it is in phase 2).
  for (auto& o : outgoing) {
    uint8_t answer[sizeof(Hello) + kAcceptorAuthBytes];
    const size_t answer_bytes = acceptor_hello_bytes(token);
    if (auto io = rendezvous::recv_exact(o.fd.get(), answer, answer_bytes, deadline);
        io != rendezvous::IoResult::ok)
      throw PeerError(
          "rank " + std::to_string(o.peer) + " did not answer our hello: " +
              (io == rendezvous::IoResult::timeout ? "timed out" : "connection closed") +
              (token.empty() ? "" : " (does it have the same RINGREDUCE_TOKEN?)"),
          o.peer);
    const std::string bad = check_acceptor_hello(answer, answer_bytes, o.sent, o.peer, token,
                                                 peer_nonces[static_cast<size_t>(o.peer)], o.nonce);
    if (!bad.empty()) throw PeerError("rank " + std::to_string(o.peer) + " " + bad, o.peer);
    tune(o.fd.get());
    slot(o.peer, o.channel) =
        std::make_unique<TcpLink>(this, o.peer, o.channel, std::move(o.fd), o.channel == wires());
  }

  for (auto& l : links_) {
    if (!l) continue;
    set_nonblocking(l->fd());
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = l.get();
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, l->fd(), &ev) != 0)
      throw Error(std::string("epoll_ctl failed: ") + strerror(errno));
    l->registered_events = EPOLLIN;
    l->registered = true;
  }
  if (opts_.nsocks > 1) {
    striped_.resize(static_cast<size_t>(size) * static_cast<size_t>(opts_.channels));
    for (int q = 0; q < size; ++q)
      for (int ch = 0; ch < opts_.channels; ++ch) {
        if (!slot(q, ch * opts_.nsocks)) continue;
        std::vector<TcpLink*> w;
        for (int k = 0; k < opts_.nsocks; ++k) w.push_back(slot(q, ch * opts_.nsocks + k).get());
        striped_[static_cast<size_t>(q) * static_cast<size_t>(opts_.channels) +
                 static_cast<size_t>(ch)] = std::make_unique<StripedLink>(w, opts_.min_stripe);
      }
  }
  RR_LOG(info, rank, "connected to ", size - 1, " peers on ", opts_.channels, " channel(s) x ",
         opts_.nsocks, " socket(s)");
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
    auto* link = static_cast<TcpLink*>(events[i].data.ptr);
    if (events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) link->on_readable();
    if (events[i].events & (EPOLLOUT | EPOLLERR)) link->on_writable();
    update_interest(*link);
    any = true;
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
