// One TCP connection to one peer on one channel: queues of posted primitives that the transport's
// progress engine advances when the socket is readable or writable. A link exists before its
// connection (connections are made on first use, tcp/connector.h): primitives queue until the
// connection is attached, and the first send asks the kind to connect.
#pragma once

#include <sys/uio.h>

#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "core/fd.h"
#include "transport/link.h"
#include "transport/tcp/secure_channel.h"
#include "transport/tcp/wire.h"

namespace ringreduce::transport::tcp {

class TcpKind;

class TcpLink final : public Link {
 public:
  // lane: a point-to-point lane (LinkKind::lane): its frames carry lane_tag(), and its peer's
  // closing is left to its owner instead of failing its standing receive.
  TcpLink(TcpKind* owner, int peer, int channel, bool lane = false);
  // Gives the link its connection (its hello exchanged, non-blocking): what was queued goes.
  // The kind registers it with epoll first.
  // secure: the connection's record layer when encrypted (RINGREDUCE_ENCRYPT), else null.
  void attach(core::Fd fd, std::unique_ptr<SecureChannel> secure = nullptr);
  bool connected() const { return fd_.valid(); }
  int peer() const override { return peer_; }
  bool lane() const { return lane_; }
  bool closed() const override { return closed_by_peer_ || failed_; }
  int channel() const { return channel_; }
  int fd() const { return fd_.get(); }

  void send(const void* src, size_t bytes, Completion* c) override;
  void recv(void* dst, size_t bytes, Completion* c) override;
  void recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                   Completion* c) override;
  void recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r, Link& next,
                        bool keep, Completion* c) override;
  void recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) override;
  // Coded: a send codes its next piece into the link's staging buffer when the socket has taken
  // the last one (so a piece is coded while the previous one is still on the wire, and goes out
  // from cache); a receive decodes (and adds) out of the inbox, like recv_reduce.
  void send_coded(const float* src, size_t count, Wire wire, Completion* c) override;
  void recv_coded(float* dst, const float* local, size_t count, Wire wire, Completion* c) override;
  // Forwards between a TCP link and another kind (shared memory): see Link. A frame whose bytes
  // are only partly ready goes out up to there (its header first), and nothing queued after it
  // goes before it is complete.
  void* reserve_forward(const void* src, size_t bytes, Completion* c) override;
  void forward_ready(void* handle, size_t ready) override;

  // Called by the engine. Each does a bounded amount of work so one busy link cannot starve the
  // others, and throws PeerError / MismatchError on a broken or mismatched peer.
  void on_readable();
  void on_writable();

  bool has_pending_recv() const { return !recvs_.empty(); }
  // The peer's abort notice, once read (null before).
  const std::exception_ptr& notice() const { return notice_; }
  // The ErrorCode the peer's notice carried.
  int notice_code() const { return notice_code_; }
  // For Transport::find_cause: reads what the peer has sent, without waiting, skipping data
  // frames, until an abort notice turns up. Consumes the stream, so only for a failing
  // communicator. True once there is nothing more to learn (notice read, stream ended or corrupt).
  bool salvage_notice();
  bool has_pending_send() const { return !sends_.empty(); }
  // Milliseconds since the peer's host last acknowledged anything, while the kernel is
  // retransmitting our data or probing a closed window to it; 0 otherwise (a quiet peer with
  // nothing of ours outstanding may simply have nothing to say). A live host acknowledges within
  // a round trip even when its process is stopped, so a long silence here means the network to
  // it, or the host itself, is down: the rank a timed-out wait should name.
  int64_t unanswered_ms() const;
  // Events this link wants from epoll now (EPOLLIN and/or EPOLLOUT).
  uint32_t wanted_events() const;
  uint32_t registered_events = 0;  // what epoll currently has; maintained by the transport
  bool registered = false;         // whether the fd is in the epoll set at all
  // A link whose peer closed, or that failed, is done for good: epoll would report EPOLLHUP on it
  // forever, whatever the interest, so the transport takes it out of the set.
  bool finished() const { return failed_ || closed_by_peer_; }

  // Drops every queued primitive, then, if the byte stream is at a frame boundary, queues an
  // abort frame with the reason and tries once to write it; finally shuts down the write side.
  void fail(int code, int blamed_rank, const std::string& reason);

 private:
  enum class RecvKind : uint8_t { plain, reduce, copy_send, reduce_send, coded };
  // A coded send's source: its floats, coded into stage_ piece by piece (fill_stage).
  struct Coded {
    const float* src = nullptr;
    size_t count = 0;
    Wire wire = Wire::none;
    uint64_t id = 0;  // tells stage_'s owner apart (deque slots are reused)
  };
  struct SendOp {
    FrameHeader header;
    const char* data;
    size_t bytes;    // payload bytes
    size_t written;  // of header + payload
    Completion* c;   // may be null (abort notice)
    // Payload bytes final at data. A forward is queued at posting with none: it holds its place
    // (and everything queued after it) until its receive makes them ready.
    size_t ready;
    Coded coded;  // coded.src set: a coded send (data is null; bytes are wire bytes)
  };
  // How much of op's frame (header + payload) may be written now.
  static size_t writable_prefix(const SendOp& op);
  // Appends to iov[*n] the (at most two) pieces of op's frame from what is written up to `limit`
  // (header, then payload); returns the bytes they cover. A coded send's payload comes from
  // stage_, one piece at a time: *more is set when its frame goes on beyond that piece.
  size_t frame_iovecs(SendOp& op, size_t limit, iovec* iov, int* n, bool* more = nullptr);
  // Codes the piece of op's payload that starts at byte `at` (a unit boundary) into stage_.
  void fill_stage(const SendOp& op, size_t at);
  // On failure: writes the rest of the front frame if it can at once (fail() explains).
  void finish_frame_for_notice();
  struct RecvOp {
    RecvKind kind = RecvKind::plain;
    char* dst = nullptr;
    const char* local = nullptr;
    size_t bytes = 0;
    size_t done = 0;
    Reduction red;
    TcpLink* next = nullptr;  // a forward on another TCP link
    SendOp* fwd = nullptr;    // its place in next's queue (deque elements do not move)
    Link* xnext = nullptr;    // a forward on another kind of link
    void* xfwd = nullptr;     // its place in xnext's queue
    Completion* c = nullptr;
    // RecvKind::coded: floats into dst (added to `local` when it is set), coded as `wire`.
    size_t count = 0;
    Wire wire = Wire::none;
  };

  // Queues op (its kind, buffers, bytes, reduction and completion filled in); next: a forward.
  void post_recv(RecvOp op, Link* next);
  // Queues a frame; a forward is queued not ready, at posting, and released by its receive.
  SendOp* enqueue_send(const void* src, size_t bytes, Completion* c, bool ready = true,
                       const Coded* coded = nullptr);
  // Decodes what the inbox holds of a coded receive's frame; returns the bytes it took.
  size_t decode_from_inbox(RecvOp& op, size_t avail);
  void set_ready(SendOp* f, size_t ready);
  // A receive's bytes up to op.done are final in dst: a forward on another kind may take them.
  static void pass_on(RecvOp& op) {
    if (op.xnext) op.xnext->forward_ready(op.xfwd, op.done);
  }
  // Consumes what the inbox holds into posted receives, until it needs more bytes.
  void drain_inbox();
  void finish_recv();
  [[noreturn]] void peer_failed(const std::string& what, int err = 0);
  void peer_closed(int err);
  void read_pending_notice();
  void set_notice(int32_t code, int32_t blamed, const std::string& reason);

  // The tag this link's frames carry and its receives expect.
  const OpTag& tag() const;
  // The socket's I/O, through the record layer when the connection is encrypted: as sendmsg and
  // recv (MSG_DONTWAIT), in plaintext bytes. A record that fails its check is a PeerError naming
  // the peer and what happened to it on the way.
  ssize_t io_send(iovec* iov, int n);
  ssize_t io_recv(void* dst, size_t room);

  TcpKind* owner_;
  int peer_;
  int channel_;
  bool lane_;
  OpTag lane_tag_ = lane_tag();
  core::Fd fd_;
  std::unique_ptr<SecureChannel> secure_;
  bool failed_ = false;
  bool closed_by_peer_ = false;
  std::exception_ptr notice_;
  int notice_code_ = 0;
  bool salvaging_ = false;
  bool salvage_done_ = false;
  size_t salvage_skip_ = 0;  // payload bytes of a data frame still to be skipped
  int closed_errno_ = 0;

  std::deque<SendOp> sends_;
  std::deque<RecvOp> recvs_;

  // Coded sends' staging: payload bytes [stage_begin_, stage_end_) of the send whose Coded::id
  // is stage_id_, coded and not yet all written.
  std::unique_ptr<char[]> stage_;
  uint64_t stage_id_ = 0;
  size_t stage_begin_ = 0;
  size_t stage_end_ = 0;
  uint64_t next_coded_id_ = 0;

  // Inbox size: large enough that one recv() moves a good slice of a segment, small enough to
  // stay in L2 so the reduction reads the incoming bytes from cache, also when two ranks share a
  // core (their inboxes then share its L2). 128 KiB against 256 KiB, with tcp_link.cc's 1 MiB I/O
  // budget, best of 3 interleaved, N=4 busbw: 64 MiB 0.95 -> 1.14, 256 MiB 1.01 -> 1.27 GB/s;
  // 64 KiB-16 MiB at N=2 and N=4 within noise.
  static constexpr size_t kInboxBytes = 128 << 10;
  // Bytes read from the socket but not yet consumed: frame headers, small payloads, and the
  // incoming side of reductions (reduced straight out of here while still in cache).
  std::unique_ptr<char[]> inbox_;
  size_t inbox_begin_ = 0;
  size_t inbox_end_ = 0;
  FrameHeader in_header_;
  bool in_header_ready_ = false;
  bool in_header_checked_ = false;
};

}  // namespace ringreduce::transport::tcp
