#include "transport/tcp/connector.h"

#include <errno.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>

#include <chrono>

#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::transport::tcp {
namespace {

// How long a stranger may take to send its hello before it is dropped.
constexpr auto kHelloGrace = std::chrono::seconds(10);
// A TLS handshake's limit (RINGREDUCE_ENCRYPT=tls): a few round trips between live ranks.
constexpr auto kTlsHandshakeLimit = std::chrono::seconds(10);
// Accepted connections still reading their hello, at most, beyond one per peer and connection
// (an alltoall may have them all under way): a flood of strangers costs bounded memory (the
// oldest is dropped first).
constexpr size_t kSpareIncoming = 256;
// The channel of the answer that closes a higher rank's attempt because this rank's own crosses
// it: the higher rank then waits for this rank's connection instead of failing.
constexpr int32_t kCrossedChannel = -2;
// The listener's epoll tag (id 0).
constexpr uint64_t kListenerTag = 1;

// Writes all of a small message to a fresh non-blocking socket: a hello is far below any socket
// buffer, so anything short is the connection failing.
bool send_small(int fd, const std::vector<uint8_t>& msg) {
  for (;;) {
    const ssize_t w = ::send(fd, msg.data(), msg.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0 && errno == EINTR) continue;
    return w == static_cast<ssize_t>(msg.size());
  }
}

}  // namespace

Connector::Connector(const HelloExpect& expect, core::Fd listener, std::vector<PeerAddress> peers,
                     std::vector<bool> wanted, int epoll_fd, Attach attach,
                     std::shared_ptr<const core::tls::Context> tls)
    : expect_(expect),
      tls_(std::move(tls)),
      listener_(std::move(listener)),
      peers_(std::move(peers)),
      wanted_(std::move(wanted)),
      epoll_fd_(epoll_fd),
      attach_(std::move(attach)),
      states_(static_cast<size_t>(expect_.size) * static_cast<size_t>(expect_.channels),
              State::none) {
  set_nonblocking(listener_.get());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerTag;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listener_.get(), &ev) != 0)
    throw Error(std::string("epoll_ctl failed: ") + strerror(errno));
}

Connector::~Connector() {
  // Handshakes under way end at once on sockets shut down, so that joining their threads (as
  // pending_ goes) does not wait for a silent peer's deadline.
  for (Pending& p : pending_)
    if (p.tls && p.fd.valid()) ::shutdown(p.fd.get(), SHUT_RDWR);
}

void Connector::close_all() {
  while (!pending_.empty()) forget(pending_.begin());
  if (listener_.valid()) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, listener_.get(), nullptr);
  listener_.reset();
}

void Connector::forget(Iter it) {
  // Out of the set before the close: a copy of the descriptor in a forked child would otherwise
  // keep the registration, and its events, alive.
  if (it->tls) {
    // A handshake under way ends at once on a socket shut down; its thread is then joined.
    if (it->fd.valid()) ::shutdown(it->fd.get(), SHUT_RDWR);
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->tls->done.get(), nullptr);
  } else if (it->fd.valid()) {
    epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->fd.get(), nullptr);
  }
  pending_.erase(it);
}

Hello Connector::hello_for(int index) const {
  Hello h;
  h.comm_id = expect_.comm_id;
  h.rank = expect_.rank;
  h.world_size = expect_.size;
  h.channel = index;
  return h;
}

void Connector::watch(Pending& p, uint32_t events, bool add) {
  epoll_event ev{};
  ev.events = events;
  ev.data.u64 = (p.id << 1) | 1;
  if (epoll_ctl(epoll_fd_, add ? EPOLL_CTL_ADD : EPOLL_CTL_MOD, p.fd.get(), &ev) != 0)
    throw Error(std::string("epoll_ctl failed: ") + strerror(errno));
}

Connector::Iter Connector::outgoing_of(int peer, int index) {
  for (auto it = pending_.begin(); it != pending_.end(); ++it)
    if (it->peer == peer && it->index == index &&
        (it->phase == Pending::Phase::connecting || it->phase == Pending::Phase::awaiting_answer ||
         (it->phase == Pending::Phase::tls && it->tls->outgoing)))
      return it;
  return pending_.end();
}

void Connector::connect(int peer, int index) {
  if (state(peer, index) != State::none) return;
  const PeerAddress& to = peers_.at(static_cast<size_t>(peer));
  if (!to.valid || !listener_.valid())
    throw PeerError("no data address of rank " + std::to_string(peer), peer);
  core::Fd fd(::socket(to.addr.family(), SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (!fd.valid()) throw Error(std::string("socket() failed: ") + strerror(errno));
  const int rc =
      ::connect(fd.get(), reinterpret_cast<const sockaddr*>(&to.addr.storage), to.addr.len);
  if (rc != 0 && errno != EINPROGRESS)
    throw PeerError("could not connect to rank " + std::to_string(peer) + " at " + to.addr.str() +
                        ": " + strerror(errno),
                    peer);
  Pending& p = pending_.emplace_back(&expect_);
  p.phase = Pending::Phase::connecting;
  p.fd = std::move(fd);
  p.peer = peer;
  p.index = index;
  p.since = core::Clock::now();
  p.id = next_id_++;
  watch(p, EPOLLOUT, true);
  state(peer, index) = State::connecting;
}

void Connector::on_event(uint64_t data, uint32_t events) {
  if (data == kListenerTag) {
    accept_all();
    return;
  }
  const uint64_t id = data >> 1;
  // Few connections are ever under way at once; one that is gone has nothing left to do.
  for (auto it = pending_.begin(); it != pending_.end(); ++it) {
    if (it->id != id) continue;
    if (it->phase == Pending::Phase::tls)
      finish_tls(it);
    else if (it->phase == Pending::Phase::reading_hello)
      on_incoming(it);
    else
      on_outgoing(it, events);
    return;
  }
}

void Connector::accept_all() {
  for (int i = 0; i < 64 && listener_.valid(); ++i) {
    const int fd = ::accept4(listener_.get(), nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      // Out of descriptors or memory: the connection stays queued and the listener readable, so
      // returning would spin the engine while the peer waits; fail, naming why.
      throw Error("rank " + std::to_string(expect_.rank) +
                  ": could not accept a data connection: " + strerror(errno));
    }
    size_t incoming = 0;
    // Handshakes under way count too (tls: a thread each): strangers cannot pile them up.
    for (const auto& q : pending_)
      incoming += q.phase == Pending::Phase::reading_hello ||
                          (q.phase == Pending::Phase::tls && !q.tls->outgoing)
                      ? 1
                      : 0;
    if (incoming >= states_.size() + kSpareIncoming) {
      for (auto it = pending_.begin(); it != pending_.end(); ++it)
        if (it->phase == Pending::Phase::reading_hello) {
          drop(it, "too many connections without a hello", false);
          break;
        }
    }
    Pending& p = pending_.emplace_back(&expect_);
    p.phase = Pending::Phase::reading_hello;
    p.fd = core::Fd(fd);
    p.since = core::Clock::now();
    p.id = next_id_++;
    watch(p, EPOLLIN, true);
  }
}

void Connector::on_outgoing(Iter it, uint32_t events) {
  Pending& p = *it;
  const int peer = p.peer;
  const std::string& token = expect_.token;
  const PeerAddress& to = peers_[static_cast<size_t>(peer)];
  if (p.phase == Pending::Phase::connecting) {
    if (!(events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) return;
    int err = 0;
    socklen_t len = sizeof err;
    getsockopt(p.fd.get(), SOL_SOCKET, SO_ERROR, &err, &len);
    // Its listener lives as long as its communicator: a refusal means the rank is gone.
    if (err != 0)
      throw PeerError("could not connect to rank " + std::to_string(peer) + " at " + to.addr.str() +
                          ": " + strerror(err),
                      peer);
    p.sent = hello_for(p.index);
    const std::vector<uint8_t> msg =
        connector_hello(p.sent, token, to.nonce, &p.nonce, expect_.encrypt);
    if (!send_small(p.fd.get(), msg))
      throw PeerError("could not send hello to rank " + std::to_string(peer) + " at " +
                          to.addr.str() + ": " + strerror(errno),
                      peer);
    p.phase = Pending::Phase::awaiting_answer;
    watch(p, EPOLLIN, false);
    return;
  }
  // Awaiting the answer: only its bytes, anything after it is the peer's data.
  const size_t want = acceptor_hello_bytes(token);
  const ssize_t r = ::recv(p.fd.get(), p.answer + p.got, want - p.got, MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  if (r > 0) p.got += static_cast<size_t>(r);
  if (p.got >= sizeof(Hello) && peer < expect_.rank) {
    Hello h;
    std::memcpy(&h, p.answer, sizeof h);
    if (h.magic == kHelloMagic && h.comm_id == expect_.comm_id && h.rank == peer &&
        h.channel == kCrossedChannel) {
      // Crossed: the lower rank's own attempt is under way and wins; it will arrive here.
      const int index = p.index;
      forget(it);
      if (state(peer, index) == State::connecting) state(peer, index) = State::crossed;
      return;
    }
  }
  if (r <= 0)
    throw PeerError(
        "rank " + std::to_string(peer) + " closed our data connection before answering its hello" +
            (expect_.encrypt == Encrypt::psk
                 ? " (a different RINGREDUCE_TOKEN or RINGREDUCE_ENCRYPT there?)"
             : expect_.encrypt == Encrypt::tls ? " (a different RINGREDUCE_ENCRYPT there?)"
             : token.empty()                   ? ""
                                               : " (a different RINGREDUCE_TOKEN there?)") +
            (last_drop_.empty()
                 ? ""
                 : " (this rank meanwhile dropped a connection: " + last_drop_ + ")"),
        peer);
  if (p.got < want) return;
  const std::string bad =
      check_acceptor_hello(p.answer, want, p.sent, peer, token, to.nonce, p.nonce, expect_.encrypt);
  if (!bad.empty()) throw PeerError("rank " + std::to_string(peer) + " " + bad, peer);
  hellos_done(it, peer, p.index);
}

void Connector::on_incoming(Iter it) {
  Pending& p = *it;
  // Only as many bytes as the hello has: anything after it is the peer's data.
  uint8_t buf[sizeof(Hello) + kConnectorAuthBytes];
  const ssize_t r = ::recv(p.fd.get(), buf, p.reader.want(), MSG_DONTWAIT);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
  // Closed before a byte: an attempt its crossing rank withdrew, or a port scan; not worth a word.
  if (r <= 0)
    return drop(it, "closed before finishing its hello", p.reader.want() == sizeof(Hello));
  if (p.reader.feed(buf, static_cast<size_t>(r)) == HelloReader::State::rejected)
    return drop(it, p.reader.why(), false);
  if (p.reader.state() == HelloReader::State::done) settle_incoming(it);
}

void Connector::settle_incoming(Iter it) {
  Pending& p = *it;
  const Hello& h = p.reader.hello();
  const int peer = h.rank, index = h.channel;
  if (!wanted_[static_cast<size_t>(peer)])
    return drop(it, "unexpected rank " + std::to_string(peer), false);
  switch (state(peer, index)) {
    case State::attached:
      // A higher rank's attempt that crossed ours after ours was answered is expected; a lower
      // rank never gives up its own attempt, so its duplicate is not.
      return drop(it, "duplicate connection from rank " + std::to_string(peer),
                  peer > expect_.rank);
    case State::connecting:
      if (peer > expect_.rank) {
        // Ours wins: say so, so that the higher rank waits for ours instead of failing.
        const Hello refusal = hello_for(kCrossedChannel);
        const auto* b = reinterpret_cast<const uint8_t*>(&refusal);
        send_small(p.fd.get(), std::vector<uint8_t>(b, b + sizeof refusal));
        return drop(it, "crossed by this rank's own connection", true);
      }
      break;
    case State::none:
    case State::crossed:
      break;
  }
  const std::vector<uint8_t> mine =
      acceptor_hello(p.reader, hello_for(index), expect_.token, expect_.nonce, expect_.encrypt);
  if (!send_small(p.fd.get(), mine)) return drop(it, "could not answer its hello", false);
  // The lower rank's connection wins: ours, if under way, is withdrawn (the peer closes it in
  // turn); only now that the answer is out, so that the state never says "connecting" with
  // nothing under way.
  if (auto own = outgoing_of(peer, index); own != pending_.end()) forget(own);
  hellos_done(it, peer, index);
}

std::array<uint8_t, 20> Connector::key_context(bool outgoing, int peer, int index) const {
  std::array<uint8_t, 20> c{};
  const int32_t ids[3] = {outgoing ? expect_.rank : peer, outgoing ? peer : expect_.rank, index};
  std::memcpy(c.data(), &expect_.comm_id, 8);
  std::memcpy(c.data() + 8, ids, 12);
  return c;
}

core::aead::Cipher Connector::cipher_of(const Pending& p, bool outgoing) const {
  // Each side's hello says the cipher its CPU prefers: the connector's answer or the reader's.
  const uint32_t mine = hello_auth(expect_.token, expect_.encrypt);
  if (!outgoing) return connection_cipher(p.reader.hello().auth, mine);
  Hello answer;
  std::memcpy(&answer, p.answer, sizeof answer);
  return connection_cipher(mine, answer.auth);
}

void Connector::hellos_done(Iter it, int peer, int index) {
  if (expect_.encrypt == Encrypt::tls) return start_tls(it, peer, index);
  if (expect_.encrypt == Encrypt::off) return hand_over(it, peer, index);
  // psk: this connection's keys, from the token, both nonces (the connector's fresh one and the
  // acceptor's published one) and who is who on which connection.
  const bool outgoing = it->phase == Pending::Phase::awaiting_answer;
  const core::auth::Nonce& cn = outgoing ? it->nonce : it->reader.peer_nonce();
  const core::auth::Nonce& an = outgoing ? peers_[static_cast<size_t>(peer)].nonce : expect_.nonce;
  const core::aead::Cipher cipher = cipher_of(*it, outgoing);
  const auto context = key_context(outgoing, peer, index);
  hand_over(it, peer, index,
            std::make_unique<SecureChannel>(core::aead::derive_keys(
                expect_.token, "ringreduce data connection", context, cn, an,
                outgoing ? core::aead::Side::connector : core::aead::Side::acceptor, cipher)));
}

void Connector::start_tls(Iter it, int peer, int index) {
  Pending& p = *it;
  const bool outgoing = p.phase == Pending::Phase::awaiting_answer;
  auto run = std::make_unique<TlsRun>();
  run->outgoing = outgoing;
  run->done.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!run->done.valid()) throw Error(std::string("eventfd failed: ") + strerror(errno));
  // The socket leaves the set while the thread has it; the thread's end is reported instead.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.fd.get(), nullptr);
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = (p.id << 1) | 1;
  if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, run->done.get(), &ev) != 0)
    throw Error(std::string("epoll_ctl failed: ") + strerror(errno));
  p.peer = peer;
  p.index = index;
  p.phase = Pending::Phase::tls;
  // An incoming connection's place is taken now, as if attached: this rank starts no connection
  // of its own to the peer meanwhile, and a second incoming one is a duplicate. (Its queued sends
  // wait for the attach.) A failed handshake gives the place back.
  if (!outgoing) state(peer, index) = State::attached;
  TlsRun* r = run.get();
  const int fd = p.fd.get();
  const auto context = key_context(outgoing, peer, index);
  std::shared_ptr<const core::tls::Context> ctx = tls_;
  // Bounded: a peer that stalls its handshake is dropped after this, without holding the engine.
  const core::Deadline deadline = core::Deadline::after(kTlsHandshakeLimit);
  run->thread = std::jthread([r, fd, context, ctx, deadline] {
    try {
      r->secret =
          ctx->handshake(fd, r->outgoing ? core::aead::Side::connector : core::aead::Side::acceptor,
                         context, deadline);
    } catch (...) {
      r->error = std::current_exception();
    }
    const uint64_t one = 1;
    (void)!::write(r->done.get(), &one, sizeof one);
  });
  p.tls = std::move(run);
}

void Connector::finish_tls(Iter it) {
  Pending& p = *it;
  uint64_t n = 0;
  if (::read(p.tls->done.get(), &n, sizeof n) != static_cast<ssize_t>(sizeof n)) return;
  p.tls->thread.join();
  const bool outgoing = p.tls->outgoing;
  const int peer = p.peer, index = p.index;
  if (p.tls->error) {
    std::string why;
    try {
      std::rethrow_exception(p.tls->error);
    } catch (const std::exception& e) {
      why = e.what();
    }
    if (why.rfind("TLS handshake failed: ", 0) == 0) why.erase(0, 22);  // said below already
    // An outgoing connection goes to the address the peer published through the store: its
    // refusal is the peer's failure, named now. An incoming one may be a stranger's: dropped.
    if (outgoing)
      throw PeerError("TLS handshake with rank " + std::to_string(peer) + " failed: " + why, peer);
    drop(it,
         "TLS handshake with a connection claiming to be rank " + std::to_string(peer) +
             " failed: " + why,
         false);
    // Its place back, and a connection of this rank's own instead: sends queued meanwhile (or
    // an attempt withdrawn for it) must not wait on a stranger. A rank whose certificate is bad
    // refuses this one too, and is named then.
    state(peer, index) = State::none;
    connect(peer, index);
    return;
  }
  const core::aead::Cipher cipher = cipher_of(p, outgoing);
  const auto context = key_context(outgoing, peer, index);
  auto secure = std::make_unique<SecureChannel>(core::aead::derive_keys_from_secret(
      p.tls->secret.bytes, "ringreduce data connection", context,
      outgoing ? core::aead::Side::connector : core::aead::Side::acceptor, cipher));
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, p.tls->done.get(), nullptr);
  p.tls.reset();
  hand_over(it, peer, index, std::move(secure));
}

void Connector::hand_over(Iter it, int peer, int index, std::unique_ptr<SecureChannel> secure) {
  // Out of the set first: the link registers the same descriptor under its own tag.
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, it->fd.get(), nullptr);
  core::Fd fd = std::move(it->fd);
  pending_.erase(it);  // its descriptor moved out, already out of the set
  state(peer, index) = State::attached;
  attach_(peer, index, std::move(fd), std::move(secure));
}

void Connector::drop(Iter it, const std::string& why, bool quiet) {
  if (!quiet) {
    RR_LOG(warn, net, expect_.rank, "dropped a data connection: ", why);
    last_drop_ = why;
  }
  forget(it);
}

void Connector::expire() {
  const auto now = core::Clock::now();
  for (auto it = pending_.begin(); it != pending_.end();) {
    auto next = std::next(it);
    if (it->phase == Pending::Phase::reading_hello && now - it->since > kHelloGrace)
      drop(it, "sent no hello in time", false);
    it = next;
  }
}

}  // namespace ringreduce::transport::tcp
