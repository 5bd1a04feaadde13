// A TcpLink's notices and failures (split from tcp_link.cc, which moves the data): reading a
// peer's abort notice, salvaging one from a failing stream, a peer closing, and this link failing
// with a notice for its peer.
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cstring>

#include "ringreduce/error.h"
#include "transport/tcp/frame.h"
#include "transport/tcp/tcp_kind.h"
#include "transport/tcp/tcp_link.h"

namespace ringreduce::transport::tcp {

void TcpLink::read_pending_notice() {
  if (!inbox_) inbox_ = std::make_unique_for_overwrite<char[]>(kInboxBytes);
  for (int i = 0; i < 64 && inbox_end_ < kInboxBytes; ++i) {
    ssize_t r = 0;
    try {
      r = io_recv(inbox_.get() + inbox_end_, kInboxBytes - inbox_end_);
    } catch (const Error&) {
      break;  // a stream that fails its check holds no notice we could believe
    }
    if (r <= 0) break;
    inbox_end_ += static_cast<size_t>(r);
  }
  drain_inbox();  // finds the notice if it is at the head of what arrived
}

void TcpLink::set_notice(int32_t code, int32_t blamed, const std::string& reason) {
  std::string msg = "rank " + std::to_string(peer_) + " aborted: " + reason;
  notice_code_ = code;
  // A PeerError names the rank at fault (a dead one, say), not the rank that passed the news on.
  // A peer that timed out waiting for a third rank ends this rank's wait for the same reason.
  notice_ = code == static_cast<int>(ErrorCode::mismatch)
                ? std::make_exception_ptr(MismatchError(msg))
            : code == static_cast<int>(ErrorCode::timeout)
                ? std::make_exception_ptr(TimeoutError(msg))
                : std::make_exception_ptr(NoticeError(msg, blamed >= 0 ? blamed : peer_));
}

bool TcpLink::salvage_notice() {
  if (notice_ || salvage_done_ || !fd_.valid()) return true;
  if (!inbox_) inbox_ = std::make_unique_for_overwrite<char[]>(kInboxBytes);
  if (!salvaging_) {
    salvaging_ = true;
    // The rest of a data frame in progress is skipped; a posted receive already took its first
    // `done` bytes, and the inbox holds what follows them.
    if (in_header_ready_ && in_header_.type == kFrameData) {
      const size_t taken = in_header_checked_ && !recvs_.empty() ? recvs_.front().done : 0;
      salvage_skip_ = in_header_.payload_bytes - std::min<size_t>(taken, in_header_.payload_bytes);
      in_header_ready_ = false;
    }
  }
  // Bounded: a peer that keeps streaming data is left for the caller's next pass.
  for (int round = 0; round < 256; ++round) {
    for (;;) {
      size_t avail = inbox_end_ - inbox_begin_;
      const size_t skip = std::min(avail, salvage_skip_);
      inbox_begin_ += skip;
      salvage_skip_ -= skip;
      avail -= skip;
      if (salvage_skip_ > 0) break;
      if (!in_header_ready_) {
        if (avail < sizeof(FrameHeader)) break;
        std::memcpy(&in_header_, inbox_.get() + inbox_begin_, sizeof(FrameHeader));
        inbox_begin_ += sizeof(FrameHeader);
        avail -= sizeof(FrameHeader);
        if (!check_frame_header(in_header_).empty()) {
          salvage_done_ = true;  // unreadable from here on
          return true;
        }
        if (in_header_.type == kFrameData) {
          salvage_skip_ = in_header_.payload_bytes;
          continue;
        }
        in_header_ready_ = true;
      }
      if (avail < in_header_.payload_bytes) break;
      const AbortNotice n = parse_abort_notice(inbox_.get() + inbox_begin_,
                                               in_header_.payload_bytes, peer_, owner_->size());
      set_notice(n.code, n.blamed, n.reason);
      return true;
    }
    // Need more bytes: keep what is unread at the front and fill the rest.
    const size_t avail = inbox_end_ - inbox_begin_;
    if (inbox_begin_ > 0) std::memmove(inbox_.get(), inbox_.get() + inbox_begin_, avail);
    inbox_begin_ = 0;
    inbox_end_ = avail;
    ssize_t r = 0;
    try {
      r = io_recv(inbox_.get() + inbox_end_, kInboxBytes - inbox_end_);
    } catch (const Error&) {
      salvage_done_ = true;  // unreadable from here on
      return true;
    }
    if (r > 0) {
      inbox_end_ += static_cast<size_t>(r);
      continue;
    }
    if (r < 0 && errno == EINTR) continue;
    if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return false;
    salvage_done_ = true;  // end of stream or reset
    return true;
  }
  return false;
}

void TcpLink::peer_closed(int err) {
  // A peer that finished its last op and exited closes its sockets: that is only an error for a
  // receive that still needs bytes (now or when posted later), not for a link that sits idle.
  closed_by_peer_ = true;
  closed_errno_ = err;
  drain_inbox();
  // A lane's standing receive needs nothing from a peer that has gone: its owner decides.
  if (!lane_ && (!recvs_.empty() || !sends_.empty())) peer_failed("closed the connection", err);
}

// ---------------------------------------------------------------------------------------------
// Failure

// A frame half written when this rank fails would leave no place for the abort notice, and the
// peer, seeing the stream end, would blame this rank rather than the cause (seen under load:
// a reduce whose rank 3 aborted mid-frame to rank 0 after rank 2 died). So its rest is written
// now, if all of it is there (a forward still receiving is not) and the socket takes it at once:
// the genuine bytes of a live op (the op is failing, not done, so its buffers are still held),
// at most a few non-blocking writes.
void TcpLink::finish_frame_for_notice() {
  SendOp& op = sends_.front();
  const size_t frame = sizeof(FrameHeader) + op.bytes;
  if (writable_prefix(op) != frame) return;
  for (int attempt = 0; attempt < 8 && op.written < frame; ++attempt) {
    iovec iov[2];
    int n = 0;
    frame_iovecs(op, frame, iov, &n);
    const ssize_t w = io_send(iov, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    op.written += static_cast<size_t>(w);
  }
  if (op.written == frame) sends_.pop_front();
}

void TcpLink::fail(int code, int blamed_rank, const std::string& reason) {
  if (failed_) return;
  // Forget every primitive: their buffers and completions belong to an op that is unwinding.
  recvs_.clear();
  if (!fd_.valid()) {
    // Never connected: nothing to tell the peer on this link (it learns through the others).
    sends_.clear();
    failed_ = true;
    return;
  }
  if (secure_ && secure_->pending()) {
    // A record the socket took only part of: its rest first (a few tries, never blocking), and
    // its bytes then count as written, so that the frame it ends in is finished below or known
    // to be cut; a record cut short would leave no place for the notice.
    for (int attempt = 0; attempt < 8 && secure_->pending(); ++attempt)
      if (secure_->flush(fd_.get()) < 0) break;
    if (!secure_->pending()) {
      size_t w = secure_->take_flushed();
      for (auto it = sends_.begin(); w > 0 && it != sends_.end(); ++it) {
        const size_t take = std::min(w, sizeof(FrameHeader) + it->bytes - it->written);
        it->written += take;
        w -= take;
      }
      while (!sends_.empty() &&
             sends_.front().written == sizeof(FrameHeader) + sends_.front().bytes)
        sends_.pop_front();
    }
  }
  if (!sends_.empty() && sends_.front().written > 0) finish_frame_for_notice();
  const bool mid_frame =
      (secure_ && secure_->pending()) || (!sends_.empty() && sends_.front().written > 0);
  if (mid_frame) {
    // A partial frame cannot be followed by a notice; the peer will see the stream end instead
    // (and blame this rank, not the cause).
    sends_.clear();
  } else {
    sends_.clear();
    static thread_local std::string payload;
    // Payload: int32 code, int32 blamed rank, reason.
    std::string text = reason.substr(0, kMaxAbortPayload - 8);
    payload.assign(8 + text.size(), '\0');
    int32_t c = code, b = blamed_rank;
    std::memcpy(payload.data(), &c, 4);
    std::memcpy(payload.data() + 4, &b, 4);
    std::memcpy(payload.data() + 8, text.data(), text.size());
    FrameHeader h;
    h.type = kFrameAbort;
    h.channel = static_cast<uint16_t>(channel_);
    h.payload_bytes = payload.size();
    h.tag = owner_->tag();
    iovec iov[2] = {{&h, sizeof h}, {payload.data(), payload.size()}};
    // One attempt, never blocking: a peer that does not read will see the shutdown instead.
    // (Encrypted, the notice is a record of its own, behind the rest of one sealed earlier.)
    if (secure_ && secure_->pending()) secure_->flush(fd_.get());
    ssize_t ignored = io_send(iov, 2);
    (void)ignored;
  }
  ::shutdown(fd_.get(), SHUT_WR);
  failed_ = true;
}

}  // namespace ringreduce::transport::tcp
