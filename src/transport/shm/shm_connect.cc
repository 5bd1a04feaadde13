// Start-up of the shared-memory kind: the listener, and how a host's ranks come to hold each
// other's segments and doorbells (shm_kind.h says why each exists; the segment itself is
// shm_segment.cc).
//
// Two ways, chosen alike by every rank of the host from what each published in its join record:
// - Through the host's first rank (the default): every other rank connects to it once and sends
//   its segment and doorbell; once it has them all it hands each rank everyone else's. N - 1
//   connections on the host instead of N(N - 1), and a rank waits for one peer to be scheduled,
//   not for every one of them (256 ranks on two cores spent ~15 s in the full mesh's accepts).
//   A peer's death is seen through a pidfd of its process, a communicator destroyed while its
//   process lives on through its `closed` flag on the host's board (shm_layout.h).
// Either way a peer's segment is mapped when first used (ShmKind::segment), and checked then.
// - Every pair connecting (the mesh): only where pidfds cannot watch the peers (ranks in
//   different pid namespaces, as containers of one pod; a kernel without pidfd_open), or with
//   RINGREDUCE_SHM_CONNECT=mesh. The peers' sockets closing is how their death is seen.
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>

#include "core/auth.h"
#include "core/fd_passing.h"
#include "core/log.h"
#include "core/pidfd.h"
#include "ringreduce/error.h"
#include "transport/shm/shm_kind.h"

namespace ringreduce::transport::shm {
namespace {

constexpr uint32_t kShmHelloMagic = 0x32485352;  // "RSH2"

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
// name that the acceptor bound before it published that nonce, so nobody else can hold it. (So
// the segments the host's first rank hands out come from connectors it checked.)
struct ShmHelloMsg {
  ShmHello hello;
  core::auth::Proof proof{};
};
static_assert(sizeof(ShmHelloMsg) == 64);
constexpr const char* kShmProofLabel = "ringreduce shm connector";

// What the host's first rank hands each rank: up to kTableEntries peers per message, each with
// its process id, and (SCM_RIGHTS, in entry order) its segment memfd and doorbell.
constexpr uint32_t kTableMagic = 0x32545352;  // "RST2"
// 240 descriptors per message: the kernel takes at most 253 (SCM_MAX_FD).
constexpr size_t kTableEntries = 120;
struct TableMsg {
  uint32_t magic = kTableMagic;
  uint32_t count = 0;
  // 1 if every rank of the host registered for membarrier (SegmentHeader::membarrier_ok).
  uint32_t membarrier_all = 0;
  struct Entry {
    int32_t rank;
    int32_t pid;
  } entries[kTableEntries];
};

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

// "<name>|<nonce or ->|<pid namespace or ->", as ShmListener::published() writes it.
struct Address {
  uint64_t name = 0;
  bool has_nonce = false;
  core::auth::Nonce nonce{};
  std::string pidns;
};

bool parse_address(const std::string& v, Address* a) {
  const size_t bar = v.find('|');
  unsigned long long name = 0;
  if (bar != 16 || std::sscanf(v.c_str(), "%16llx", &name) != 1) return false;
  a->name = name;
  const size_t bar2 = v.find('|', bar + 1);
  if (bar2 == std::string::npos) return false;
  a->has_nonce = core::auth::nonce_from_hex(v.substr(bar + 1, bar2 - bar - 1), &a->nonce);
  a->pidns = v.substr(bar2 + 1);
  return true;
}

using core::pidfd_namespace;
using core::pidfd_open;

}  // namespace

ShmListener::ShmListener(bool with_token, bool through_first)
    : token_(with_token), pidns_(through_first ? pidfd_namespace() : "-") {
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
      // of the host may connect at once. A connector whose connect is refused for a full backlog
      // tries again until its deadline.
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
  return std::string(name) + "|" + (token_ ? core::auth::nonce_to_hex(nonce_) : "-") + "|" + pidns_;
}

bool ShmKind::accept_peer(core::Fd& s, const core::auth::Nonce& nonce, int* expected,
                          std::string* last_drop) {
  const int rank = opts_.rank, size = opts_.size;
  ShmHelloMsg m;
  const ShmHello& h = m.hello;
  std::vector<core::Fd> fds;
  std::string why;
  const ssize_t got = core::recv_with_fds(s.get(), &m, sizeof m, 2, &fds, &why);
  // The peer sends its hello right after connecting, but with hundreds of ranks on a few cores
  // it may not run again for seconds: the connection waits, without holding up the others.
  if (got == -1) return false;
  if (got == -2) {
    why = "no hello: " + why;
  } else if (got != static_cast<ssize_t>(sizeof m) || fds.size() != 2) {
    why = "no hello";
  } else if (h.magic != kShmHelloMagic || h.version != kShmVersion) {
    why = "bad magic or version";
  } else if (h.auth != (opts_.token.empty() ? 0u : 1u) ||
             (!opts_.token.empty() &&
              !core::auth::proofs_equal(shm_proof(opts_.token, h, nonce), m.proof))) {
    why = "no valid proof of the token (RINGREDUCE_TOKEN differs?)";
  } else if (h.comm_id != opts_.comm_id) {
    why = "belongs to another communicator";
  } else if (h.world_size != size || h.channels != opts_.channels || h.rank < 0 || h.rank >= size ||
             h.rank == rank || local_index_[static_cast<size_t>(h.rank)] < 0) {
    why = "unexpected rank or shape";
  } else if (peers_[static_cast<size_t>(h.rank)].in_sock.valid()) {
    why = "duplicate connection";
  } else {
    Peer& peer = peers_[static_cast<size_t>(h.rank)];
    uint32_t membarrier_ok = 0;
    if (check_segment(h.rank, fds[0].get(), &why, &membarrier_ok)) {
      peer.doorbell = std::move(fds[1]);
      peer.memfd = std::move(fds[0]);
      if (membarrier_ok == 0) membarrier_all_ = false;
      // Through the first rank, it hands the segment on and names the process to watch.
      if (through_first_) {
        ucred c{};
        socklen_t len = sizeof c;
        if (getsockopt(s.get(), SOL_SOCKET, SO_PEERCRED, &c, &len) == 0) peer.pid = c.pid;
      }
      peer.in_sock = std::move(s);
      --*expected;
      return true;
    }
  }
  RR_LOG(warn, shm, rank, "dropped a shared-memory connection during start-up: ", why);
  *last_drop = why;
  s.reset();
  return true;
}

void ShmKind::connect_peers(const core::Deadline& deadline) {
  const int rank = opts_.rank, size = opts_.size;
  if (!opts_.listener || opts_.published.size() != static_cast<size_t>(size))
    throw Error("shared-memory transport: no listener, or not every rank's address");
  std::vector<Address> addr(static_cast<size_t>(size));
  through_first_ = true;
  for (int q : local_ranks_) {
    const std::string& v = opts_.published[static_cast<size_t>(q)];
    Address& a = addr[static_cast<size_t>(q)];
    if (!parse_address(v, &a))
      throw Error("rank " + std::to_string(rank) + ": same-host rank " + std::to_string(q) +
                  " published no shared-memory address ('" + v + "')");
    if (a.has_nonce != !opts_.token.empty())
      throw InvalidArgument("rank " + std::to_string(rank) + ": RINGREDUCE_TOKEN is set " +
                            (a.has_nonce ? "on rank " + std::to_string(q) + " but not here"
                                         : "here but not on rank " + std::to_string(q)) +
                            ": every rank needs the same token");
    // Every rank decides from the same table: through the first rank only when pidfds can
    // watch every rank's process from every other (one pid namespace).
    if (a.pidns == "-" || a.pidns != addr[static_cast<size_t>(local_ranks_[0])].pidns)
      through_first_ = false;
  }
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
  const int first = local_ranks_[0];
  int expected = through_first_ && rank != first ? 0 : static_cast<int>(local_ranks_.size()) - 1;
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
  // Connects to q and sends this rank's hello and descriptors. The connect does not block:
  // while q's backlog is full (it is connecting to others itself), this rank accepts from its
  // own and tries again.
  auto connect_to = [&](int q) {
    const Address& a = addr[static_cast<size_t>(q)];
    if (a.has_nonce) msg.proof = shm_proof(opts_.token, mine, a.nonce);
    core::Fd s(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    socklen_t len;
    sockaddr_un to = socket_name(a.name, &len);
    while (connect(s.get(), reinterpret_cast<sockaddr*>(&to), len) != 0) {
      if ((errno != EAGAIN && errno != EINTR) || deadline.expired())
        throw PeerError(errstr(("could not reach same-host rank " + std::to_string(q) +
                                " over a Unix socket (set RINGREDUCE_SHM=0 to use TCP)")
                                   .c_str()),
                        q);
      if (expected > 0)
        accept_some(1);
      else
        usleep(1000);
      check_failed();
    }
    const int fds[2] = {memfd_.get(), doorbell_.get()};
    if (core::send_with_fds(s.get(), &msg, sizeof msg, fds, 2) != static_cast<ssize_t>(sizeof msg))
      throw Error(errstr("sending the shared-memory hello failed"));
    return s;
  };

  if (through_first_ && rank != first) {
    receive_from_first(connect_to(first), deadline, check_failed);
  } else {
    if (!through_first_)
      for (int q : local_ranks_)
        if (q != rank) peers_[static_cast<size_t>(q)].out_sock = connect_to(q);
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
    if (through_first_) hand_out(deadline, check_failed);
  }
  make_links();
}

void ShmKind::hand_out(const core::Deadline& deadline, const std::function<void()>& check_failed) {
  const int rank = opts_.rank;
  for (int r : local_ranks_) {
    if (r == rank) continue;
    const int sock = peers_[static_cast<size_t>(r)].in_sock.get();
    std::vector<int> others;
    for (int q : local_ranks_)
      if (q != r) others.push_back(q);
    for (size_t at = 0; at < others.size(); at += kTableEntries) {
      TableMsg m;
      m.membarrier_all = membarrier_all_ && mine_.as<SegmentHeader>()->membarrier_ok != 0 ? 1 : 0;
      std::vector<int> fds;
      for (size_t i = at; i < std::min(others.size(), at + kTableEntries); ++i) {
        const int q = others[i];
        const Peer& p = peers_[static_cast<size_t>(q)];
        m.entries[m.count++] = {q, q == rank ? getpid() : p.pid};
        fds.push_back(q == rank ? memfd_.get() : p.memfd.get());
        fds.push_back(q == rank ? doorbell_.get() : p.doorbell.get());
      }
      for (;;) {
        if (core::send_with_fds(sock, &m, sizeof m, fds.data(), fds.size()) ==
            static_cast<ssize_t>(sizeof m))
          break;
        // A full socket, or (for a user without CAP_SYS_RESOURCE) more descriptors in flight
        // than its open-file limit: the receivers take them as they run.
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR && errno != ETOOMANYREFS)
          throw PeerError(errstr(("handing same-host rank " + std::to_string(r) +
                                  " its peers' shared memory failed")
                                     .c_str()),
                          r);
        if (deadline.expired())
          throw TimeoutError("timed out handing same-host rank " + std::to_string(r) +
                             " its peers' shared memory (it takes none)");
        usleep(1000);
        check_failed();
      }
    }
  }
  // Every rank has its own reference now; this one keeps its own until it maps them.
}

void ShmKind::await_failure_mark(const core::Deadline& deadline) const {
  // A rank that fails at start-up closes its sockets as its exception unwinds and marks the job
  // failed after: give the mark a second to appear. A store that cannot be reached (rank 0,
  // which hosts it, may be the rank that failed) has nothing more to say.
  const auto until = core::Clock::now() + std::chrono::seconds(1);
  while (core::Clock::now() < until && !deadline.expired()) {
    try {
      check_job_failed(opts_.check_failed, "");
    } catch (const Error& e) {
      if (e.code() == ErrorCode::aborted) throw;
      return;
    }
    usleep(50000);
  }
}

void ShmKind::receive_from_first(core::Fd sock, const core::Deadline& deadline,
                                 const std::function<void()>& check_failed) {
  const int rank = opts_.rank, first = local_ranks_[0];
  Peer& leader = peers_[static_cast<size_t>(first)];
  ucred c{};
  socklen_t len = sizeof c;
  if (getsockopt(sock.get(), SOL_SOCKET, SO_PEERCRED, &c, &len) == 0) leader.pid = c.pid;
  const std::string from = "same-host rank " + std::to_string(first) +
                           " (the host's first rank, which hands out its ranks' shared memory)";
  size_t missing = local_ranks_.size() - 1;
  while (missing > 0) {
    if (deadline.expired())
      throw TimeoutError("timed out waiting for " + from + "; its log names the ranks it lacks");
    // The first rank watches the job's failure mark while it gathers the host's ranks, and
    // closes this connection when it fails: a look here once a second is only a safety net (ten
    // a second from each of 255 waiting ranks were most of the store's requests at 256 ranks).
    pollfd pfd{sock.get(), POLLIN, 0};
    ::poll(&pfd, 1, deadline.remaining_ms(1000));
    check_failed();
    TableMsg m;
    std::vector<core::Fd> fds;
    std::string err;
    const ssize_t got =
        core::recv_with_fds(sock.get(), &m, sizeof m, 2 * kTableEntries, &fds, &err);
    if (got == -1) continue;
    if (got == 0 || got == -2) {
      // The first rank failed, most likely because the job did: say why, if the mark says.
      await_failure_mark(deadline);
      if (got == 0)
        throw PeerError(from +
                            " closed the start-up connection before handing out the host's "
                            "shared memory (a different RINGREDUCE_TOKEN? its log says why)",
                        first);
      throw Error("rank " + std::to_string(rank) + ": receiving the host's shared memory from " +
                  from + " failed: " + err);
    }
    if (got != static_cast<ssize_t>(sizeof m) || m.magic != kTableMagic || m.count == 0 ||
        m.count > kTableEntries || fds.size() != 2 * m.count)
      throw Error("rank " + std::to_string(rank) + ": malformed shared-memory table from " + from);
    for (size_t i = 0; i < m.count; ++i) {
      const int q = m.entries[i].rank;
      if (q < 0 || q >= opts_.size || q == rank || local_index_[static_cast<size_t>(q)] < 0 ||
          peers_[static_cast<size_t>(q)].memfd.valid())
        throw Error("rank " + std::to_string(rank) + ": unexpected rank " + std::to_string(q) +
                    " in the shared-memory table from " + from);
      Peer& p = peers_[static_cast<size_t>(q)];
      // The first rank checked it; segment() checks it again when it maps it.
      p.memfd = std::move(fds[2 * i]);
      p.doorbell = std::move(fds[2 * i + 1]);
      if (q != first) p.pid = m.entries[i].pid;
      --missing;
    }
    if (m.membarrier_all == 0) membarrier_all_ = false;
  }
  leader.out_sock = std::move(sock);
}

void ShmKind::make_links() {
  const int rank = opts_.rank;
  for (int q : local_ranks_) {
    if (q == rank) continue;
    Peer& peer = peers_[static_cast<size_t>(q)];
    // Liveness: the peer's socket reports EOF or HUP when its process (or communicator) is gone;
    // through the first rank, a pidfd of its process becomes readable when it exits. (Ranks that
    // are threads of this process have none: the `closed` flag tells of their end.)
    int watch = peer.in_sock.get();
    if (through_first_) {
      if (peer.pid > 0 && peer.pid != getpid()) {
        peer.pidfd.reset(pidfd_open(peer.pid));
        if (!peer.pidfd.valid())
          throw PeerError(
              errstr(("rank " + std::to_string(rank) + ": watching same-host rank " +
                      std::to_string(q) + " (pid " + std::to_string(peer.pid) + ") failed")
                         .c_str()),
              q);
      }
      watch = peer.pidfd.get();
    }
    if (watch >= 0) {
      epoll_event ev{};
      ev.events = EPOLLIN | EPOLLRDHUP;
      ev.data.u64 = static_cast<uint64_t>(q);
      epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, watch, &ev);
    }
    // Channel `channels` is the lane.
    for (int ch = 0; ch <= opts_.channels; ++ch) {
      // Our FIFO from q lives in our segment at q's local index; our FIFO to q in q's at ours.
      auto l = std::make_unique<ShmLink>(this, q, fifo_at(mine_.get(), fifo_index(q, ch)),
                                         fifo_index(rank, ch), /*lane=*/ch == opts_.channels);
      active_.push_back(l.get());
      (ch == opts_.channels ? lanes_ : chans_).push_back(l.get());
      links_[static_cast<size_t>(q) * stride() + static_cast<size_t>(ch)] = std::move(l);
    }
  }
  // The board lies in the first local rank's segment (the constructor set it there if it is ours).
  if (!board_.sleep) board_ = board_at(segment(local_ranks_[0]).get(), fifo_count_);
  // Every rank of the host decides alike: from the first rank's table, or in the mesh from every
  // peer's segment header.
  asymmetric_fence_ = mine_.as<SegmentHeader>()->membarrier_ok != 0 && membarrier_all_;
  RR_LOG(info, shm, rank, "connected to ", local_ranks_.size() - 1,
         " same-host peers over shared memory",
         through_first_ ? " (through the host's first rank)" : " (every pair connected)",
         asymmetric_fence_ ? "" : " (no membarrier: every wake-up check fences)");
}

}  // namespace ringreduce::transport::shm
