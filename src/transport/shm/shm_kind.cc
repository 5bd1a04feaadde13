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

#include <chrono>
#include <cstdio>
#include <cstring>

#include "core/auth.h"
#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::transport::shm {
namespace {

// How long a window wait polls before the engine's loop, in time: a pause instruction takes
// ~20 ns on one of this project's VMs' CPUs, 27 ns on another (AMD Zen 3, where the 256 pauses
// this was once counted in came to 7 us instead of 3) and ~140 cycles on Intel's since Skylake,
// so a count of pauses is a different wait on every CPU.
constexpr auto kPreSpin = std::chrono::microseconds(3);
// When ranks outnumber cores, how long to poll for a peer that last ran on another core before
// yielding: a little over one process switch on the VM it was measured on (6 us). There, at 4
// ranks on 2 cores a 4 B allreduce took 9.3-9.5 us with no poll, 7.1-7.4 with ~2.5 us, 7.1-7.2
// with ~10 us and 6.7-7.3 with ~40 us (two rounds each; 8 ranks: 33.3, 32.4-34.7, 29.5-30.5,
// 29.3-30.9).
constexpr auto kCrowdedSpin = std::chrono::microseconds(10);
// Pauses between two clock reads while polling (a read is ~25 ns, a pause 20-50).
constexpr int kPausesPerClockRead = 16;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

KindTraits ShmKind::static_traits() {
  KindTraits t;
  t.name = "shm";
  // One FIFO slot per message: interleaved medians of 3 rounds at N=2, 4, 8 and 1-256 MiB
  // (docs/PERFORMANCE.md): 4 slots of 256 KiB with 256 KiB messages were best or within noise of
  // the best everywhere; 512 KiB messages (two slots each) lost 5-20% at N=4 and 8.
  t.segment_bytes = kSlotBytes;
  t.sliced_from_step_bytes = 0;
  t.stream_output = true;
  // Round values of what the start-up probe measures on this project's 2-core VM (TUNING.md).
  t.costs = {2e-6, 1.0 / 8e9, false};
  // Host memory, and registered memory (shm_regions.h) the peers read in place.
  t.memory = memory_mask(MemorySpace::host) | memory_mask(MemorySpace::registered);
  return t;
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
  // Publish the op line (a seqlock, see OpLine): peers compare it with their own call.
  OpLine& h = op_line(opts_.rank);
  const uint64_t v = h.version.load(std::memory_order_relaxed);
  h.version.store(v + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  uint64_t w[sizeof(OpTag) / 8];
  std::memcpy(w, &tag, sizeof w);
  for (size_t i = 0; i < sizeof(OpTag) / 8; ++i) h.tag[i].store(w[i], std::memory_order_relaxed);
  h.version.store(v + 2, std::memory_order_release);
  h.seq.store(tag.seq, std::memory_order_release);
  if (opts_.oversubscribed) {
    // Stored only when it changes: a rank pinned to its core writes its line once.
    const int c = sched_getcpu();
    if (c >= 0 && c != core_) {
      core_ = c;
      sleep_line(opts_.rank).core.store(static_cast<uint32_t>(c) + 1, std::memory_order_relaxed);
    }
  }
}

bool ShmKind::shares_core(int q) {
  const uint32_t c = sleep_line(q).core.load(std::memory_order_relaxed);
  return c == 0 || core_ < 0 || c == static_cast<uint32_t>(core_) + 1;
}

bool ShmKind::read_peer_tag(int q, OpTag* tag) {
  const OpLine& h = op_line(q);
  const uint64_t v1 = h.version.load(std::memory_order_acquire);
  if (v1 % 2 != 0) return false;
  uint64_t w[sizeof(OpTag) / 8];
  for (size_t i = 0; i < sizeof(OpTag) / 8; ++i) w[i] = h.tag[i].load(std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_acquire);
  if (h.version.load(std::memory_order_relaxed) != v1) return false;
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

const char* ShmKind::window_of(int rank) {
  if (rank == opts_.rank) return mine_window_;
  return static_cast<const char*>(segment(rank).get()) + window_offset(fifo_count_);
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
  for (ShmLink* l : chans_)
    if (!l->idle() || l->peer_gone()) any |= l->progress(stage);
  // Every lane has a receive posted (p2p.h), but can only move when a peer has published into
  // one (lane_posts), it has sends of its own, a lane moved last pass, or a peer is gone.
  const uint64_t posts = mine_.as<SegmentHeader>()->lane_posts.load(std::memory_order_acquire);
  const bool look = posts != lane_posts_seen_ || lanes_moved_ || gone_count_ > 0;
  lane_posts_seen_ = posts;
  lanes_moved_ = false;
  for (ShmLink* l : lanes_)
    if (look ? !l->idle() : l->has_pending_send())
      if (l->progress(stage)) lanes_moved_ = any = true, ++lane_events_;
  flush_rings();
  return any;
}

void ShmKind::flush_rings() {
  if (ringing_.empty()) return;
  // Pairs with the fence in sleep(): either the sleeper sees what we published, or we see that it
  // sleeps and wake it. With the asymmetric fence the sleeper's membarrier fences for us.
  if (asymmetric_fence_)
    std::atomic_signal_fence(std::memory_order_seq_cst);
  else
    std::atomic_thread_fence(std::memory_order_seq_cst);
  for (int q : ringing_) {
    ring_[static_cast<size_t>(q)] = 0;
    Peer& p = peers_[static_cast<size_t>(q)];
    if (p.doorbell.valid() && sleep_line(q).sleeping.load(std::memory_order_relaxed)) {
      uint64_t one = 1;
      ssize_t ignored = ::write(p.doorbell.get(), &one, sizeof one);
      (void)ignored;
    }
  }
  ringing_.clear();
}

int ShmKind::prepare_sleep() {
  sleep_line(opts_.rank).sleeping.store(1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_seq_cst);
  // Every peer's store before this point is visible now, and every later one is followed by a
  // load that sees our flag (see asymmetric_fence_). Should membarrier ever fail, a store could
  // slip past the caller's recheck: then only nap.
  if (asymmetric_fence_ && syscall(SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) != 0)
    return 1;
  return 1000;
}

void ShmKind::end_sleep() {
  sleep_line(opts_.rank).sleeping.store(0, std::memory_order_relaxed);
}

void ShmKind::peer_gone(int q) {
  Peer& p = peers_[static_cast<size_t>(q)];
  if (p.gone) return;
  p.gone = true;
  ++gone_count_;
  epoll_ctl(epoll_.get(), EPOLL_CTL_DEL, through_first_ ? p.pidfd.get() : p.in_sock.get(), nullptr);
  for (int ch = 0; ch <= opts_.channels; ++ch) slot(q, ch)->set_peer_gone();
}

void ShmKind::handle_events() {
  epoll_event events[16];
  int n = epoll_wait(epoll_.get(), events, 16, 0);
  for (int i = 0; i < n; ++i) {
    if (events[i].data.u64 == kDoorbellEvent) {
      uint64_t v;
      ssize_t ignored = ::read(doorbell_.get(), &v, sizeof v);
      (void)ignored;
      // A peer's communicator ended (its process may live on).
      const uint64_t closed = board_.head->closed_count.load(std::memory_order_acquire);
      if (closed == closed_seen_) continue;
      closed_seen_ = closed;
      for (int q : local_ranks_)
        if (q != opts_.rank && sleep_line(q).closed.load(std::memory_order_acquire)) peer_gone(q);
      continue;
    }
    const int q = static_cast<int>(events[i].data.u64);
    // A pidfd is readable only once the process has exited.
    if (through_first_) {
      peer_gone(q);
      continue;
    }
    char buf[64];
    ssize_t r = ::recv(peers_[static_cast<size_t>(q)].in_sock.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
      peer_gone(q);
  }
}

void ShmKind::throw_if_notice() {
  // A peer is failing the job: fail this op now with its reason rather than at the deadline.
  // A peer that posts a notice counts it in our header: only then are the links read.
  const uint64_t notices = mine_.as<SegmentHeader>()->notices.load(std::memory_order_acquire);
  if (notices == notices_seen_) return;
  for (ShmLink* l : active_)
    if (l->has_notice()) std::rethrow_exception(l->notice());
  notices_seen_ = notices;
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

bool ShmKind::ShmWindow::attach_region(uint32_t id, int rank, uint64_t offer, size_t bytes,
                                       std::string* why) {
  const Peer& p = t_->peers_[static_cast<size_t>(rank)];
  return t_->regions_.attach(id, rank, p.pid, p.pidfd.get(), offer, bytes, why);
}

void ShmKind::ShmWindow::notify() {
  for (int q = 0; q < t_->opts_.size; ++q)
    if (q != t_->opts_.rank) t_->ring(q);
  t_->flush_rings();
}

void ShmKind::ShmWindow::wait(ReadyFn ready, int waiting_for, const core::Deadline& deadline) {
  if (ready()) return;
  // A peer on another core usually stamps within a cache-line transfer of us: watch for that
  // alone first, without the engine's checks and clock reads. When ranks outnumber cores, only
  // for a peer that last ran on another core (a while longer: it may be waiting for its core's
  // turn); one that last ran on ours needs this very core, and the engine's loop yields it.
  const core::Clock::duration spin =
      !t_->opts_.oversubscribed ? kPreSpin
      : waiting_for >= 0 && waiting_for != t_->opts_.rank && !shares_core(waiting_for)
          ? kCrowdedSpin
          : core::Clock::duration::zero();
  if (spin > core::Clock::duration::zero()) {
    // The clock is first read after a batch of polls: most waits end within it, and a read on
    // entry cost a 4 B allreduce at N = 2 a tenth of its time (0.36 -> 0.40 us).
    auto poll_batch = [&] {
      for (int i = 0; i < kPausesPerClockRead; ++i) {
        cpu_relax();
        if (ready()) return true;
      }
      return false;
    };
    if (poll_batch()) return;
    for (const auto until = core::Clock::now() + spin; core::Clock::now() < until;)
      if (poll_batch()) return;
  }
  bool moved = false;
  auto poll = [&] {
    if (ready()) return true;
    // A peer that went away cannot post what we wait for any more.
    if (t_->gone_count_ > 0)
      for (ShmLink* l : t_->active_)
        if (l->peer_gone())
          throw PeerError("peer rank " + std::to_string(l->peer()) +
                              " is gone (its process exited or its communicator was destroyed)",
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
      const uint64_t r = t_->op_line(q).seq.load(std::memory_order_acquire);
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
