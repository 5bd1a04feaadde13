// The transport contract: links between ranks that move bytes, and nothing else.
//
// Algorithms are written against the non-blocking primitives of Link (docs/ARCHITECTURE.md, "How a
// call runs"). Each primitive is posted, not performed: it is queued on the link and finished by
// the transport's progress engine while the algorithm waits on a Completion. Posting never
// blocks. Per link, messages go out in the order they were posted, a forward (recv_reduce_send,
// recv_copy_send) taking its place on `next` when its receive is posted; receives match the
// peer's messages in order. So two ranks running the same schedule agree on every message
// without tags, whatever order the schedule posts in.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>

#include "core/deadline.h"
#include "ringreduce/error.h"
#include "ringreduce/types.h"

namespace ringreduce::transport {

// Counts posted primitives that have not finished yet. Owned by the algorithm (usually on its
// stack); the transport decrements it. One Completion may cover any number of primitives.
struct Completion {
  size_t outstanding = 0;
  bool done() const { return outstanding == 0; }
};

// What a receive combines with: dst = local (op) incoming, then dst /= divide_by when > 1
// (ReduceOp::avg divides once, on the step that completes the reduction).
struct Reduction {
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  uint64_t divide_by = 1;
};

// Identifies the op a message belongs to. Every message carries the sender's tag and every
// receive checks it against its own, so ranks that issued different calls get a MismatchError
// naming both calls on the first message instead of exchanging garbage. The transport treats the
// tag as opaque bytes; comm/ fills it in and describes it.
struct OpTag {
  uint64_t seq = 0;
  uint64_t count = 0;
  uint64_t segment_bytes = 0;
  int32_t root = -1;
  uint8_t kind = 0;
  uint8_t dtype = 0;
  uint8_t op = 0;
  uint8_t algo = 0;
  uint16_t channels = 0;
  uint16_t flags = 0;  // kTagSliced: the ring schedule was posted slice by slice
  uint8_t wire = 0;    // the narrow wire format (Wire) of a coded collective, else 0
  uint8_t reserved1[3] = {};
  uint64_t reserved2 = 0;
  bool operator==(const OpTag&) const = default;
};
static_assert(sizeof(OpTag) == 48, "OpTag is part of the wire format");
inline constexpr uint16_t kTagSliced = 1;
inline constexpr uint16_t kTagDevice = 2;  // run over device links, on device buffers

// The tag of every message on a point-to-point lane (p2p.h): lanes match their messages by their
// own headers, never by the collectives' sequence.
inline constexpr uint8_t kLaneKind = 0xFF;
inline OpTag lane_tag() {
  OpTag t;
  t.kind = kLaneKind;
  return t;
}

class Link {
 public:
  virtual ~Link() = default;
  virtual int peer() const = 0;

  // Sends bytes from src; src must stay valid and unchanged until c is done.
  virtual void send(const void* src, size_t bytes, Completion* c) = 0;
  // Receives exactly bytes into dst.
  virtual void recv(void* dst, size_t bytes, Completion* c) = 0;
  // dst = local (op) incoming; dst may equal local.
  virtual void recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                           Completion* c) = 0;
  // local (op) incoming is sent on next (after everything posted there before). With keep, dst
  // also receives the result; without, dst is scratch the transport may use to stage the result
  // or leave untouched (shared memory writes straight into next's slot), and callers must not
  // read it afterwards. c counts once and is done when the forward has been sent.
  virtual void recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r,
                                Link& next, bool keep, Completion* c) = 0;
  // Receives into dst, then sends dst on next.
  virtual void recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) = 0;

  // Narrow wire formats (reduce/wire.h, CallOptions::wire): sends `count` floats from src coded
  // as `wire` (not none or automatic), each piece coded as it goes out, into the link's staging
  // or straight into a shared-memory slot: never a pass over the whole buffer first. A message
  // is cut only between the format's units, so each piece decodes on its own.
  virtual void send_coded(const float* src, size_t count, Wire wire, Completion* c) = 0;
  // Receives `count` floats sent coded as `wire`: dst = the decoded values (local null) or
  // local + them (dst may be local), each piece decoded as it arrives.
  virtual void recv_coded(float* dst, const float* local, size_t count, Wire wire,
                          Completion* c) = 0;

  // How a forward crosses between links of different kinds (a shared-memory link receiving what
  // a TCP link sends on, and back), where the fused paths cannot apply. Called by the receiving
  // link, never by algorithms. reserve_forward queues, at posting time, a send of `bytes` from
  // src that is not ready yet (it holds its place: later sends wait behind it) and counts on c;
  // forward_ready says the first `ready` bytes at src are final now, in order, up to bytes.
  virtual void* reserve_forward(const void* src, size_t bytes, Completion* c) = 0;
  virtual void forward_ready(void* handle, size_t ready) = 0;

  // Whether the peer's end is gone (its process exited or closed the link). A collective link
  // fails what it still has posted when that happens; a point-to-point lane (LinkKind::lane)
  // always has a receive posted and leaves the failing to its owner, which knows whether anyone
  // still needs the peer.
  virtual bool closed() const = 0;
};

// A non-owning reference to a callable (no allocation, unlike std::function): waits take what to
// check and what to do on a timeout this way.
template <class R>
class FnRef {
 public:
  template <class F>
  FnRef(F& f)  // NOLINT(google-explicit-constructor): a lambda converts implicitly
      : obj_(&f), call_([](void* o) -> R { return (*static_cast<F*>(o))(); }) {}
  R operator()() const { return call_(obj_); }

 private:
  void* obj_;
  R (*call_)(void*);
};
using ReadyFn = FnRef<bool>;

// Memory that every rank of a communicator can read: one region per rank, written only by its
// owner. Algorithms that read their peers' data in place instead of receiving messages (the flat
// small-message collectives, the direct reduce-scatter) use it; only a transport whose ranks share
// one host has one, and the tuner picks those algorithms only then.
//
// The window only moves nothing: the algorithm lays out its region and publishes what it wrote
// with a release store (std::atomic_ref) of a stamp there; readers acquire-load the stamp before
// reading. What the window adds is waiting: wait() drives the transport exactly as
// Transport::wait does (bounded spin, yielding when ranks outnumber cores, then sleep; deadline;
// dead peers; abort notices; and a peer seen at this op's sequence number with another call is a
// MismatchError), and notify() wakes the peers that sleep in it.
class Window {
 public:
  virtual ~Window() = default;
  virtual size_t bytes() const = 0;  // of each rank's region
  virtual char* mine() = 0;
  virtual const char* of(int rank) = 0;
  // Besides its region, each rank has kLines cache lines for stamps and small payloads, every
  // rank's packed together: a rank that reads every peer's line touches a few pages, where a
  // line in each peer's region costs a page (and at first a fault) per peer.
  static constexpr int kLines = 2;
  static constexpr size_t kLineBytes = 64;
  // The first bytes of each rank's region, where small ops keep their data (the flat
  // collectives' two areas) and the registered allreduce its stamps: a transport may make them
  // resident at creation, so that a call does not fault them in (10-20 us a page on some VMs,
  // against a small op's 0.4 us).
  static constexpr size_t kHotBytes = (128 << 10) + 4096;
  virtual char* line(int rank, int which) = 0;
  // After storing a stamp: wakes the peers that sleep so that they look at it.
  virtual void notify() = 0;
  // Returns once ready() is true. ready() is called often and must be cheap; it may throw
  // (a MismatchError it found). `waiting_for` names the rank to blame on a timeout.
  virtual void wait(ReadyFn ready, int waiting_for, const core::Deadline& deadline) = 0;
  // When ranks outnumber cores: whether `rank` last ran on this rank's core (true when not
  // known). Of several peers it waits for, an algorithm waits first for those that need this
  // core; wait() gives its core up at once for them, and watches a while for the others.
  virtual bool shares_core(int rank) = 0;
  // A 64-bit digest of the current op's tag: algorithms store it beside their stamps, so that a
  // reader that finds another digest knows the writer is in another call.
  virtual uint64_t fingerprint() const = 0;
  // Throws the MismatchError for a rank found at this op's stamp with another fingerprint.
  [[noreturn]] virtual void mismatch(int rank) = 0;
  // Waits until every peer has begun op `seq` or a later one (and so has finished every op
  // before it): after that nobody reads what this rank wrote in its region before op seq.
  virtual void wait_all_reached(uint64_t seq, const core::Deadline& deadline) = 0;
  // Tells the window what the algorithm has seen for itself (every peer stamped op seq), so that
  // a later wait_all_reached(seq) costs nothing.
  virtual void note_all_reached(uint64_t seq) = 0;

  // Registered memory (Communicator::alloc; NCCL's registered user buffers): each rank's
  // allocation mapped by every peer, so that an algorithm reads and writes a peer's buffer in
  // place instead of staging it. Made collectively by the communicator: create_region on every
  // rank (the same id everywhere), each rank's offer passed to every peer, attach_region for
  // each peer's, then commit_region on every rank with whether every rank attached every peer's
  // (only then does find_region see it). Ids are never reused.
  struct Region {
    static constexpr uint32_t kNone = UINT32_MAX;
    uint32_t id = kNone;
    uint64_t offset = 0;
  };
  // This rank's memory for region `id` (*offer: what a peer needs to attach it); null with *why.
  virtual char* create_region(uint32_t id, size_t bytes, uint64_t* offer, std::string* why) = 0;
  // Maps rank's region `id` of `bytes` from its offer; false with *why.
  virtual bool attach_region(uint32_t id, int rank, uint64_t offer, size_t bytes,
                             std::string* why) = 0;
  virtual void commit_region(uint32_t id, bool shared) = 0;
  // Unmaps region `id` here, ours and the peers' views (after every rank is done with it).
  virtual void release_region(uint32_t id) = 0;
  // Where [p, p + bytes) lies inside one of this rank's shared regions (id kNone if it does not).
  // Thread-safe against the calls above.
  virtual Region find_region(const void* p, size_t bytes) const = 0;
  // Rank's region r.id at r.offset, as mapped in this process (ours when rank is this rank).
  virtual char* region_of(int rank, Region r) = 0;
};

// The set of links of one communicator and the engine that progresses them.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual int channels() const = 0;
  virtual Link& link(int peer, int channel) = 0;
  // The shared window, when every rank is on this host; null otherwise.
  virtual Window* window() { return nullptr; }

  // Sets the tag every message carries and every receive expects from now on. With
  // stream_output, receives write their destination with streaming stores (the tuner's call: a
  // large out-of-place output that nobody reads soon); transports may ignore it.
  virtual void begin_op(const OpTag& tag, bool stream_output = false) = 0;
  // Drives progress until c is done. Throws PeerError (a peer closed, reset, or sent something
  // unreadable or an abort notice), MismatchError (tag mismatch), TimeoutError (deadline; names
  // the peer waited on) or Error (aborted). After a throw the transport is unusable: call abort().
  virtual void wait(Completion& c, const core::Deadline& deadline) = 0;
  // Fails the transport: drops every queued primitive (so no user buffer is touched afterwards)
  // and tells the peers why (best effort, never blocking), so that they fail with this reason
  // instead of a bare closed connection. blamed_rank (or -1) is the rank the failure is pinned on
  // (a dead or stuck peer): the peers' PeerError names it too. Called by the thread that drives
  // progress, never concurrently with wait(). Idempotent.
  virtual void abort(int code, int blamed_rank, const std::string& reason) = 0;
  // After wait() threw because a peer went away (ErrorCode::peer, pinned on `blamed`): looks for
  // up to `grace` for a notice from any peer that gives a deeper cause: a mismatch, an abort, or
  // a lost peer other than `blamed` (the rank that closed on us may have been failed by such a
  // cause without being able to tell us, e.g. while it was in the middle of a frame to us).
  // Null if there is none. Call before abort(); consumes what the peers sent, so the transport is
  // only good for abort() afterwards.
  virtual std::exception_ptr find_cause(std::chrono::milliseconds grace, int blamed) = 0;
  // For error messages: turns a peer's tag into words ("allreduce #3 (float x 100, sum)").
  virtual void set_describer(std::function<std::string(const OpTag&)> f) = 0;
  // Thread-safe: makes a wait() in progress (or the next one) throw promptly: an Error with
  // `reason` and `code` (an ErrorCode: aborted for abort(), mismatch when the stall monitor finds
  // that the ranks waiting for each other issued different calls), via throw_interrupt().
  virtual void interrupt(const std::string& reason, int code) = 0;
};

// A peer's abort notice that pins the failure on a rank (a dead one, say), as the links raise it:
// the peer looked for a deeper cause before it passed this one on, so its receiver need not wait
// to look again (CommImpl::fail_communicator).
class NoticeError : public PeerError {
 public:
  using PeerError::PeerError;
};

// For find_cause: whether a peer's notice (an Error it failed with, passed on) says more than our
// own PeerError pinned on `blamed`.
bool is_deeper_cause(const std::exception_ptr& notice, int blamed);

// The error an interrupt() becomes, of the class its code stands for.
[[noreturn]] void throw_interrupt(const std::string& reason, int code);

}  // namespace ringreduce::transport
