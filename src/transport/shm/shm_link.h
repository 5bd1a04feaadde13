// One same-host peer on one channel: an outgoing FIFO in the peer's segment, an incoming FIFO in
// ours, and queues of posted primitives that the transport's progress loop advances.
#pragma once

#include <deque>
#include <exception>
#include <string>

#include "transport/link.h"
#include "transport/shm/shm_layout.h"

namespace ringreduce::transport::shm {

class ShmKind;

class ShmLink final : public Link {
 public:
  // lane: a point-to-point lane (LinkKind::lane): its messages carry lane_tag(), and its peer's
  // exit is left to its owner instead of failing its standing receive. out_index: our FIFO's
  // index in the peer's segment, which is mapped when this link first sends (or fails).
  ShmLink(ShmKind* owner, int peer, Fifo in, size_t out_index, bool lane = false);
  int peer() const override { return peer_; }
  bool lane() const { return lane_; }
  bool closed() const override { return peer_gone_; }

  void send(const void* src, size_t bytes, Completion* c) override;
  void recv(void* dst, size_t bytes, Completion* c) override;
  void recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                   Completion* c) override;
  // Fused: reads the incoming slot and `local`, and writes the result straight into next's
  // outgoing slot (one pass instead of three; dst is written only with keep). The forward holds
  // its place in next's queue from posting on; it goes straight out when it reaches the front of
  // that queue and next has a free slot. Otherwise the receive waits, unless progress(stage)
  // asks it to stage: the result then goes to dst and is sent from there later. Staging is what
  // keeps any schedule free of deadlock (a receive need never wait for a forward); a schedule
  // posted slice by slice rarely needs it (the engine stages only before sleeping).
  void recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r, Link& next,
                        bool keep, Completion* c) override;
  // Fused: copies each incoming slot into dst and into next's outgoing slot.
  void recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) override;
  // Coded: a send codes each piece straight into the peer's slot, a receive decodes (and adds)
  // straight out of ours: no copy besides the coding itself.
  void send_coded(const float* src, size_t count, Wire wire, Completion* c) override;
  void recv_coded(float* dst, const float* local, size_t count, Wire wire, Completion* c) override;
  // A forward to another kind of link (a TCP link of a rank on another host) is not fused: the
  // receive stages it in dst and the other link sends it from there as it arrives.
  void* reserve_forward(const void* src, size_t bytes, Completion* c) override;
  void forward_ready(void* handle, size_t ready) override;

  // Moves what can move now without waiting; with stage, fused receives that cannot forward
  // straight away stage their result in dst instead of waiting. Returns whether anything moved.
  // Throws MismatchError / PeerError on a mismatched or failed peer.
  bool progress(bool stage = false);
  // The send half of progress(): publishes what is ready while slots are free.
  bool progress_sends();
  bool idle() const { return sends_.empty() && recvs_.empty(); }
  bool has_pending_recv() const { return !recvs_.empty(); }
  bool has_pending_send() const { return !sends_.empty(); }

  // The peer's abort notice, if it has posted one (null otherwise); checked by the transport.
  std::exception_ptr notice() const;
  int notice_code() const;
  bool has_notice() const {
    return in_.control()->abort_state.load(std::memory_order_acquire) != 0;
  }
  // The peer's process is gone (its Unix socket closed). Pending and later primitives fail once
  // nothing more can be read from it.
  void set_peer_gone() { peer_gone_ = true; }
  bool peer_gone() const { return peer_gone_; }
  // Drops every queued primitive and posts the abort notice in the peer's copy of our FIFO.
  void fail(int code, int blamed_rank, const std::string& reason);

 private:
  enum class RecvKind : uint8_t { plain, reduce, copy_send, reduce_send, coded };
  // A coded message's floats (send: read and coded; receive: written, added to `local`).
  struct Coded {
    const float* local = nullptr;
    size_t count = 0;
    Wire wire = Wire::none;
  };
  // A message to send: an explicit send (all of it ready at src) or a forward, whose bytes become
  // ready as its receive produces them, either straight into our slots (ready == done) or staged
  // at src (ready > done: those go out first).
  struct SendOp {
    const char* src;
    size_t bytes;  // of the message
    size_t done;   // published
    size_t ready;  // available at src (or written directly: then equal to done)
    Completion* c;
    OpTag tag;
    Coded coded;  // wire set: src holds coded.count floats, coded as they are published
  };
  struct RecvOp {
    RecvKind kind = RecvKind::plain;
    char* dst = nullptr;
    const char* local = nullptr;
    size_t bytes = 0;
    size_t done = 0;
    bool started = false;
    bool keep = true;
    Reduction red;
    ShmLink* next = nullptr;  // a fused forward's link
    SendOp* fwd = nullptr;    // the forward's place in next's queue (deque elements do not move)
    Link* xnext = nullptr;    // a forward to another kind of link, staged in dst
    void* xfwd = nullptr;     // its place in xnext's queue
    Completion* c = nullptr;
    Coded coded;  // RecvKind::coded
  };
  SendOp* push_send(const char* src, size_t bytes, size_t ready, Completion* c);
  // Whether a fused receive may write the next n bytes of forward f straight into our slot.
  bool can_forward_now(const SendOp* f);
  void forwarded(SendOp* f, size_t n);

  void post_recv(RecvKind kind, void* dst, const void* local, size_t bytes, const Reduction& r,
                 Link* next, bool keep, Completion* c, const Coded* coded = nullptr);
  // Decodes a coded receive's piece of n bytes at src.
  void decode_piece(RecvOp& op, const char* src, size_t n);
  void stage_cross(RecvOp& op, const char* src, size_t n);
  bool out_has_credit();
  bool in_has_data();
  // Writes n bytes of a message into the next outgoing slot and publishes it.
  void publish(const OpTag& tag, size_t message_bytes, bool first, const char* src, size_t n);
  char* out_slot() const { return out_.data(out_head_); }
  // Sets out_ and out_header_ from the peer's segment (ShmKind::segment maps it on first use).
  void bind_out();
  void commit_out(const OpTag& tag, size_t message_bytes, bool first, size_t n);
  [[noreturn]] void peer_failed(const std::string& what);
  void check_gone();

  // The tag this link's messages carry and its receives expect.
  const OpTag& tag() const;

  ShmKind* owner_;
  int peer_;
  bool lane_;
  // The header of the segment out_ lies in (SegmentHeader::lane_posts, notices); null until bound.
  SegmentHeader* out_header_ = nullptr;
  OpTag lane_tag_ = lane_tag();
  Fifo in_;                // peer -> us, in our segment
  size_t out_index_;       // of out_ in the peer's segment
  Fifo out_;               // us -> peer, in the peer's segment (bind_out())
  uint64_t in_tail_ = 0;   // our release count (we are the only writer of in.tail)
  uint64_t in_head_ = 0;   // last head seen
  uint64_t out_head_ = 0;  // our publish count (we are the only writer of out.head)
  uint64_t out_tail_ = 0;  // last tail seen
  bool peer_gone_ = false;
  bool failed_ = false;
  std::deque<SendOp> sends_;
  std::deque<RecvOp> recvs_;
};

}  // namespace ringreduce::transport::shm
