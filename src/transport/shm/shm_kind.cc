#include "transport/shm/shm_kind.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/membarrier.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/auth.h"
#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::transport::shm {
namespace {

constexpr uint32_t kShmHelloMagic = 0x31485352;  // "RSH1"

// Sent once on each Unix connection, with the sender's segment memfd and doorbell eventfd.
struct ShmHello {
  uint32_t magic = kShmHelloMagic;
  uint32_t version = kShmVersion;
  uint64_t comm_id = 0;
  int32_t rank = -1;
  int32_t world_size = 0;
  int32_t channels = 0;
  uint32_t auth = 0;  // 1: `proof` proves the token
};

// What goes over the Unix socket: the hello and, with RINGREDUCE_TOKEN, the connector's proof of
// it: HMAC(token, "ringreduce shm connector", hello, the acceptor's nonce). The acceptor publishes
// a fresh nonce in its join record (through the authenticated store) before anyone may connect,
// so the proof needs no round trip and is good for this communicator and this acceptor only; a
// rank is accepted once.
// The other direction needs no proof: the connector reaches the acceptor by an abstract socket
// name that the acceptor bound before it published that nonce, so nobody else can hold it.
struct ShmHelloMsg {
  ShmHello hello;
  core::auth::Proof proof{};
};
static_assert(sizeof(ShmHelloMsg) == 64);
constexpr const char* kShmProofLabel = "ringreduce shm connector";

core::auth::Proof shm_proof(const std::string& token, const ShmHello& h,
                            const core::auth::Nonce& acceptor_nonce) {
  return core::auth::make_proof(token, kShmProofLabel,
                                {reinterpret_cast<const uint8_t*>(&h), sizeof h}, acceptor_nonce,
                                core::auth::Nonce{});
}

// Abstract socket address (leading NUL): it exists only while the socket is open.
sockaddr_un socket_name(uint64_t id, socklen_t* len) {
  sockaddr_un a{};
  a.sun_family = AF_UNIX;
  char name[96];
  int n = snprintf(name, sizeof name, "ringreduce/%016llx", static_cast<unsigned long long>(id));
  std::memcpy(a.sun_path + 1, name, static_cast<size_t>(n));
  *len = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + static_cast<size_t>(n));
  return a;
}

std::string errstr(const char* what) {
  return std::string(what) + ": " + strerror(errno);
}

void send_hello(int sock, const ShmHelloMsg& h, int memfd, int doorbell) {
  iovec iov{const_cast<ShmHelloMsg*>(&h), sizeof h};
  alignas(cmsghdr) char control[CMSG_SPACE(2 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  cmsghdr* c = CMSG_FIRSTHDR(&msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(2 * sizeof(int));
  int fds[2] = {memfd, doorbell};
  std::memcpy(CMSG_DATA(c), fds, sizeof fds);
  if (sendmsg(sock, &msg, MSG_NOSIGNAL) != static_cast<ssize_t>(sizeof h))
    throw Error(errstr("sending the shared-memory hello failed"));
}

// Receives a hello and its two fds: 1; 0 (fds closed) on anything malformed; -1 if nothing has
// arrived yet.
int recv_hello(int sock, ShmHelloMsg* h, core::Fd* memfd, core::Fd* doorbell) {
  iovec iov{h, sizeof *h};
  alignas(cmsghdr) char control[CMSG_SPACE(4 * sizeof(int))] = {};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t r = recvmsg(sock, &msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
  if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return -1;
  std::vector<int> fds;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); r >= 0 && c; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  const bool ok =
      r == static_cast<ssize_t>(sizeof *h) && !(msg.msg_flags & MSG_CTRUNC) && fds.size() == 2;
  if (!ok) {
    for (int fd : fds) ::close(fd);
    return 0;
  }
  memfd->reset(fds[0]);
  doorbell->reset(fds[1]);
  return 1;
}

constexpr uint64_t kDoorbellEvent = ~0ull;
// Polls of a window wait before the engine's loop: ~2-4 us of pause instructions.
constexpr int kPreSpin = 256;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

Mapping::~Mapping() {
  if (p_) munmap(p_, n_);
}
Mapping::Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (p_) munmap(p_, n_);
    p_ = std::exchange(o.p_, nullptr);
    n_ = o.n_;
  }
  return *this;
}

ShmListener::ShmListener(bool with_token) : token_(with_token) {
  if (token_) nonce_ = core::auth::random_nonce();
  // A random name (64 bits from the kernel's generator): a clash with a live one is refused
  // by bind (EADDRINUSE), and another draw is taken.
  for (int tries = 0; tries < 8; ++tries) {
    core::auth::Nonce r = core::auth::random_nonce();
    std::memcpy(&name_, r.data(), sizeof name_);
    fd_.reset(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (!fd_.valid()) throw Error(errstr("creating the shared-memory listener failed"));
    socklen_t len;
    sockaddr_un a = socket_name(name_, &len);
    if (bind(fd_.get(), reinterpret_cast<sockaddr*>(&a), len) == 0) {
      // The longest backlog the kernel allows (net.core.somaxconn, 4096 by default): every peer
      // of the host may connect at once. Connecting and accepting also interleave
      // (connect_peers), so a full backlog slows start-up down but cannot deadlock it.
      if (listen(fd_.get(), SOMAXCONN) != 0)
        throw Error(errstr("listening for shared-memory peers failed"));
      return;
    }
    if (errno != EADDRINUSE) break;
  }
  throw Error(errstr("binding the shared-memory listener failed"));
}

std::string ShmListener::published() const {
  char name[17];
  snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(name_));
  return std::string(name) + "|" + (token_ ? core::auth::nonce_to_hex(nonce_) : "-");
}

KindTraits ShmKind::static_traits() {
  KindTraits t;
  t.name = "shm";
  // One FIFO slot per message: interleaved medians of 3 rounds at N=2, 4, 8 and 1-256 MiB
  // (docs/PERFORMANCE.md): 4 slots of 256 KiB with 256 KiB messages were best or within noise of
  // the best everywhere; 512 KiB messages (two slots each) lost 5-20% at N=4 and 8.
  t.segment_bytes = kSlotBytes;
  t.sliced = true;
  t.stream_output = true;
  // Round values of what the start-up probe measures on this project's 2-core VM (TUNING.md).
  t.costs = {2e-6, 1.0 / 8e9, false};
  return t;
}

ShmKind::ShmKind(const ShmOptions& opts, const core::Deadline& deadline) : opts_(opts) {
  local_ranks_ = opts_.local_ranks;
  if (local_ranks_.empty())
    for (int q = 0; q < opts_.size; ++q) local_ranks_.push_back(q);
  local_index_.assign(static_cast<size_t>(opts_.size), -1);
  for (size_t i = 0; i < local_ranks_.size(); ++i)
    local_index_.at(static_cast<size_t>(local_ranks_[i])) = static_cast<int>(i);
  if (local_index_.at(static_cast<size_t>(opts_.rank)) < 0)
    throw Error("shared-memory transport: this rank is not among the local ranks");
  // One FIFO per local sender and channel, and one for its point-to-point lane, at the sender's
  // local index.
  const size_t nfifos = local_ranks_.size() * stride();
  fifo_count_ = nfifos;
  const size_t total = segment_bytes(nfifos);
  memfd_.reset(memfd_create("ringreduce-shm", MFD_CLOEXEC));
  if (!memfd_.valid()) throw Error(errstr("memfd_create failed"));
  if (ftruncate(memfd_.get(), static_cast<off_t>(total)) != 0)
    throw Error(errstr("sizing the shared-memory segment failed"));
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_.get(), 0);
  if (p == MAP_FAILED) throw Error(errstr("mapping the shared-memory segment failed"));
  mine_ = Mapping(p, total);
  SegmentHeader* h = mine_.header();
  h->magic = kSegmentMagic;
  h->version = kShmVersion;
  h->owner_rank = opts_.rank;
  h->comm_id = opts_.comm_id;
  h->fifo_count = nfifos;
  h->fifo_stride = kFifoStride;
  h->total_bytes = total;
  h->membarrier_ok =
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0 ? 1 : 0;
  mine_window_ = static_cast<char*>(p) + window_offset(nfifos);

  doorbell_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!doorbell_.valid() || !epoll_.valid()) throw Error(errstr("eventfd/epoll creation failed"));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kDoorbellEvent;
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, doorbell_.get(), &ev);

  peers_.resize(static_cast<size_t>(opts_.size));
  ring_.assign(static_cast<size_t>(opts_.size), 0);
  links_.resize(static_cast<size_t>(opts_.size) * stride());
  if (local_ranks_.size() > 1) connect_peers(deadline);
  // The peers have mapped it; nobody needs the fd any more.
  memfd_.reset();
}

ShmKind::~ShmKind() = default;

bool ShmKind::accept_peer(core::Fd& s, const core::auth::Nonce& nonce, int* expected,
                          std::string* last_drop) {
  const int rank = opts_.rank, size = opts_.size;
  ShmHelloMsg m;
  const ShmHello& h = m.hello;
  core::Fd fd, bell;
  std::string why;
  struct stat st {};
  const int got = recv_hello(s.get(), &m, &fd, &bell);
  // The peer sends its hello right after connecting, but with hundreds of ranks on a few cores
  // it may not run again for seconds: the connection waits, without holding up the others.
  if (got < 0) return false;
  if (got == 0)
    why = "no hello";
  else if (h.magic != kShmHelloMagic || h.version != kShmVersion)
    why = "bad magic or version";
  else if (h.auth != (opts_.token.empty() ? 0u : 1u) ||
           (!opts_.token.empty() &&
            !core::auth::proofs_equal(shm_proof(opts_.token, h, nonce), m.proof)))
    why = "no valid proof of the token (RINGREDUCE_TOKEN differs?)";
  else if (h.comm_id != opts_.comm_id)
    why = "belongs to another communicator";
  else if (h.world_size != size || h.channels != opts_.channels || h.rank < 0 || h.rank >= size ||
           h.rank == rank || local_index_[static_cast<size_t>(h.rank)] < 0)
    why = "unexpected rank or shape";
  else if (peers_[static_cast<size_t>(h.rank)].in_sock.valid())
    why = "duplicate connection";
  else if (fstat(fd.get(), &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes))
    why = "unusable segment";
  if (why.empty()) {
    const size_t n = static_cast<size_t>(st.st_size);
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0);
    if (p == MAP_FAILED) throw Error(errstr("mapping a peer's shared-memory segment failed"));
    Mapping seg(p, n);
    const SegmentHeader* sh = seg.header();
    const size_t nfifos = fifo_count_;
    if (sh->magic != kSegmentMagic || sh->comm_id != opts_.comm_id || sh->owner_rank != h.rank ||
        sh->total_bytes != n || n != segment_bytes(nfifos) || sh->fifo_count != nfifos ||
        sh->fifo_stride != kFifoStride) {
      why = "segment does not match its hello";
    } else {
      Peer& peer = peers_[static_cast<size_t>(h.rank)];
      peer.segment = std::move(seg);
      peer.doorbell = std::move(bell);
      peer.in_sock = std::move(s);
      --*expected;
      return true;
    }
  }
  RR_LOG(warn, rank, "dropped a shared-memory connection during start-up: ", why);
  *last_drop = why;
  s.reset();
  return true;
}

void ShmKind::connect_peers(const core::Deadline& deadline) {
  const int rank = opts_.rank, size = opts_.size;
  if (!opts_.listener || opts_.published.size() != static_cast<size_t>(size))
    throw Error("shared-memory transport: no listener, or not every rank's address");
  ShmHelloMsg msg;
  ShmHello& mine = msg.hello;
  mine.comm_id = opts_.comm_id;
  mine.rank = rank;
  mine.world_size = size;
  mine.channels = opts_.channels;
  mine.auth = opts_.token.empty() ? 0 : 1;
  const core::auth::Nonce& nonce = opts_.listener->nonce();
  const int listener = opts_.listener->fd();

  // Accepting: a stranger (wrong id, rank, layout or token) is dropped and logged, and the last
  // one is named if the wait times out.
  std::string last_drop;
  int expected = static_cast<int>(local_ranks_.size()) - 1;
  // Accepted connections whose hello has not arrived yet.
  std::vector<core::Fd> waiting;
  // The job's failure mark, read at most every 100 ms while this rank waits for its peers.
  auto last_check = core::Clock::now();
  auto check_failed = [&] {
    if (core::Clock::now() - last_check < std::chrono::milliseconds(100)) return;
    last_check = core::Clock::now();
    check_job_failed(opts_.check_failed, last_drop);
  };
  // Accepts the connections in the backlog and reads the hellos that have arrived, waiting up
  // to wait_ms for anything to happen.
  auto accept_some = [&](int wait_ms) {
    std::vector<pollfd> pfds{{listener, POLLIN, 0}};
    for (const core::Fd& w : waiting) pfds.push_back({w.get(), POLLIN, 0});
    if (::poll(pfds.data(), pfds.size(), wait_ms) <= 0) return;
    for (;;) {
      core::Fd s(accept4(listener, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (!s.valid()) break;  // EAGAIN: the backlog is empty
      waiting.push_back(std::move(s));
    }
    std::erase_if(waiting,
                  [&](core::Fd& w) { return accept_peer(w, nonce, &expected, &last_drop); });
  };

  // Connect to every peer and send our fds. The connects do not block: while a peer's backlog
  // is full (it is connecting to others itself), this rank accepts from its own and tries again.
  for (int q : local_ranks_) {
    if (q == rank) continue;
    // "<name>|<nonce or ->", from the join's table.
    const std::string& v = opts_.published[static_cast<size_t>(q)];
    const size_t bar = v.find('|');
    unsigned long long name = 0;
    if (bar != 16 || std::sscanf(v.c_str(), "%16llx", &name) != 1)
      throw Error("rank " + std::to_string(rank) + ": same-host rank " + std::to_string(q) +
                  " published no shared-memory address ('" + v + "')");
    core::auth::Nonce theirs{};
    const bool has_token = core::auth::nonce_from_hex(v.substr(bar + 1), &theirs);
    if (has_token != !opts_.token.empty())
      throw InvalidArgument("rank " + std::to_string(rank) + ": RINGREDUCE_TOKEN is set " +
                            (has_token ? "on rank " + std::to_string(q) + " but not here"
                                       : "here but not on rank " + std::to_string(q)) +
                            ": every rank needs the same token");
    if (has_token) msg.proof = shm_proof(opts_.token, mine, theirs);
    core::Fd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    socklen_t len;
    sockaddr_un to = socket_name(name, &len);
    while (connect(s.get(), reinterpret_cast<sockaddr*>(&to), len) != 0) {
      if ((errno != EAGAIN && errno != EINTR) || deadline.expired())
        throw PeerError(errstr(("could not reach same-host rank " + std::to_string(q) +
                                " over a Unix socket (set RINGREDUCE_SHM=0 to use TCP)")
                                   .c_str()),
                        q);
      accept_some(1);
      check_failed();
    }
    // Blocking again for the hello (a few bytes and two fds) and for the link's life.
    fcntl(s.get(), F_SETFL, fcntl(s.get(), F_GETFL) & ~O_NONBLOCK);
    send_hello(s.get(), msg, memfd_.get(), doorbell_.get());
    peers_[static_cast<size_t>(q)].out_sock = std::move(s);
  }

  // Accept every peer not accepted yet.
  while (expected > 0) {
    if (deadline.expired()) {
      std::string missing;
      for (int q : local_ranks_)
        if (q != rank && !peers_[static_cast<size_t>(q)].in_sock.valid())
          missing += " " + std::to_string(q);
      if (last_drop.empty() && !waiting.empty())
        last_drop = std::to_string(waiting.size()) + " connected but sent no hello";
      throw TimeoutError(
          "timed out waiting for same-host ranks" + missing + " to connect" +
          (last_drop.empty() ? "" : " (last connection dropped: " + last_drop + ")"));
    }
    accept_some(deadline.remaining_ms(100));
    check_failed();
  }

  for (int q : local_ranks_) {
    if (q == rank) continue;
    Peer& peer = peers_[static_cast<size_t>(q)];
    // Liveness: the peer's socket reports EOF or HUP when its process (or communicator) is gone.
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.u64 = static_cast<uint64_t>(q);
    epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, peer.in_sock.get(), &ev);
    // Channel `channels` is the lane.
    for (int ch = 0; ch <= opts_.channels; ++ch) {
      // Our FIFO from q lives in our segment at q's local index; our FIFO to q in q's at ours.
      const auto fifo = [&](int r) {
        return static_cast<size_t>(local_index_[static_cast<size_t>(r)]) * stride() +
               static_cast<size_t>(ch);
      };
      Fifo in = fifo_at(mine_.get(), fifo(q));
      Fifo out = fifo_at(peer.segment.get(), fifo(rank));
      auto l = std::make_unique<ShmLink>(this, q, in, out, /*lane=*/ch == opts_.channels);
      active_.push_back(l.get());
      links_[static_cast<size_t>(q) * stride() + static_cast<size_t>(ch)] = std::move(l);
    }
  }
  asymmetric_fence_ = mine_.header()->membarrier_ok != 0;
  for (int q : local_ranks_)
    if (q != rank && peers_[static_cast<size_t>(q)].segment.header()->membarrier_ok == 0)
      asymmetric_fence_ = false;
  RR_LOG(info, rank, "connected to ", local_ranks_.size() - 1,
         " same-host peers over shared memory",
         asymmetric_fence_ ? "" : " (no membarrier: every wake-up check fences)");
}

namespace {

// A digest of the tag's words: ranks in the same call compute the same value, and two different
// calls practically never do. Each word is multiplied by its own odd constant, so the products
// are independent (a few cycles on the path of every small allreduce, where a chain of mixing
// steps cost ~12 ns), then one mixing step spreads the sum.
uint64_t digest(const OpTag& t) {
  uint64_t w[sizeof(OpTag) / 8];
  std::memcpy(w, &t, sizeof w);
  constexpr uint64_t k[] = {0x9E3779B97F4A7C15ull, 0xBF58476D1CE4E5B9ull, 0x94D049BB133111EBull,
                            0xD6E8FEB86659FD93ull, 0xA0761D6478BD642Full, 0xE7037ED1A0B428DBull};
  static_assert(sizeof k == sizeof w);
  uint64_t h = 0;
  for (size_t i = 0; i < sizeof w / 8; ++i) h += (w[i] ^ (w[i] >> 29)) * k[i];
  h ^= h >> 32;
  return h * 0x9E3779B97F4A7C15ull;
}

}  // namespace

void ShmKind::begin_op(const OpTag& tag, bool stream_output) {
  tag_ = tag;
  stream_output_ = stream_output;
  fingerprint_ = digest(tag);
  // Publish the op line (a seqlock, see SegmentHeader): peers compare it with their own call.
  SegmentHeader* h = mine_.header();
  const uint64_t v = h->op_version.load(std::memory_order_relaxed);
  h->op_version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  uint64_t w[sizeof(OpTag) / 8];
  std::memcpy(w, &tag, sizeof w);
  for (size_t i = 0; i < sizeof(OpTag) / 8; ++i)
    h->op_tag[i].store(w[i], std::memory_order_relaxed);
  h->op_version.store(v + 2, std::memory_order_release);
  h->op_seq.store(tag.seq, std::memory_order_release);
}

bool ShmKind::read_peer_tag(int q, OpTag* tag) {
  const SegmentHeader* h = peers_[static_cast<size_t>(q)].segment.header();
  const uint64_t v1 = h->op_version.load(std::memory_order_acquire);
  if (v1 % 2 != 0) return false;
  uint64_t w[sizeof(OpTag) / 8];
  for (size_t i = 0; i < sizeof(OpTag) / 8; ++i)
    w[i] = h->op_tag[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h->op_version.load(std::memory_order_relaxed) != v1) return false;
  std::memcpy(tag, w, sizeof w);
  return true;
}

void ShmKind::check_peer_calls() {
  for (int q : local_ranks_) {
    if (q == opts_.rank) continue;
    OpTag t;
    if (read_peer_tag(q, &t) && t.seq == tag_.seq && !(t == tag_))
      throw MismatchError("mismatched call: rank " + std::to_string(q) + " issued " + describe(t));
  }
}

const char* ShmKind::window_of(int rank) const {
  if (rank == opts_.rank) return mine_window_;
  return static_cast<const char*>(peers_[static_cast<size_t>(rank)].segment.get()) +
         window_offset(fifo_count_);
}

Link& ShmKind::link(int peer, int channel) {
  ShmLink* l = peer >= 0 && peer < opts_.size && channel >= 0 && channel < opts_.channels
                   ? slot(peer, channel)
                   : nullptr;
  if (!l)
    throw Error("no link from rank " + std::to_string(opts_.rank) + " to rank " +
                std::to_string(peer));
  return *l;
}

Link& ShmKind::lane(int peer) {
  ShmLink* l = peer >= 0 && peer < opts_.size ? slot(peer, opts_.channels) : nullptr;
  if (!l)
    throw Error("no lane from rank " + std::to_string(opts_.rank) + " to rank " +
                std::to_string(peer));
  return *l;
}

bool ShmKind::progress_all(bool stage) {
  bool any = false;
  for (ShmLink* l : active_)
    if (!l->idle() || l->peer_gone()) any |= l->progress(stage);
  flush_rings();
  return any;
}

void ShmKind::flush_rings() {
  bool pending = false;
  for (uint8_t r : ring_) pending |= r != 0;
  if (!pending) return;
  // Pairs with the fence in sleep(): either the sleeper sees what we published, or we see that it
  // sleeps and wake it. With the asymmetric fence the sleeper's membarrier fences for us.
  if (asymmetric_fence_)
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
  for (size_t q = 0; q < ring_.size(); ++q) {
    if (!ring_[q]) continue;
    ring_[q] = 0;
    Peer& p = peers_[q];
    if (p.segment.get() && p.segment.header()->sleeping.load(std::memory_order_relaxed)) {
      uint64_t one = 1;
      ssize_t ignored = ::write(p.doorbell.get(), &one, sizeof one);
      (void)ignored;
    }
  }
}

int ShmKind::prepare_sleep() {
  SegmentHeader* h = mine_.header();
  h->sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Every peer's store before this point is visible now, and every later one is followed by a
  // load that sees our flag (see asymmetric_fence_). Should membarrier ever fail, a store could
  // slip past the caller's recheck: then only nap.
  if (asymmetric_fence_ && syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0)
    return 1;
  return 1000;
}

void ShmKind::end_sleep() {
  mine_.header()->sleeping.store(0, std::memory_order_relaxed);
}

void ShmKind::handle_events() {
  epoll_event events[16];
  int n = epoll_wait(epoll_.get(), events, 16, 0);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kDoorbellEvent) {
      uint64_t v;
      ssize_t ignored = ::read(doorbell_.get(), &v, sizeof v);
      (void)ignored;
      continue;
    }
    const int q = static_cast<int>(events[i].data.u64);
    Peer& p = peers_[static_cast<size_t>(q)];
    char buf[64];
    ssize_t r = ::recv(p.in_sock.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, p.in_sock.get(), nullptr);
      for (int ch = 0; ch <= opts_.channels; ++ch) slot(q, ch)->set_peer_gone();
    }
  }
}

void ShmKind::throw_if_notice() {
  // A peer is failing the job: fail this op now with its reason rather than at the deadline.
  for (ShmLink* l : active_)
    if (l->has_notice()) std::rethrow_exception(l->notice());
}

int ShmKind::stuck_peer(bool* sending) const {
  // Lanes always have a receive posted; point-to-point requests name their own peers.
  *sending = false;
  for (ShmLink* l : active_)
    if (!l->lane() && l->has_pending_recv()) return l->peer();
  *sending = true;
  for (ShmLink* l : active_)
    if (!l->lane() && l->has_pending_send()) return l->peer();
  return -1;
}

void ShmKind::ShmWindow::notify() {
  for (int q = 0; q < t_->opts_.size; ++q)
    if (q != t_->opts_.rank) t_->ring(q);
  t_->flush_rings();
}

void ShmKind::ShmWindow::wait(ReadyFn ready, int waiting_for, const core::Deadline& deadline) {
  if (ready()) return;
  // A peer on another core usually stamps within a cache-line transfer of us: watch for that
  // alone first, without the engine's checks and clock reads. Not when ranks outnumber cores:
  // then the peer may need this very core.
  if (!t_->opts_.oversubscribed)
    for (int i = 0; i < kPreSpin; ++i) {
      cpu_relax();
      if (ready()) return;
    }
  bool moved = false;
  auto poll = [&] {
    if (ready()) return true;
    // A peer that went away cannot post what we wait for any more.
    for (ShmLink* l : t_->active_)
      if (l->peer_gone())
        throw PeerError("peer rank " + std::to_string(l->peer()) +
                            " exited (its shared-memory connection closed)",
                        l->peer());
    // The links carry abort notices, and work of an algorithm that also sends messages.
    moved = t_->driver_->poll_all(false);
    return false;
  };
  auto was_moved = [&] { return moved; };
  auto timeout = [&] {
    throw TimeoutError("timed out waiting for rank " + std::to_string(waiting_for));
  };
  t_->driver_->drive(poll, was_moved, timeout, deadline);
}

void ShmKind::ShmWindow::mismatch(int rank) {
  OpTag t;
  bool read = false;
  for (int tries = 0; tries < 1000 && !(read = t_->read_peer_tag(rank, &t)); ++tries) sched_yield();
  throw MismatchError("mismatched call: rank " + std::to_string(rank) + " issued " +
                      (read && t.seq == t_->tag_.seq ? t_->describe(t) : "another call"));
}

void ShmKind::ShmWindow::wait_all_reached(uint64_t seq, const core::Deadline& deadline) {
  if (floor_ >= seq) return;
  int behind = -1;
  auto ready = [&] {
    uint64_t low = UINT64_MAX;
    for (int q = 0; q < t_->opts_.size; ++q) {
      if (q == t_->opts_.rank) continue;
      const uint64_t r = t_->peers_[static_cast<size_t>(q)].segment.header()->op_seq.load(
          std::memory_order_acquire);
      if (r < low) low = r, behind = q;
    }
    if (low != UINT64_MAX) floor_ = std::max(floor_, low);
    return floor_ >= seq;
  };
  wait(ready, behind, deadline);
}

void ShmKind::abort(int code, int blamed_rank, const std::string& reason) {
  if (aborted_) return;
  aborted_ = true;
  for (ShmLink* l : active_) l->fail(code, blamed_rank, reason);
  // The peers may sleep: wake every one so that it reads the notice now.
  std::atomic_thread_fence(std::memory_order_seq_cst);
  for (auto& p : peers_) {
    if (!p.doorbell.valid()) continue;
    uint64_t one = 1;
    ssize_t ignored = ::write(p.doorbell.get(), &one, sizeof one);
    (void)ignored;
  }
}

std::exception_ptr ShmKind::find_cause(int blamed) {
  for (ShmLink* l : active_)
    if (l->has_notice() && is_deeper_cause(l->notice(), blamed)) return l->notice();
  return nullptr;
}

}  // namespace ringreduce::transport::shm
