// Point-to-point ops: sends and receives go to the engine's P2p at once, beside the collectives'
// queue, in a matching space of their own (transport/p2p.h). Whoever drives moves them: a
// collective's wait (every pass of the engine polls them), the thread that waits for one, or the
// progress thread for async ones nobody waits for. A failure of one (a size mismatch, a peer
// gone, a deadline) fails the communicator, as a collective's does.
#include <string_view>

#include "comm/comm_impl.h"
#include "comm/device.h"
#include "comm/errors.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {

std::shared_ptr<OpState> CommImpl::submit_p2p(const P2pArgs& a, const CallOptions& call,
                                              bool async) {
  auto op = std::make_shared<OpState>();
  op->is_p2p = true;
  op->async = async;
  op->comm = this;
  op->timeout = call.timeout.value_or(timeout_.load());
  transport::P2pRequest& r = op->p2p;
  r.is_send = a.send;
  r.peer = a.peer;
  r.tag = a.tag;
  r.buf = a.buf;
  r.on_done = &CommImpl::p2p_done;
  r.owner = op.get();
  auto reject = [&](std::exception_ptr e) {
    op->error = std::move(e);
    op->finished.store(true);
    op->fired = true;  // nobody else has op yet: a later then() runs at once
    if (op->stage) op->stage->release();
    return op;
  };
  auto bad = [&](const std::string& why) {
    return reject(std::make_exception_ptr(InvalidArgument(r.describe(rank_) + ": " + why)));
  };
  if (static_cast<int>(a.dtype) >= kNumDataTypes) return bad("unknown data type");
  const size_t elem = dtype_size(a.dtype);
  if (a.count > SIZE_MAX / elem) return bad("count is too large");
  r.bytes = a.count * elem;
  if (a.send && a.peer == transport::kAnySource) return bad("a send needs a destination rank");
  if ((a.peer < 0 && a.peer != transport::kAnySource) || a.peer >= size_)
    return bad("rank " + std::to_string(a.peer) + " is not a rank of this communicator (0.." +
               std::to_string(size_ - 1) + ")");
  if (a.peer == rank_) return bad("a rank cannot send to or receive from itself");
  if (r.bytes > 0 && a.buf == nullptr) return bad("the buffer is null");
  r.deadline = core::Deadline::after(op->timeout);
  if (timeline_) op->traced_since_us = core::Timeline::now_us();
  algorithms::Args as_args;  // the buffer, as DeviceStage sees a call's
  if (a.send)
    as_args.send = a.buf;
  else
    as_args.recv = a.buf;
  if (r.bytes > 0 && DeviceStage::wanted(as_args, call)) {
    // Device memory: staged on the stream. A receive lands in host memory and the stream copies
    // it out when it completes; a send waits here until the stream has copied its data out, so
    // that the engine may send it as soon as the receiver is ready.
    try {
      op->args = as_args;
      stage_device(*op, call);
      r.buf = a.send ? const_cast<void*>(op->args.send) : op->args.recv;
      if (a.send) op->stage->wait_input(r.deadline);
    } catch (const Error& e) {
      return reject(rebuild(e, r.describe(rank_) + ": " + e.what()));
    } catch (...) {
      return reject(std::make_exception_ptr(
          Error(r.describe(rank_) +
                ": staging its device buffer failed: " + message_of(std::current_exception()))));
    }
  }
  bool inject = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (aborted_.load()) return reject(abort_error_);
    if (stop_) return reject(destroyed_error(r.describe(rank_)));
    p2p_ops_[op.get()] = op;
    if (async) {
      if (p2p_async_++ == 0) p2p_async_since_ = core::Clock::now();
      start_progress_locked();
    }
    // Nobody drives: this thread does, for one pass, so that the message leaves now (an eager
    // one is in the lane when this returns) whoever drives it later; releasing the driver role
    // then wakes the progress thread if the op is still pending.
    if (!driving_) inject = driving_ = true;
  }
  const bool taken = transport_->p2p().submit(&r);
  if (inject) {
    try {
      transport_->poll_all(false);
    } catch (...) {
      fail_communicator(std::current_exception(), [] { return std::string(); });
    }
    std::lock_guard<std::mutex> lk(mu_);
    release_driver();
  }
  if (!taken) {
    // The communicator failed between the check above and here.
    std::lock_guard<std::mutex> lk(mu_);
    if (p2p_ops_.erase(op.get()) > 0 && async) --p2p_async_;
    return reject(abort_error_);
  }
  return op;
}

void CommImpl::drive_p2p(OpState* target) {
  auto done = [&] {
    return (target ? target->finished.load() : !transport_->p2p().busy()) || queued_.load() ||
           stopping_.load();
  };
  try {
    // Each request has its own deadline, which the P2p checks.
    transport_->wait_until(done, core::Deadline::never());
  } catch (...) {
    fail_communicator(std::current_exception(), [] { return std::string(); });
    // fail_communicator() failed every request the P2p held; one it did not hold (none should
    // exist) must not leave its waiter, and this loop, waiting forever.
    std::vector<std::shared_ptr<OpState>> left;
    {
      std::lock_guard<std::mutex> lk(mu_);
      for (auto& [raw, op] : p2p_ops_) {
        op->error = abort_error_;
        op->finished.store(true);
        left.push_back(op);
      }
      p2p_ops_.clear();
      p2p_async_ = 0;
      if (waiters_ > 0) done_cv_.notify_all();
    }
    for (auto& op : left) fire_callback(*op);
  }
}

void CommImpl::p2p_done(transport::P2pRequest* r, std::exception_ptr error) {
  auto* op = static_cast<OpState*>(r->owner);
  CommImpl* self = op->comm;
  if (error) {
    // The communicator's failure, as this op reports it: named after the op itself.
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      const std::string mine = r->describe(self->rank_);
      std::string_view what = e.what();
      if (what.find(mine) == std::string_view::npos) {
        const std::string rank_prefix = "rank " + std::to_string(self->rank_) + ": ";
        if (what.starts_with(rank_prefix)) what.remove_prefix(rank_prefix.size());
        error = rebuild(e, mine + ": " + std::string(what));
      }
    } catch (...) {
    }
  }
  if (self->timeline_ && op->traced_since_us > 0) self->trace_p2p(*op, error != nullptr);
  std::shared_ptr<OpState> keep;  // op lives until its callback has run
  {
    std::lock_guard<std::mutex> lk(self->mu_);
    op->error = error;
    op->finished.store(true);
    if (auto it = self->p2p_ops_.find(op); it != self->p2p_ops_.end()) {
      keep = std::move(it->second);
      self->p2p_ops_.erase(it);
    }
    if (op->async) --self->p2p_async_;
    if (self->waiters_ > 0) self->done_cv_.notify_all();
  }
  fire_callback(*op);
}

}  // namespace ringreduce::detail
