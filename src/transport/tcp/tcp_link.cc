#include "transport/tcp/tcp_link.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "reduce/reduce.h"
#include "reduce/wire.h"
#include "ringreduce/error.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_kind.h"

namespace ringreduce::transport::tcp {
namespace {

// Work budget per readiness event, so that one busy link does not starve the others: a rank that
// reads its left neighbour for long delays the forward to its right one, which idles meanwhile.
// 1 MiB beat 4 MiB (tcp_link.h, beside the inbox), 2 MiB and 512 KiB at N=4 for 64-256 MiB.
constexpr size_t kIoBudget = 1 << 20;
// Payloads at least this big are read straight into the destination when the inbox is empty.
constexpr size_t kDirectReadMin = 16 << 10;
constexpr int kMaxIov = 64;
// A coded send's staging: a piece is coded here when the socket has taken the previous one. 64
// KiB of wire bytes (128-256 KiB of floats read) stays in L2 beside the inbox, and is a few
// sendmsg calls' worth, so the coding of one piece overlaps the wire's draining of the last.
constexpr size_t kStageBytes = 64 << 10;

}  // namespace

TcpLink::TcpLink(TcpKind* owner, int peer, int channel, bool lane)
    : owner_(owner), peer_(peer), channel_(channel), lane_(lane) {}

void TcpLink::attach(core::Fd fd, std::unique_ptr<SecureChannel> secure) {
  fd_ = std::move(fd);
  secure_ = std::move(secure);
  if (failed_) {
    // Aborted while connecting: the peer learns it from the stream's end.
    ::shutdown(fd_.get(), SHUT_WR);
    return;
  }
  if (!sends_.empty()) on_writable();
  owner_->update_interest(*this);
}

const OpTag& TcpLink::tag() const {
  return lane_ ? lane_tag_ : owner_->tag();
}

ssize_t TcpLink::io_send(iovec* iov, int n) {
  if (!secure_) {
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = static_cast<size_t>(n);
    return ::sendmsg(fd_.get(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  }
  return secure_->send(fd_.get(), iov, n);
}

ssize_t TcpLink::io_recv(void* dst, size_t room) {
  if (!secure_) return ::recv(fd_.get(), dst, room, MSG_DONTWAIT);
  try {
    return secure_->recv(fd_.get(), dst, room);
  } catch (const core::aead::FrameError& e) {
    // Someone on the path changed the stream (or the peer is not who it claims): nothing of the
    // record was delivered, and the op fails; the abort that follows still tells the peer.
    throw PeerError("data from rank " + std::to_string(peer_) +
                        " failed its integrity check (RINGREDUCE_ENCRYPT): " + e.what(),
                    peer_);
  } catch (const Error& e) {
    throw PeerError("data from rank " + std::to_string(peer_) + ": " + e.what(), peer_);
  }
}

void TcpLink::peer_failed(const std::string& what, int err) {
  // The peer said why it went away: that is the error, not the symptom.
  if (notice_) std::rethrow_exception(notice_);
  std::string msg = "peer rank " + std::to_string(peer_) + " " + what;
  if (err != 0) msg += std::string(" (") + strerror(err) + ")";
  throw PeerError(msg, peer_);
}

int64_t TcpLink::unanswered_ms() const {
  if (!fd_.valid()) return 0;
  tcp_info ti{};
  socklen_t len = sizeof ti;
  if (getsockopt(fd_.get(), IPPROTO_TCP, TCP_INFO, &ti, &len) != 0) return 0;
  // tcpi_retransmits counts retransmission timeouts in a row without an acknowledgement in
  // between, tcpi_probes unanswered zero-window probes; either says that bytes or probes are
  // waiting for the peer, so that the time since its last acknowledgement is its silence.
  if (ti.tcpi_retransmits == 0 && ti.tcpi_probes == 0) return 0;
  return ti.tcpi_last_ack_recv;
}

uint32_t TcpLink::wanted_events() const {
  if (failed_ || closed_by_peer_) return 0;
  uint32_t ev = 0;
  // Keep reading while the inbox has room: that is how an abort notice from the peer is seen even
  // when no receive is posted. A full inbox with nothing to drain it waits for a post.
  // Encrypted, a record is read only once the inbox has room for all of it: with no receive to
  // drain the inbox, reading waits for one (else the socket would be reported readable, and
  // nothing read, on every pass).
  const bool room_for_record =
      !secure_ || kInboxBytes - (inbox_end_ - inbox_begin_) >= secure_->next_record_bytes();
  if ((inbox_end_ < kInboxBytes || inbox_begin_ > 0 || !recvs_.empty()) &&
      (room_for_record || !recvs_.empty()))
    ev |= EPOLLIN;
  if (!sends_.empty() && sends_.front().written < writable_prefix(sends_.front())) ev |= EPOLLOUT;
  // A record sealed and not yet all on the socket (its frames already count as written).
  if (secure_ && secure_->pending()) ev |= EPOLLOUT;
  return ev;
}

// ---------------------------------------------------------------------------------------------
// Sending

TcpLink::SendOp* TcpLink::enqueue_send(const void* src, size_t bytes, Completion* c, bool ready,
                                       const Coded* coded) {
  SendOp op;
  if (coded) op.coded = *coded;
  op.header.channel = static_cast<uint16_t>(channel_);
  op.header.payload_bytes = bytes;
  op.header.tag = tag();
  op.data = static_cast<const char*>(src);
  op.bytes = bytes;
  op.written = 0;
  op.c = c;
  op.ready = ready ? bytes : 0;
  if (c) ++c->outstanding;
  const bool was_idle = sends_.empty();
  sends_.push_back(op);
  SendOp* placed = &sends_.back();
  // A sender makes the connection (the receiver waits for it): tcp/connector.h.
  if (!fd_.valid()) {
    owner_->want_connection(*this);
    return placed;
  }
  if (!ready) return placed;
  // Eager: an idle socket usually has room, and writing now saves an epoll round trip.
  if (was_idle) on_writable();
  owner_->update_interest(*this);
  return placed;
}

size_t TcpLink::writable_prefix(const SendOp& op) {
  if (op.ready == op.bytes) return sizeof(FrameHeader) + op.bytes;
  // The header only goes with the first ready bytes: until then the stream stays at a frame
  // boundary, where an abort notice can still be sent instead.
  return op.ready > 0 ? sizeof(FrameHeader) + op.ready : 0;
}

void TcpLink::set_ready(SendOp* f, size_t ready) {
  f->ready = ready;
  if (&sends_.front() == f && fd_.valid()) on_writable();
  owner_->update_interest(*this);
}

void* TcpLink::reserve_forward(const void* src, size_t bytes, Completion* c) {
  return enqueue_send(src, bytes, c, /*ready=*/false);
}

void TcpLink::forward_ready(void* handle, size_t ready) {
  set_ready(static_cast<SendOp*>(handle), ready);
}

void TcpLink::send(const void* src, size_t bytes, Completion* c) {
  if (failed_) throw Error("send on a failed link to rank " + std::to_string(peer_));
  // The peer is gone: its data would be dropped by the kernel (the first write to a closed
  // socket still "succeeds"), so fail now rather than report a send-only op as done.
  if (closed_by_peer_) peer_failed("closed the connection", closed_errno_);
  enqueue_send(src, bytes, c);
}

void TcpLink::send_coded(const float* src, size_t count, Wire wire, Completion* c) {
  if (failed_) throw Error("send on a failed link to rank " + std::to_string(peer_));
  if (closed_by_peer_) peer_failed("closed the connection", closed_errno_);
  const Coded coded{src, count, wire, ++next_coded_id_};
  enqueue_send(nullptr, reduce::wire_bytes(wire, count), c, true, &coded);
}

void TcpLink::fill_stage(const SendOp& op, size_t at) {
  if (!stage_) stage_ = std::make_unique_for_overwrite<char[]>(kStageBytes);
  const reduce::WirePiece p =
      reduce::wire_next_piece(op.coded.wire, at, op.coded.count, kStageBytes);
  reduce::wire_encode(stage_.get(), op.coded.src + p.first, p.count, op.coded.wire);
  stage_id_ = op.coded.id;
  stage_begin_ = at;
  stage_end_ = at + reduce::wire_bytes(op.coded.wire, p.count);
}

size_t TcpLink::frame_iovecs(SendOp& op, size_t limit, iovec* iov, int* n, bool* more) {
  const size_t hdr = sizeof(FrameHeader);
  size_t bytes = 0;
  if (op.written < hdr) {
    iov[(*n)++] = {reinterpret_cast<char*>(&op.header) + op.written, hdr - op.written};
    bytes += hdr - op.written;
  }
  const size_t from = std::max(op.written, hdr);
  if (limit > from && op.coded.src != nullptr) {
    const size_t at = from - hdr;
    if (stage_id_ != op.coded.id || at < stage_begin_ || at >= stage_end_) fill_stage(op, at);
    const size_t end = std::min(limit - hdr, stage_end_);
    iov[(*n)++] = {stage_.get() + (at - stage_begin_), end - at};
    bytes += end - at;
    if (more) *more = true;  // stage_ holds one piece: nothing else may join this sendmsg
  } else if (limit > from) {
    iov[(*n)++] = {const_cast<char*>(op.data) + (from - hdr), limit - from};
    bytes += limit - from;
  }
  return bytes;
}

void TcpLink::on_writable() {
  size_t budget = kIoBudget;
  while (!sends_.empty() && sends_.front().written < writable_prefix(sends_.front()) &&
         budget > 0) {
    // Gather as many queued frames as fit in one sendmsg: small messages then cost one syscall
    // for many frames.
    iovec iov[kMaxIov];
    int n = 0;
    size_t total = 0;
    for (auto it = sends_.begin(); it != sends_.end() && n + 2 <= kMaxIov && total < budget; ++it) {
      const size_t limit = writable_prefix(*it);
      if (it->written >= limit) break;
      bool coded = false;
      total += frame_iovecs(*it, limit, iov, &n, &coded);
      if (limit < sizeof(FrameHeader) + it->bytes) break;  // partly ready: nothing after it yet
      if (coded) break;
    }
    ssize_t w = io_send(iov, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) break;
      const int err = errno;
      // A peer that failed told us why before it went away; its notice beats "broken pipe".
      read_pending_notice();
      peer_failed("closed the connection", err);
    }
    size_t left = static_cast<size_t>(w);
    budget -= std::min(budget, left);
    while (left > 0 && !sends_.empty()) {
      SendOp& op = sends_.front();
      size_t frame = sizeof(FrameHeader) + op.bytes;
      size_t take = std::min(left, frame - op.written);
      op.written += take;
      left -= take;
      if (op.written == frame) {
        if (op.c) --op.c->outstanding;
        sends_.pop_front();
      }
    }
    // Zero-length frames (barrier tokens) are only headers; anything else is handled above.
    // Encrypted, a call takes one record: the socket is full only if that record is not all out.
    if (static_cast<size_t>(w) < total && (!secure_ || secure_->pending())) break;
  }
}

// ---------------------------------------------------------------------------------------------
// Receiving

void TcpLink::post_recv(RecvOp op, Link* next) {
  if (failed_) throw Error("receive on a failed link to rank " + std::to_string(peer_));
  // The forward takes its place in next's queue now: frames leave in posting order.
  if (next) {
    op.next = dynamic_cast<TcpLink*>(next);
    if (op.next)
      op.fwd = op.next->enqueue_send(op.dst, op.bytes, op.c, /*ready=*/false);
    else
      op.xnext = next, op.xfwd = next->reserve_forward(op.dst, op.bytes, op.c);
  }
  ++op.c->outstanding;
  recvs_.push_back(op);
  // What already sits in the inbox may complete it without a syscall.
  if (recvs_.size() == 1) drain_inbox();
  if (closed_by_peer_ && !recvs_.empty() && !lane_)
    peer_failed("closed the connection", closed_errno_);
  owner_->update_interest(*this);
}

namespace {

template <class RecvOp, class Kind>
RecvOp make_recv(Kind kind, void* dst, const void* local, size_t bytes, const Reduction& r,
                 Completion* c) {
  RecvOp op;
  op.kind = kind;
  op.dst = static_cast<char*>(dst);
  op.local = static_cast<const char*>(local);
  op.bytes = bytes;
  op.red = r;
  op.c = c;
  return op;
}

}  // namespace

void TcpLink::recv(void* dst, size_t bytes, Completion* c) {
  post_recv(make_recv<RecvOp>(RecvKind::plain, dst, nullptr, bytes, {}, c), nullptr);
}

void TcpLink::recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                          Completion* c) {
  post_recv(make_recv<RecvOp>(RecvKind::reduce, dst, local, bytes, r, c), nullptr);
}

void TcpLink::recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r,
                               Link& next, bool /*keep: dst always holds it*/, Completion* c) {
  post_recv(make_recv<RecvOp>(RecvKind::reduce_send, dst, local, bytes, r, c), &next);
}

void TcpLink::recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) {
  post_recv(make_recv<RecvOp>(RecvKind::copy_send, dst, nullptr, bytes, {}, c), &next);
}

void TcpLink::recv_coded(float* dst, const float* local, size_t count, Wire wire, Completion* c) {
  RecvOp op =
      make_recv<RecvOp>(RecvKind::coded, dst, local, reduce::wire_bytes(wire, count), {}, c);
  op.count = count;
  op.wire = wire;
  post_recv(op, nullptr);
}

size_t TcpLink::decode_from_inbox(RecvOp& op, size_t avail) {
  const reduce::WireLayout& l = reduce::wire_layout(op.wire);
  const size_t want = op.bytes - op.done;
  // Whole units only, unless this is the message's end (its last block may be short).
  const size_t take = avail >= want ? want : avail - avail % l.unit_bytes;
  if (take == 0) return 0;
  const reduce::WirePiece p =
      reduce::wire_received_piece(op.wire, op.done, take, op.count, op.bytes);
  auto* dst = reinterpret_cast<float*>(op.dst) + p.first;
  const auto* local = reinterpret_cast<const float*>(op.local);
  reduce::wire_decode(dst, local ? local + p.first : nullptr, inbox_.get() + inbox_begin_, p.count,
                      op.wire);
  return take;
}

void TcpLink::finish_recv() {
  RecvOp op = recvs_.front();
  recvs_.pop_front();
  in_header_ready_ = false;
  in_header_checked_ = false;
  // The forward, queued at posting, may go now; the completion waits for it too.
  if (op.next) op.next->set_ready(op.fwd, op.bytes);
  pass_on(op);
  --op.c->outstanding;
  if (lane_) owner_->note_lane_event();
}

void TcpLink::drain_inbox() {
  for (;;) {
    size_t avail = inbox_end_ - inbox_begin_;
    if (!in_header_ready_) {
      if (avail < sizeof(FrameHeader)) return;
      std::memcpy(&in_header_, inbox_.get() + inbox_begin_, sizeof(FrameHeader));
      inbox_begin_ += sizeof(FrameHeader);
      avail -= sizeof(FrameHeader);
      in_header_ready_ = true;
      if (const std::string bad = check_frame_header(in_header_); !bad.empty()) peer_failed(bad);
    }
    if (in_header_.type == kFrameAbort) {
      if (avail < in_header_.payload_bytes) {
        // Make room so the whole notice fits.
        if (inbox_begin_ > 0) {
          std::memmove(inbox_.get(), inbox_.get() + inbox_begin_, avail);
          inbox_begin_ = 0;
          inbox_end_ = avail;
        }
        return;
      }
      const AbortNotice n = parse_abort_notice(inbox_.get() + inbox_begin_,
                                               in_header_.payload_bytes, peer_, owner_->size());
      set_notice(n.code, n.blamed, n.reason);
      // Nothing follows a notice: the link is done. The notice fails whatever needs this link
      // now or later, and the transport's wait fails fast on it unless its op already finished
      // (a notice read in the same recv() as an op's last bytes must not fail that op).
      inbox_begin_ = inbox_end_ = 0;
      in_header_ready_ = false;
      closed_by_peer_ = true;
      owner_->note_notice();
      if (!recvs_.empty() || !sends_.empty()) std::rethrow_exception(notice_);
      return;
    }
    if (recvs_.empty()) return;
    RecvOp& op = recvs_.front();
    if (!in_header_checked_) {
      if (!(in_header_.tag == tag()))
        throw MismatchError("mismatched call: rank " + std::to_string(peer_) + " issued " +
                            owner_->describe(in_header_.tag));
      // Tags agree, sizes do not: the calls' per-rank counts differ (alltoallv's splits).
      if (const std::string bad = check_data_frame(in_header_, op.bytes); !bad.empty())
        throw MismatchError("mismatched counts: rank " + std::to_string(peer_) + " " + bad);
      in_header_checked_ = true;
    }
    size_t want = op.bytes - op.done;
    size_t take = std::min(avail, want);
    if (op.kind == RecvKind::coded) {
      take = decode_from_inbox(op, avail);
    } else if (op.kind == RecvKind::reduce || op.kind == RecvKind::reduce_send) {
      const size_t elem = dtype_size(op.red.dtype);
      take -= take % elem;
      if (take > 0 && (inbox_begin_ % elem) != 0) {
        // Keep the incoming elements aligned for the kernels: shift the unread bytes down.
        std::memmove(inbox_.get(), inbox_.get() + inbox_begin_, avail);
        inbox_begin_ = 0;
        inbox_end_ = avail;
      }
      if (take > 0) {
        const size_t n = take / elem;
        char* d = op.dst + op.done;
        reduce::combine(d, op.local + op.done, inbox_.get() + inbox_begin_, n, op.red.dtype,
                        op.red.op);
        if (op.red.divide_by > 1) reduce::divide(d, d, n, op.red.dtype, op.red.divide_by);
      }
    } else if (take > 0) {
      std::memcpy(op.dst + op.done, inbox_.get() + inbox_begin_, take);
    }
    op.done += take;
    inbox_begin_ += take;
    if (inbox_begin_ == inbox_end_) inbox_begin_ = inbox_end_ = 0;
    if (op.done < op.bytes) {
      pass_on(op);
      return;
    }
    finish_recv();
  }
}

void TcpLink::on_readable() {
  if (!inbox_) inbox_ = std::make_unique_for_overwrite<char[]>(kInboxBytes);
  size_t budget = kIoBudget;
  for (;;) {
    // Whatever was read must be consumed before returning: epoll will not report it again.
    drain_inbox();
    if (budget == 0) return;
    // Large plain payloads go straight from the socket into place: no staging copy.
    if (in_header_ready_ && in_header_checked_ && inbox_begin_ == inbox_end_ && !recvs_.empty()) {
      RecvOp& op = recvs_.front();
      size_t want = op.bytes - op.done;
      // (Not encrypted: a record is opened, checked, then copied; it goes through the inbox.)
      if ((op.kind == RecvKind::plain || op.kind == RecvKind::copy_send) &&
          want >= kDirectReadMin && !secure_) {
        ssize_t r = ::recv(fd_.get(), op.dst + op.done, want, MSG_DONTWAIT);
        if (r > 0) {
          op.done += static_cast<size_t>(r);
          budget -= std::min(budget, static_cast<size_t>(r));
          if (op.done == op.bytes)
            finish_recv();
          else
            pass_on(op);
          continue;
        }
        if (r == 0) return peer_closed(0);
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return;
        return peer_closed(errno);
      }
    }
    if (inbox_end_ == kInboxBytes) {
      if (inbox_begin_ == 0) return;  // full and nothing can drain it until a receive is posted
      size_t avail = inbox_end_ - inbox_begin_;
      std::memmove(inbox_.get(), inbox_.get() + inbox_begin_, avail);
      inbox_begin_ = 0;
      inbox_end_ = avail;
    }
    // At a frame boundary with a large plain receive waiting, read only the header, so that the
    // payload then goes straight into place instead of through the inbox.
    size_t want_bytes = kInboxBytes - inbox_end_;
    if (!secure_ && !in_header_ready_ && !recvs_.empty() &&
        inbox_end_ - inbox_begin_ < sizeof(FrameHeader)) {
      const RecvOp& op = recvs_.front();
      if ((op.kind == RecvKind::plain || op.kind == RecvKind::copy_send) &&
          op.bytes >= kDirectReadMin)
        want_bytes = std::min(want_bytes, sizeof(FrameHeader) - (inbox_end_ - inbox_begin_));
    }
    if (secure_ && want_bytes < secure_->next_record_bytes()) {
      // The next record's plaintext does not fit behind what the inbox holds: make room.
      if (inbox_begin_ == 0) return;  // until a posted receive drains it
      const size_t avail = inbox_end_ - inbox_begin_;
      std::memmove(inbox_.get(), inbox_.get() + inbox_begin_, avail);
      inbox_begin_ = 0;
      inbox_end_ = avail;
      continue;
    }
    ssize_t r = io_recv(inbox_.get() + inbox_end_, want_bytes);
    if (r > 0) {
      inbox_end_ += static_cast<size_t>(r);
      budget -= std::min(budget, static_cast<size_t>(r));
      continue;
    }
    if (r == 0) return peer_closed(0);
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    return peer_closed(errno);
  }
}

}  // namespace ringreduce::transport::tcp
