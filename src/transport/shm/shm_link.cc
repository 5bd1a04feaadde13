#include "transport/shm/shm_link.h"

#include <algorithm>
#include <cstring>

#include "reduce/reduce.h"
#include "reduce/wire.h"
#include "ringreduce/error.h"
#include "transport/shm/shm_kind.h"

namespace ringreduce::transport::shm {

ShmLink::ShmLink(ShmKind* owner, int peer, Fifo in, size_t out_index, bool lane)
    : owner_(owner), peer_(peer), lane_(lane), in_(in), out_index_(out_index) {}

void ShmLink::bind_out() {
  const Mapping& seg = owner_->segment(peer_);
  out_ = fifo_at(seg.get(), out_index_);
  out_header_ = seg.as<SegmentHeader>();
}

const OpTag& ShmLink::tag() const {
  return lane_ ? lane_tag_ : owner_->tag();
}

void ShmLink::peer_failed(const std::string& what) {
  if (has_notice()) std::rethrow_exception(notice());
  throw PeerError("peer rank " + std::to_string(peer_) + " " + what, peer_);
}

std::exception_ptr ShmLink::notice() const {
  const FifoControl* ctl = in_.control();
  if (ctl->abort_state.load(std::memory_order_acquire) == 0) return nullptr;
  const size_t len = std::min<size_t>(ctl->abort_len, kMaxAbortReason);
  const std::string msg =
      "rank " + std::to_string(peer_) + " aborted: " + std::string(ctl->abort_reason, len);
  if (ctl->abort_code == static_cast<int>(ErrorCode::mismatch))
    return std::make_exception_ptr(MismatchError(msg));
  // A peer that timed out waiting for a third rank: this rank's wait ends for the same reason.
  if (ctl->abort_code == static_cast<int>(ErrorCode::timeout))
    return std::make_exception_ptr(TimeoutError(msg));
  // Read from the peer's memory: believed only when it names a rank of the job.
  const int32_t blamed = ctl->abort_blamed;
  return std::make_exception_ptr(
      NoticeError(msg, blamed >= 0 && blamed < owner_->size() ? blamed : peer_));
}

int ShmLink::notice_code() const {
  return in_.control()->abort_code;
}

// ---------------------------------------------------------------------------------------------
// Credits

bool ShmLink::out_has_credit() {
  if (!out_header_) bind_out();
  if (out_head_ - out_tail_ < kSlots) return true;
  out_tail_ = out_.control()->tail.load(std::memory_order_acquire);
  return out_head_ - out_tail_ < kSlots;
}

bool ShmLink::in_has_data() {
  if (in_head_ > in_tail_) return true;
  in_head_ = in_.control()->head.load(std::memory_order_acquire);
  return in_head_ > in_tail_;
}

void ShmLink::commit_out(const OpTag& tag, size_t message_bytes, bool first, size_t n) {
  SlotMeta* m = out_.meta(out_head_);
  m->tag = tag;
  m->message_bytes = message_bytes;
  m->bytes = static_cast<uint32_t>(n);
  m->first = first ? 1 : 0;
  // The slot's payload and meta are written before head moves: the owner reads them after an
  // acquire load of head.
  out_.control()->head.store(++out_head_, std::memory_order_release);
  if (lane_) out_header_->lane_posts.fetch_add(1, std::memory_order_release);
  owner_->ring(peer_);
}

void ShmLink::publish(const OpTag& tag, size_t message_bytes, bool first, const char* src,
                      size_t n) {
  reduce::copy(out_slot(), src, n, /*stream=*/false);
  commit_out(tag, message_bytes, first, n);
}

// ---------------------------------------------------------------------------------------------
// Posting

ShmLink::SendOp* ShmLink::push_send(const char* src, size_t bytes, size_t ready, Completion* c) {
  if (failed_) throw Error("send on a failed link to rank " + std::to_string(peer_));
  if (peer_gone_) peer_failed("is gone (its process exited or its communicator was destroyed)");
  ++c->outstanding;
  sends_.push_back({src, bytes, 0, ready, c, tag(), {}});
  return &sends_.back();
}

void ShmLink::send(const void* src, size_t bytes, Completion* c) {
  push_send(static_cast<const char*>(src), bytes, bytes, c);
  // Eager: a free slot is usually there, and writing now saves a pass of the progress loop.
  if (sends_.size() == 1) progress();
}

void ShmLink::send_coded(const float* src, size_t count, Wire wire, Completion* c) {
  const size_t bytes = reduce::wire_bytes(wire, count);
  SendOp* op = push_send(reinterpret_cast<const char*>(src), bytes, bytes, c);
  op->coded = {nullptr, count, wire};
  if (sends_.size() == 1) progress();
}

void ShmLink::recv_coded(float* dst, const float* local, size_t count, Wire wire, Completion* c) {
  const Coded coded{local, count, wire};
  post_recv(RecvKind::coded, dst, local, reduce::wire_bytes(wire, count), {}, nullptr, true, c,
            &coded);
}

void ShmLink::decode_piece(RecvOp& op, const char* src, size_t n) {
  const reduce::WirePiece p =
      reduce::wire_received_piece(op.coded.wire, op.done, n, op.coded.count, op.bytes);
  // The sender cuts between units; a piece that does not is not ours to decode.
  if (p.count == 0 && n > 0) peer_failed("sent a coded piece that splits a block");
  auto* dst = reinterpret_cast<float*>(op.dst) + p.first;
  reduce::wire_decode(dst, op.coded.local ? op.coded.local + p.first : nullptr, src, p.count,
                      op.coded.wire);
}

void ShmLink::post_recv(RecvKind kind, void* dst, const void* local, size_t bytes,
                        const Reduction& r, Link* next, bool keep, Completion* c,
                        const Coded* coded) {
  if (failed_) throw Error("receive on a failed link to rank " + std::to_string(peer_));
  RecvOp op;
  if (coded) op.coded = *coded;
  op.kind = kind;
  op.dst = static_cast<char*>(dst);
  op.local = static_cast<const char*>(local);
  op.bytes = bytes;
  op.keep = keep;
  op.red = r;
  op.c = c;
  // The forward takes its place in next's queue now: messages leave in posting order.
  if (next != nullptr) {
    // A link of the same kind (and host) takes the forward straight into its slot; another kind
    // gets it from dst, staged there as it arrives.
    op.next = dynamic_cast<ShmLink*>(next);
    if (op.next)
      op.fwd = op.next->push_send(op.dst, bytes, 0, c);
    else
      op.xnext = next, op.xfwd = next->reserve_forward(op.dst, bytes, c);
    // An empty message has nothing to forward: its place in next's queue is all it needs.
    if (bytes == 0) {
      if (op.xnext) op.xnext->forward_ready(op.xfwd, 0);
      op.kind = RecvKind::plain, op.next = nullptr, op.fwd = nullptr, op.xnext = nullptr;
    }
  }
  ++op.c->outstanding;
  recvs_.push_back(op);
  // Eager, except on a lane that has never received: its first message is found when its peer
  // counts a post (the owner's poll), and looking now would touch the FIFO's control page, fresh
  // memory at start-up, for every peer (255 page faults per rank at 256 ranks, for lanes most
  // of which are never used). A lane in use looks at once: a message's payload may already be
  // there behind its header, counted in a pass that has gone by.
  if (recvs_.size() == 1 && (!lane_ || in_tail_ > 0)) progress();
}

void ShmLink::recv(void* dst, size_t bytes, Completion* c) {
  post_recv(RecvKind::plain, dst, nullptr, bytes, {}, nullptr, true, c);
}

void ShmLink::recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                          Completion* c) {
  post_recv(RecvKind::reduce, dst, local, bytes, r, nullptr, true, c);
}

void ShmLink::recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r,
                               Link& next, bool keep, Completion* c) {
  post_recv(RecvKind::reduce_send, dst, local, bytes, r, &next, keep, c);
}

void ShmLink::recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) {
  post_recv(RecvKind::copy_send, dst, nullptr, bytes, {}, &next, true, c);
}

void* ShmLink::reserve_forward(const void* src, size_t bytes, Completion* c) {
  return push_send(static_cast<const char*>(src), bytes, 0, c);
}

void ShmLink::forward_ready(void* handle, size_t ready) {
  auto* f = static_cast<SendOp*>(handle);
  f->ready = ready;
  // Eager, as send(): the bytes usually find a free slot at once.
  if (!sends_.empty() && &sends_.front() == f) progress_sends();
}

// ---------------------------------------------------------------------------------------------
// Progress

void ShmLink::check_gone() {
  // A lane's standing receive needs nothing from a peer that has gone: its owner decides.
  if (!peer_gone_ || idle() || lane_) return;
  // Whatever it published before it went is still readable (we hold the mapping): only fail
  // when that is used up.
  if (!recvs_.empty() && in_has_data()) return;
  peer_failed("is gone (its process exited or its communicator was destroyed)");
}

bool ShmLink::can_forward_now(const SendOp* f) {
  // In order: f is the next message out, nothing of it waits staged, and a slot is free.
  return !sends_.empty() && &sends_.front() == f && f->ready == f->done && out_has_credit();
}

void ShmLink::forwarded(SendOp* f, size_t n) {
  f->done += n;
  f->ready = f->done;
  if (f->done == f->bytes) {
    --f->c->outstanding;
    sends_.pop_front();
  }
}

bool ShmLink::progress_sends() {
  bool any = false;
  while (!sends_.empty() && out_has_credit()) {
    SendOp& op = sends_.front();
    // A forward whose bytes have not arrived yet holds back everything posted after it.
    if (op.ready == op.done && op.bytes > 0) break;
    size_t n;
    if (op.coded.wire != Wire::none) {
      // Coded straight into the slot, as many whole units as it holds.
      const reduce::WirePiece p =
          reduce::wire_next_piece(op.coded.wire, op.done, op.coded.count, kSlotBytes);
      const auto* src = reinterpret_cast<const float*>(op.src) + p.first;
      reduce::wire_encode(out_slot(), src, p.count, op.coded.wire);
      n = reduce::wire_bytes(op.coded.wire, p.count);
      commit_out(op.tag, op.bytes, op.done == 0, n);
    } else {
      n = std::min(kSlotBytes, op.ready - op.done);
      publish(op.tag, op.bytes, op.done == 0, op.src + op.done, n);
    }
    op.done += n;
    any = true;
    if (op.done == op.bytes) {
      --op.c->outstanding;
      sends_.pop_front();
    }
  }
  return any;
}

void ShmLink::stage_cross(RecvOp& op, const char* src, size_t n) {
  char* d = op.dst + op.done;
  if (op.kind == RecvKind::copy_send) {
    reduce::copy(d, src, n, /*stream=*/false);
    return;
  }
  const size_t elem = dtype_size(op.red.dtype);
  reduce::combine(d, op.local + op.done, src, n / elem, op.red.dtype, op.red.op);
  if (op.red.divide_by > 1) reduce::divide(d, d, n / elem, op.red.dtype, op.red.divide_by);
}

bool ShmLink::progress(bool stage) {
  bool any = progress_sends();
  while (!recvs_.empty() && in_has_data()) {
    RecvOp& op = recvs_.front();
    const SlotMeta* m = in_.meta(in_tail_);
    if (!op.started) {
      if (!m->first) peer_failed("sent the middle of a message where one should start");
      if (!(m->tag == tag()))
        throw MismatchError("mismatched call: rank " + std::to_string(peer_) + " issued " +
                            owner_->describe(m->tag));
      // Tags agree, sizes do not: the calls' per-rank counts differ (alltoallv's splits).
      if (m->message_bytes != op.bytes)
        throw MismatchError("mismatched counts: rank " + std::to_string(peer_) + " sent " +
                            std::to_string(m->message_bytes) + " bytes where this rank expected " +
                            std::to_string(op.bytes));
    } else if (m->first) {
      peer_failed("started a new message before finishing the last");
    }
    const size_t n = m->bytes;
    if (n > op.bytes - op.done || n > kSlotBytes) peer_failed("overran its message");
    const char* src = in_.data(in_tail_);
    const size_t elem = dtype_size(op.red.dtype);
    const bool direct = op.next != nullptr && op.next->can_forward_now(op.fwd);
    // A forward that cannot go out now waits in our FIFO, unless asked to stage (see header).
    if (op.next != nullptr && !direct && !stage) break;
    if (op.xnext != nullptr) {
      // Another kind of link sends it on: stage in dst, then tell it how much is there.
      stage_cross(op, src, n);
      in_.control()->tail.store(++in_tail_, std::memory_order_release);
      owner_->ring(peer_);
      op.done += n;
      op.started = true;
      any = true;
      op.xnext->forward_ready(op.xfwd, op.done);
      if (op.done == op.bytes) {
        --op.c->outstanding;
        recvs_.pop_front();
      }
      continue;
    }
    switch (op.kind) {
      case RecvKind::plain:
        reduce::copy(op.dst + op.done, src, n, owner_->stream_output());
        break;
      case RecvKind::reduce: {
        char* d = op.dst + op.done;
        reduce::combine(d, op.local + op.done, src, n / elem, op.red.dtype, op.red.op);
        if (op.red.divide_by > 1) reduce::divide(d, d, n / elem, op.red.dtype, op.red.divide_by);
        break;
      }
      case RecvKind::coded:
        decode_piece(op, src, n);
        break;
      case RecvKind::copy_send:
        reduce::copy(op.dst + op.done, src, n, owner_->stream_output());
        if (direct) {
          op.next->publish(owner_->tag(), op.bytes, op.done == 0, src, n);
          op.next->forwarded(op.fwd, n);
        } else {
          op.fwd->ready += n;
        }
        break;
      case RecvKind::reduce_send: {
        // One pass: the left neighbour's slot and our chunk in, the right neighbour's slot out.
        char* d = direct ? op.next->out_slot() : op.dst + op.done;
        reduce::combine(d, op.local + op.done, src, n / elem, op.red.dtype, op.red.op);
        if (op.red.divide_by > 1) reduce::divide(d, d, n / elem, op.red.dtype, op.red.divide_by);
        if (direct) {
          if (op.keep) reduce::copy(op.dst + op.done, d, n, owner_->stream_output());
          op.next->commit_out(owner_->tag(), op.bytes, op.done == 0, n);
          op.next->forwarded(op.fwd, n);
        } else {
          op.fwd->ready += n;
        }
        break;
      }
    }
    // Done with the slot: hand the credit back.
    in_.control()->tail.store(++in_tail_, std::memory_order_release);
    owner_->ring(peer_);
    op.done += n;
    op.started = true;
    any = true;
    // Read before pop_front() frees op.
    ShmLink* const staged_to = direct ? nullptr : op.next;
    if (op.done == op.bytes) {
      --op.c->outstanding;
      recvs_.pop_front();
    }
    // Staged bytes go out as soon as next has room.
    if (staged_to != nullptr) staged_to->progress_sends();
  }
  if (!any) check_gone();
  return any;
}

// ---------------------------------------------------------------------------------------------
// Failure

void ShmLink::fail(int code, int blamed_rank, const std::string& reason) {
  if (failed_) return;
  failed_ = true;
  sends_.clear();
  recvs_.clear();
  // The notice has its own place beside the FIFO, so unlike a byte stream it never waits for a
  // message boundary or a free slot. A peer this link never sent to is mapped now: it may be
  // waiting for this rank elsewhere (the window), and should learn why it fails.
  if (!out_header_) {
    try {
      bind_out();
    } catch (const std::exception&) {
      owner_->ring(peer_);  // its pidfd, the timeout or the closed flag will tell it instead
      return;
    }
  }
  FifoControl* ctl = out_.control();
  if (ctl->abort_state.load(std::memory_order_relaxed) == 0) {
    const size_t len = std::min(reason.size(), kMaxAbortReason);
    std::memcpy(ctl->abort_reason, reason.data(), len);
    ctl->abort_len = static_cast<uint32_t>(len);
    ctl->abort_code = code;
    ctl->abort_blamed = blamed_rank;
    ctl->abort_state.store(1, std::memory_order_release);
    out_header_->notices.fetch_add(1, std::memory_order_release);
  }
  owner_->ring(peer_);
}

}  // namespace ringreduce::transport::shm
