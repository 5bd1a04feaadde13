// The shared-memory kind of link: the peers on this host (the transport table routes them here
// unless RINGREDUCE_SHM=0).
//
// Start-up (shm_connect.cc): each rank creates a memfd segment for the FIFOs its peers write into
// (shm_layout.h) and an eventfd doorbell, listens on an abstract Unix socket of a random name
// (ShmListener, published in its join record), and sends both fds (SCM_RIGHTS) to the host's
// first rank, which hands each rank everyone else's; or, where pidfds cannot watch the peers,
// every pair exchanges them. Nothing is named in /dev/shm and the abstract names vanish with their
// sockets, so a crash leaves nothing behind. A peer's death is seen through a pidfd of its process
// (or its socket closing, in the mesh), the end of its communicator through a flag on the host's
// board. Through the first rank, a peer's segment is mapped on first use (its memfd is kept until
// then): a ring sends to one neighbour, and at 256 ranks mapping all 255 peers' segments, with
// page tables for each, took seconds of start-up.
//
// Progress: the engine (engine.h) polls the links, then sleeps in epoll_wait on, among others,
// this kind's epoll fd, which holds the doorbell and the peers' sockets. A rank that makes
// progress possible for a sleeping peer (published a slot, or released one) writes the peer's
// doorbell; a flag on the host's board (shm_layout.h) says whether it sleeps, so a busy pair never
// makes a syscall. (An eventfd rather than a bare futex, so that one epoll_wait covers the
// doorbell, the peers' liveness and the engine's other events.)
#pragma once

#include <algorithm>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/auth.h"
#include "core/deadline.h"
#include "core/fd.h"
#include "core/mapping.h"
#include "transport/kind.h"
#include "transport/link.h"
#include "transport/shm/shm_layout.h"
#include "transport/shm/shm_link.h"
#include "transport/shm/shm_regions.h"

namespace ringreduce::transport::shm {

// Where a rank takes its same-host peers' connections: an abstract Unix socket of a random name,
// and with RINGREDUCE_TOKEN the nonce connectors prove it against. Opened before the ranks join,
// so that its name and nonce travel in the join record (rendezvous/join.h) and every rank has
// every peer's from the join's table: no store request per peer (there were two per peer and
// rank, 130,000 at 256 ranks, through one store thread). Bound before it is published, so a
// connector that holds the name reaches this rank and nobody else.
class ShmListener final : public KindListener {
 public:
  // through_first: offer to exchange segments through the host's first rank (RINGREDUCE_SHM_CONNECT
  // is not "mesh"); it happens when every rank of the host offers it from one pid namespace.
  ShmListener(bool with_token, bool through_first);
  // "<name>|<nonce>|<pidns>": 16 hex digits, then the nonce in hex or "-" without a token, then
  // this process's pid namespace where pidfds work and the offer stands, else "-".
  std::string published() const override;
  int fd() const { return fd_.get(); }
  const core::auth::Nonce& nonce() const { return nonce_; }

 private:
  core::Fd fd_;
  uint64_t name_ = 0;
  core::auth::Nonce nonce_{};
  bool token_ = false;
  std::string pidns_;
};

struct ShmOptions {
  int rank = 0;
  int size = 1;
  int channels = 1;
  uint64_t comm_id = 0;
  // The communicator's ranks on this host, in rank order, this one among them; empty: all. Links
  // to the others belong to other kinds.
  std::vector<int> local_ranks;
  // Ranks outnumber cores: a window wait yields at once instead of spinning on its peers first.
  bool oversubscribed = false;
  // RINGREDUCE_TOKEN: peers prove they hold it before their segments are mapped; empty: no proof.
  std::string token;
  // This rank's listener, and what every rank published from its own (ShmListener::published(),
  // by rank; the join's table).
  const ShmListener* listener = nullptr;
  std::vector<std::string> published;
  // transport::ConnectArgs::check_failed.
  std::function<void()> check_failed;
};

class ShmKind final : public LinkKind {
 public:
  // Connects to every other rank of local_ranks. Bounded by deadline.
  ShmKind(const ShmOptions& opts, const core::Deadline& deadline);
  ~ShmKind() override;

  // What shared memory offers, before anything is measured.
  static KindTraits static_traits();
  const KindTraits& traits() const override { return traits_; }
  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  Link& link(int peer, int channel) override;
  Link& lane(int peer) override;
  // Counts the passes in which a lane moved (a receive or a send: more looks than needed, never
  // fewer).
  uint64_t lane_events() const override { return lane_events_; }
  // Only when every rank is here: the window algorithms read every rank's region.
  Window* window() override {
    return local_ranks_.size() == static_cast<size_t>(opts_.size) ? &window_ : nullptr;
  }
  void set_driver(Driver* driver) override { driver_ = driver; }
  void begin_op(const OpTag& tag, bool stream_output) override;
  void set_describer(std::function<std::string(const OpTag&)> f) override {
    describe_ = std::move(f);
  }
  std::string describe(const OpTag& t) const { return describe_ ? describe_(t) : "an op"; }

  // One pass over the links (staging forwards that wait for room when `stage`), then the
  // wake-ups it owes; returns whether anything moved.
  bool poll(bool stage) override { return progress_all(stage); }
  void flush() override { flush_rings(); }
  void throw_if_notice() override;
  // A peer that has begun this op's sequence number with another call: MismatchError.
  void check_idle() override { check_peer_calls(); }
  // Raises the sleep flag that makes peers ring us (see asymmetric_fence_); returns the longest
  // sleep that is safe, in ms. end_sleep lowers it.
  int prepare_sleep() override;
  void end_sleep() override;
  // Readable when a peer rings our doorbell or a peer's process goes away.
  int event_fd() const override { return epoll_.get(); }
  // Reads the doorbell and the peers' sockets, without blocking.
  void handle_events() override;
  int stuck_peer(bool* sending) const override;
  void abort(int code, int blamed_rank, const std::string& reason) override;
  std::exception_ptr find_cause(int blamed) override;

  const OpTag& tag() const { return tag_; }
  // Whether this op writes its output with streaming stores (see begin_op).
  bool stream_output() const { return stream_output_; }
  // Called by links that published or released a slot: the peer is woken at the end of the pass
  // if it sleeps.
  void ring(int peer) {
    uint8_t& r = ring_[static_cast<size_t>(peer)];
    if (!r) r = 1, ringing_.push_back(peer);
  }
  // Peer q's segment, mapped (and checked) on first use. Throws an Error naming q if it cannot be.
  const Mapping& segment(int q);

 private:
  class ShmWindow final : public Window {
   public:
    explicit ShmWindow(ShmKind* t) : t_(t) {}
    size_t bytes() const override { return kWindowBytes; }
    char* mine() override { return t_->mine_window_; }
    const char* of(int rank) override { return t_->window_of(rank); }
    char* line(int rank, int which) override {
      return t_->board_.lines[t_->local(rank)].line[which];
    }
    void notify() override;
    void wait(ReadyFn ready, int waiting_for, const core::Deadline& deadline) override;
    // A window exists only when every rank is on this host (window()), so every rank is local.
    bool shares_core(int rank) override {
      return t_->opts_.oversubscribed && t_->shares_core(rank);
    }
    uint64_t fingerprint() const override { return t_->fingerprint_; }
    [[noreturn]] void mismatch(int rank) override;
    void wait_all_reached(uint64_t seq, const core::Deadline& deadline) override;
    void note_all_reached(uint64_t seq) override { floor_ = std::max(floor_, seq); }
    char* create_region(uint32_t id, size_t bytes, uint64_t* offer, std::string* why) override {
      return t_->regions_.create(id, bytes, offer, why);
    }
    bool attach_region(uint32_t id, int rank, uint64_t offer, size_t bytes,
                       std::string* why) override;
    void commit_region(uint32_t id, bool shared) override { t_->regions_.commit(id, shared); }
    void release_region(uint32_t id) override { t_->regions_.release(id); }
    Region find_region(const void* p, size_t bytes) const override {
      return t_->regions_.find(p, bytes);
    }
    char* region_of(int rank, Region r) override { return t_->regions_.of(rank, r); }

   private:
    ShmKind* t_;
    uint64_t floor_ = 0;  // every peer is known to have reached this op
  };

  static constexpr uint64_t kDoorbellEvent = ~0ull;  // epoll data of the doorbell; else a rank

  void connect_peers(const core::Deadline& deadline);
  // One accepted start-up connection: false while its hello has not arrived; else true, with its
  // hello and segment checked and the peer taken (*expected counted down, `s` moved into it), or
  // the connection dropped and logged (*last_drop says why).
  bool accept_peer(core::Fd& s, const core::auth::Nonce& nonce, int* expected,
                   std::string* last_drop);
  // Whether the segment in `fd` is q's for this communicator (its header, read without mapping
  // it; *membarrier_ok, if given: SegmentHeader::membarrier_ok); else *why.
  bool check_segment(int q, int fd, std::string* why, uint32_t* membarrier_ok) const;
  // The host's first rank, once every rank has connected: each one's peers' segments, doorbells
  // and pids. The others: receiving them over `sock`, their connection to it.
  void hand_out(const core::Deadline& deadline, const std::function<void()>& check_failed);
  void receive_from_first(core::Fd sock, const core::Deadline& deadline,
                          const std::function<void()>& check_failed);
  // After the host's first rank dropped this rank's start-up connection: throws the job's failure
  // if it is marked within a second (the first rank marks it after its sockets close).
  void await_failure_mark(const core::Deadline& deadline) const;
  // The links over the mapped segments, and the peers' liveness in the epoll set.
  void make_links();
  // Marks every link to q as gone (its process or communicator ended).
  void peer_gone(int q);
  bool progress_all(bool stage = false);
  void flush_rings();
  // A peer that has begun this op's sequence number with another call: MismatchError.
  void check_peer_calls();
  // The tag a peer published for the op it has begun; false if it is being rewritten.
  bool read_peer_tag(int q, OpTag* tag);
  const char* window_of(int rank);
  // Per peer: its channels' links, then its lane (at channel index `channels`).
  size_t stride() const { return static_cast<size_t>(opts_.channels) + 1; }
  ShmLink* slot(int peer, int channel) {
    return links_[static_cast<size_t>(peer) * stride() + static_cast<size_t>(channel)].get();
  }

  ShmOptions opts_;
  KindTraits traits_ = static_traits();
  Driver* driver_ = nullptr;
  Mapping mine_;
  core::Fd memfd_;
  core::Fd doorbell_;  // our eventfd; peers write it
  core::Fd epoll_;
  struct Peer {
    Mapping segment;
    core::Fd doorbell;
    core::Fd out_sock;  // we connected: keeps the peer's view of us alive
    core::Fd in_sock;   // it connected: closes when it goes
    // Its segment until mapped (segment()); the host's first rank also hands it out.
    core::Fd memfd;
    core::Fd pidfd;  // readable once its process has exited (through the first rank)
    int pid = 0;
    bool gone = false;
  };
  std::vector<Peer> peers_;  // by rank; empty for self
  std::vector<std::unique_ptr<ShmLink>> links_;
  std::vector<ShmLink*> active_;  // every link
  std::vector<ShmLink*> chans_;   // the collectives' links, each looked at on every pass
  std::vector<ShmLink*> lanes_;   // the lanes, looked at when SegmentHeader::lane_posts moves
  uint64_t lane_posts_seen_ = 0;
  bool lanes_moved_ = false;      // a lane moved in the last pass: look again
  uint64_t lane_events_ = 0;      // lane_events()
  uint64_t notices_seen_ = 0;     // SegmentHeader::notices when no notice was found
  int gone_count_ = 0;            // peers whose process or communicator has ended
  std::vector<int> local_ranks_;  // the ranks on this host (this one too)
  std::vector<int> local_index_;  // by rank: its index in local_ranks_, or -1
  size_t fifo_count_ = 0;         // in every local rank's segment
  // The board (shm_layout.h) in the first local rank's segment, by local index; set once linked.
  Board board_;
  size_t local(int rank) const {
    return static_cast<size_t>(local_index_[static_cast<size_t>(rank)]);
  }
  BoardLine& sleep_line(int rank) { return board_.sleep[local(rank)]; }
  OpLine& op_line(int rank) { return board_.ops[local(rank)]; }
  bool is_local(int rank) const { return local_index_[static_cast<size_t>(rank)] >= 0; }
  // Whether rank q last began an op on this rank's core (or either is not known).
  bool shares_core(int q);
  std::vector<uint8_t> ring_;  // by rank: owed a wake-up at the end of this pass
  std::vector<int> ringing_;   // the ranks marked in ring_
  OpTag tag_;
  uint64_t fingerprint_ = 0;
  bool stream_output_ = false;
  int core_ = -1;  // where this rank last began an op, when ranks outnumber cores
  char* mine_window_ = nullptr;
  // Whether creation touches the pages ops use, so that an op's first call does not fault them
  // in (10-20 us a page on some VMs: 17 ms for a 1 MiB allreduce's first call at N = 4, against
  // its 0.2 ms median). Up to kPrefaultWholeMaxRanks ranks per host, every window whole and the
  // channel-0 FIFOs both ways (at N = 4, 3.5k pages a rank); up to kPrefaultMaxRanks, every
  // window's hot part (Window::kHotBytes, where the small ops keep their data). Above, nothing:
  // segments stay mapped on first use (StartUp.SegmentsAreMappedOnFirstUse, at 16 ranks), since
  // each rank maps all N windows (at 16 ranks on this VM's 2 cores the hot parts cost 0.72-0.76
  // -> 0.76-0.81 s to ready, the whole windows 0.3-0.45 s more).
  bool prefault() const { return local_ranks_.size() <= kPrefaultMaxRanks; }
  static constexpr size_t kPrefaultMaxRanks = 8;
  static constexpr size_t kPrefaultWholeMaxRanks = 4;
  bool prefault_fifos() const { return local_ranks_.size() <= kPrefaultWholeMaxRanks; }
  size_t prefault_window_bytes() const {
    return prefault_fifos() ? kWindowBytes : Window::kHotBytes;
  }
  void touch_own_pages();   // before any peer maps our segment
  void touch_peer_pages();  // once every peer's segment is mapped
  // Index of the FIFO from local rank `from` on `channel` in its receiver's segment.
  size_t fifo_index(int from, int channel) const {
    return static_cast<size_t>(local_index_[static_cast<size_t>(from)]) * stride() +
           static_cast<size_t>(channel);
  }
  ShmWindow window_{this};
  Regions regions_{opts_.rank, opts_.size};  // the window's registered memory
  std::function<std::string(const OpTag&)> describe_;
  bool aborted_ = false;
  // Segments came through the host's first rank (else every pair connected).
  bool through_first_ = false;
  uint64_t closed_seen_ = 0;  // BoardHeader::closed_count when last looked at
  // The sleep/wake handshake (flush_rings, sleep) is Dekker's: a waker stores its data and then
  // loads the peer's sleep flag, a sleeper stores its flag and then loads the data. Either both
  // sides fence, or (when every rank could register for it) the sleeper alone issues
  // membarrier(GLOBAL_EXPEDITED), which fences every registered thread on its behalf: the rare
  // sleeper pays a syscall so that every publish, the common case, pays no fence.
  bool asymmetric_fence_ = false;
  // Every peer whose segment header this rank read registered for membarrier (in the mesh), or
  // the host's first rank said every rank did.
  bool membarrier_all_ = true;
};

}  // namespace ringreduce::transport::shm
