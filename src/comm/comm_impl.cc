#include "comm/comm_impl.h"
#include "comm/agree.h"
#include "comm/device.h"

#include <sstream>
#include <thread>

#include "comm/errors.h"
#include "core/log.h"
#include "reduce/reduce.h"
#include "rendezvous/tcp_store.h"  // the store server the destructor stops
#include "ringreduce/error.h"

namespace ringreduce::detail {
namespace {

using algorithms::Collective;

}  // namespace

CommImpl::~CommImpl() {
  std::thread progress;
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    stopping_.store(true);
    // A running op is interrupted; the progress thread then leaves without starting another.
    if (driving_)
      transport_->interrupt("communicator destroyed", static_cast<int>(ErrorCode::aborted));
    progress_cv_.notify_all();
    // Taken under mu_, where every other reader of progress_thread_ looks at it; with stop_ set,
    // nobody starts another (start_progress_locked).
    progress = std::move(progress_thread_);
  }
  if (progress.joinable()) progress.join();
  // Ops nobody will run any more fail, so that their Work returns instead of waiting forever.
  std::vector<std::shared_ptr<OpState>> failed;
  std::exception_ptr err;
  std::string msg;
  bool tell_peers = false;
  {
    std::lock_guard<std::mutex> lk(mu_);
    const size_t pending = queue_.size() + p2p_ops_.size();
    if (pending > 0) {
      msg = "rank " + std::to_string(rank_) + ": communicator destroyed with " +
            std::to_string(pending) + " op(s) pending";
      err = std::make_exception_ptr(Error(msg, ErrorCode::aborted));
      for (auto& op : queue_) {
        op->error = err;
        op->finished.store(true);
        failed.push_back(op);
      }
      queue_.clear();
      queued_.store(false);
      // The peers are waiting for those ops: tell them why they will not happen.
      tell_peers = !driving_;
      done_cv_.notify_all();
    }
  }
  if (tell_peers) {
    transport_->abort(static_cast<int>(ErrorCode::aborted), -1, msg);
    transport_->p2p().fail_all(err);
  }
  for (auto& op : failed) fire_callback(*op);
}

void CommImpl::prepare(OpState& op, const algorithms::Args& args, const CallOptions& call,
                       bool async) {
  op.args = args;
  op.async = async;
  op.comm = this;
  op.timeout = call.timeout.value_or(timeout_.load());
  op.premul_factor = call.premul_factor;
  op.wire_requested = call.wire;
  op.args.wire = tuner_->resolve_wire(args, call.wire);
  op.plan = tuner_->choose(op.args);
  auto& t = op.tag;
  t.count = args.count;
  t.kind = static_cast<uint8_t>(args.kind);
  t.dtype = static_cast<uint8_t>(args.dtype);
  const algorithms::CollectiveFacts& f = algorithms::facts(args.kind);
  t.op = f.has_op ? static_cast<uint8_t>(args.op) : 0;
  t.root = f.has_root ? args.root : -1;
  if (!args.counts.empty()) {
    // Every rank passes the same blocks (allgatherv, reduce_scatterv): their digest rides in the
    // tag, so that ranks that disagree fail with a MismatchError on the first message.
    // alltoallv's counts are each rank's own: its tag carries none, and a block of another size
    // is the receiver's MismatchError (the links compare sizes).
    if (args.kind == Collective::alltoallv) {
      t.count = 0;
    } else {
      uint64_t h = 0xcbf29ce484222325ull;
      for (size_t c : args.counts) h = (h ^ c) * 0x100000001b3ull;
      t.reserved2 = h;
    }
  }
  t.algo = op.plan.algorithm->id;
  t.segment_bytes = op.plan.segment_bytes;
  t.channels = static_cast<uint16_t>(op.plan.channels);
  t.flags = op.plan.sliced ? transport::kTagSliced : 0;
  t.wire = static_cast<uint8_t>(op.args.wire);
}

std::optional<CommImpl::CallShape> CommImpl::shape_of(const algorithms::Args& args,
                                                      const CallOptions& call) const {
  if (!args.counts.empty() || !args.recv_counts.empty()) return std::nullopt;
  CallShape s;
  s.kind = args.kind;
  s.count = args.count;
  s.dtype = args.dtype;
  s.op = args.op;
  s.root = args.root;
  s.send_null = args.send == nullptr;
  s.recv_null = args.recv == nullptr;
  s.in_place = args.send == args.recv;
  s.timeout = call.timeout.value_or(timeout_.load());
  s.premul_factor = call.premul_factor;
  s.wire = call.wire;
  s.tuner_generation = tuner_->generation();
  return s;
}

void CommImpl::number(OpState& op) {
  op.tag.seq = next_seq_++;
  try {
    validate(op);
  } catch (...) {
    // A bad argument fails this call only, and the call is not issued: the sequence numbers stay
    // aligned with the other ranks, whose matching call then reports a mismatch naming this rank
    // or times out.
    --next_seq_;
    throw;
  }
}

void CommImpl::call(const algorithms::Args& args, const CallOptions& call) {
  // Asked once per call: in a process that uses CUDA it asks the driver about each buffer.
  const bool device = DeviceStage::wanted(args, call);
  if (device) {
    // Device memory: staged and ordered on the stream like an async call; blocking means recv
    // holds the result on return, so the caller waits for the op and then for the stream.
    auto op = submit(args, call, /*async=*/false, true);
    wait(*op, std::nullopt);
    if (op->stage) op->stage->wait_output();
    return;
  }
  OpState op;
  const std::optional<CallShape> shape = shape_of(args, call);
  {
    std::unique_lock<std::mutex> lk(mu_);
    if (driving_ || !queue_.empty()) {
      // Earlier async ops are queued or running: this one takes its turn after them.
      lk.unlock();
      auto queued = submit(args, call, /*async=*/false, false);
      wait(*queued, std::nullopt);
      return;
    }
    if (shape && memo_ && memo_->shape == *shape) {
      // Checked and planned when last called with this shape.
      op.args = args;
      op.timeout = shape->timeout;
      op.premul_factor = shape->premul_factor;
      op.comm = this;
      op.plan = memo_->plan;
      op.tag = memo_->tag;
      op.args.wire = static_cast<Wire>(op.tag.wire);
      op.tag.seq = next_seq_++;
    } else {
      prepare(op, args, call, /*async=*/false);
      number(op);
      if (shape) memo_ = CallMemo{*shape, op.plan, op.tag};
    }
    if (aborted_.load()) std::rethrow_exception(abort_error_);
    driving_ = true;
  }
  const std::exception_ptr error = execute(op);
  {
    std::lock_guard<std::mutex> lk(mu_);
    release_driver();
  }
  if (error) std::rethrow_exception(error);
}

std::shared_ptr<OpState> CommImpl::submit(const algorithms::Args& args, const CallOptions& call,
                                          bool async, std::optional<bool> device) {
  auto op = std::make_shared<OpState>();
  prepare(*op, args, call, async);
  std::unique_lock<std::mutex> lk(mu_);
  try {
    number(*op);
  } catch (...) {
    op->error = std::current_exception();
    op->finished.store(true);
    op->fired = true;  // nobody else has op yet: a later then() runs at once
    return op;
  }
  if (aborted_.load() || stop_) {
    op->error = stop_ ? destroyed_error(describe(op->tag)) : abort_error_;
    op->finished.store(true);
    op->fired = true;
    return op;
  }
  if (device ? *device : DeviceStage::wanted(args, call)) {
    try {
      stage_device(*op, call);
    } catch (...) {
      --next_seq_;  // not issued, as for a bad argument
      const std::string prefix = "rank " + std::to_string(rank_) + ": " + describe(op->tag) + ": ";
      try {
        throw;
      } catch (const Error& e) {
        op->error = with_prefix(e, prefix, "");
      } catch (...) {
        op->error = std::make_exception_ptr(Error(
            prefix + "staging its device buffers failed: " + message_of(std::current_exception())));
      }
      op->finished.store(true);
      op->fired = true;
      return op;
    }
  }
  queue_.push_back(op);
  queued_.store(true);
  if (async) {
    start_progress_locked();
    if (!driving_) progress_cv_.notify_one();
  }
  // A driver moving only point-to-point ops stops for it (drive_p2p).
  if (driving_) transport_->wake();
  return op;
}

bool CommImpl::wait(OpState& op, std::optional<std::chrono::milliseconds> timeout) {
  const auto until = timeout ? core::Clock::now() + *timeout : core::Clock::time_point::max();
  std::unique_lock<std::mutex> lk(mu_);
  for (;;) {
    if (op.finished.load()) {
      if (op.error) std::rethrow_exception(op.error);
      return true;
    }
    // A bounded wait must not start running an op it cannot stop; it leaves that to the progress
    // thread.
    if (!driving_ && !timeout) {
      driving_ = true;
      lk.unlock();
      drive(&op);
      lk.lock();
      release_driver();
      continue;
    }
    if (!driving_ && timeout) {
      start_progress_locked();
      progress_cv_.notify_one();  // make sure the progress thread looks at the queue
    }
    ++waiters_;
    if (timeout) {
      const bool expired = done_cv_.wait_until(lk, until) == std::cv_status::timeout;
      --waiters_;
      if (expired && !op.finished.load()) return false;
    } else {
      done_cv_.wait(lk);
      --waiters_;
    }
  }
}

void CommImpl::start_progress_locked() {
  if (stop_ || progress_thread_.joinable()) return;
  progress_thread_ = std::thread([this] { progress_loop(); });
}

std::exception_ptr CommImpl::destroyed_error(const std::string& what) const {
  return std::make_exception_ptr(
      Error("rank " + std::to_string(rank_) + ": " + what + ": the communicator is being destroyed",
            ErrorCode::aborted));
}

void CommImpl::release_driver() {
  driving_ = false;
  if (waiters_ > 0) done_cv_.notify_all();
  // The progress thread runs async ops, and moves async point-to-point ops nobody waits for.
  if (progress_thread_.joinable() && (queue_.empty() ? p2p_async_ > 0 : queue_.front()->async))
    progress_cv_.notify_one();
}

void CommImpl::drive(OpState* target) {
  for (;;) {
    std::shared_ptr<OpState> op;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (target && target->finished.load()) return;
      if (stop_) return;
      if (!queue_.empty()) {
        op = queue_.front();
        if (!target && !op->async) return;  // its caller drives it
      } else if (p2p_ops_.empty() || (!target && p2p_async_ == 0)) {
        return;
      }
    }
    // Collectives run in issue order, moving point-to-point ops as they wait; with none queued,
    // the engine moves only those.
    if (op)
      run(*op);
    else
      drive_p2p(target);
  }
}

void CommImpl::run(OpState& op) {
  finish(op, execute(op));
}

std::exception_ptr CommImpl::execute(OpState& op) {
  std::exception_ptr error;
  bool passed_on = false;  // the error is a peer's notice (fail_communicator)
  if (aborted_.load()) {
    std::string what;
    {
      std::lock_guard<std::mutex> lk(mu_);
      error = abort_error_;
    }
    // abort() from another thread only interrupts a driver inside the transport; one that was
    // between ops arrives here, and the transport must still fail and tell the peers.
    try {
      std::rethrow_exception(error);
    } catch (const Error& e) {
      transport_->abort(static_cast<int>(e.code()), blamed_rank(e), e.what());
    }
    transport_->p2p().fail_all(error);
  } else {
    // Built only when needed: a small allreduce must not pay for formatting its description.
    auto prefix = [&] { return "rank " + std::to_string(rank_) + ": " + describe(op.tag) + ": "; };
    if (stall_) stall_->op_started(op.tag);
    const double traced_since = timeline_ ? core::Timeline::now_us() : 0;
    if (timeline_) timeline_->op_begin(op.tag.seq);
    try {
      // Device memory: the stream must have copied the input to host memory first (a call staged
      // in pieces waits piece by piece, below).
      const bool in_pieces = op.stage && op.stage->pieces() > 1;
      if (op.stage && !in_pieces) op.stage->wait_input(core::Deadline::after(op.timeout));
      // premul_sum: the input, multiplied by this rank's factor, into a buffer of the op's own;
      // the algorithm then sums that (out of place whatever the call's placement was). Other ops
      // run on the call's own arguments, not a copy.
      const algorithms::Args* run_args = &op.args;
      algorithms::Args premul_args;
      std::unique_ptr<char[]> premul;
      if (op.args.op == ReduceOp::premul_sum) {
        premul_args = op.args;
        algorithms::Args& args = premul_args;
        const size_t n = algorithms::send_elements(args, rank_, size_);
        premul =
            std::make_unique_for_overwrite<char[]>(std::max<size_t>(1, n * dtype_size(args.dtype)));
        reduce::scale(premul.get(), args.send, n, args.dtype, op.premul_factor);
        args.send = premul.get();
        args.op = ReduceOp::sum;
        run_args = &premul_args;
      }
      // A call on device links (comm/device.cc, runs_on_device) takes its peers' device links;
      // every other op, and whatever follows, the host's.
      struct HostAfter {
        transport::Engine& engine;
        ~HostAfter() { engine.set_memory(transport::MemorySpace::host); }
      } host_after{*transport_};
      transport_->set_memory(op.stage && op.stage->direct() ? transport::MemorySpace::device
                                                            : transport::MemorySpace::host);
      transport_->begin_op(op.tag, op.plan.stream_output);
      algorithms::Context ctx{*transport_,
                              rank_,
                              size_,
                              core::Deadline::after_first_use(op.timeout),
                              op.plan.segment_bytes,
                              op.plan.channels,
                              op.plan.sliced,
                              op.tag.seq,
                              scratch_fn(),
                              ring_.data(),
                              ring_pos_.data(),
                              host_size_,
                              timeline_.get(),
                              op.plan.fallback ? op.plan.fallback->run : nullptr};
      if (core::log_enabled(core::LogLevel::trace, core::LogSubsys::coll)) {
        const auto started = core::Clock::now();
        RR_LOG(trace, coll, rank_, describe(op.tag), ": ", op.plan.algorithm->name,
               ", segments of ", op.plan.segment_bytes, " B, ", op.plan.channels, " channel(s)");
        run_algorithm(op, ctx, *run_args, in_pieces);
        RR_LOG(trace, coll, rank_, describe(op.tag), ": done in ",
               static_cast<int64_t>(core::seconds_since(started) * 1e6), " us");
      } else {
        run_algorithm(op, ctx, *run_args, in_pieces);
      }
    } catch (const Error& e) {
      passed_on = dynamic_cast<const transport::NoticeError*>(&e) != nullptr;
      std::string suffix;
      // A peer's timeout notice already says which deadline ran out.
      if (e.code() == ErrorCode::timeout &&
          std::string_view(e.what()).find(" (timeout ") == std::string_view::npos) {
        std::ostringstream s;
        s << " (timeout " << static_cast<double>(op.timeout.count()) / 1000.0 << " s)";
        suffix = s.str();
      }
      error = with_prefix(e, prefix(), suffix);
      if (stall_) {
        std::ostringstream how;
        if (e.code() == ErrorCode::timeout)
          how << "timed out after " << static_cast<double>(op.timeout.count()) / 1000.0 << " s";
        else
          how << "failed (" << e.what() << ")";
        stall_->op_failed(op.tag, e.code() == ErrorCode::timeout, how.str());
      }
    } catch (const std::exception& e) {
      error = std::make_exception_ptr(Error(prefix() + e.what()));
    }
    if (stall_) stall_->op_ended();
    if (!error) completed_.store(op.tag.seq, std::memory_order_relaxed);
    if (timeline_) trace_op(op, traced_since, error != nullptr);
    if (error) error = fail_communicator(error, prefix, passed_on);
  }
  return error;
}

void CommImpl::run_algorithm(OpState& op, algorithms::Context& ctx, const algorithms::Args& args,
                             bool in_pieces) {
  if (!in_pieces) return op.plan.algorithm->run(ctx, args);
  op.stage->run_pieces(args, core::Deadline::after(op.timeout),
                       [&](const algorithms::Args& piece) { op.plan.algorithm->run(ctx, piece); });
}

void CommImpl::finish(OpState& op, std::exception_ptr error) {
  std::shared_ptr<OpState> keep;  // op lives until its callback has run
  {
    std::lock_guard<std::mutex> lk(mu_);
    op.error = error;
    op.finished.store(true);
    if (!queue_.empty() && queue_.front().get() == &op) {
      keep = std::move(queue_.front());
      queue_.pop_front();
      queued_.store(!queue_.empty());
    }
    if (waiters_ > 0) done_cv_.notify_all();
  }
  // Outside mu_: a callback may issue the next op (a torch future's continuation does).
  fire_callback(op);
}

void fire_callback(OpState& op) {
  std::function<void(std::exception_ptr)> fn;
  {
    std::lock_guard<std::mutex> lk(op.callback_mu);
    if (op.fired) return;
    op.fired = true;
    fn = std::move(op.callback);
  }
  // Every completion comes here once: the stream may go on (copy the result, or what there is
  // of it after a failure, and run the caller's later work).
  if (op.stage) op.stage->release();
  if (fn) fn(op.error);
}

void CommImpl::progress_loop() {
  std::unique_lock<std::mutex> lk(mu_);
  while (!stop_) {
    const bool queued_async = !queue_.empty() && queue_.front()->async;
    const bool p2p_only = queue_.empty() && p2p_async_ > 0;
    if (!driving_ && p2p_only && core::Clock::now() < p2p_async_since_ + kP2pGrace) {
      // Sends and receives were sent on their way when submitted; their caller usually waits
      // for them right away and then drives them itself. Taking them over now would cost a
      // thread hand-off per message (tens of µs here, and ranks' threads outnumber the cores).
      progress_cv_.wait_until(lk, p2p_async_since_ + kP2pGrace);
      continue;
    }
    if (!driving_ && (queued_async || p2p_only)) {
      driving_ = true;
      lk.unlock();
      drive(nullptr);
      lk.lock();
      release_driver();
      continue;
    }
    progress_cv_.wait(lk);
  }
}

void CommImpl::set_timeout(std::chrono::milliseconds timeout) {
  if (timeout.count() <= 0)
    throw InvalidArgument("rank " + std::to_string(rank_) + ": set_timeout: " +
                          std::to_string(timeout.count()) + " ms is not a timeout (> 0)");
  timeout_.store(timeout);
}

void* CommImpl::scratch(size_t bytes) {
  if (bytes > scratch_bytes_) {
    scratch_ = std::make_unique_for_overwrite<char[]>(bytes);
    scratch_bytes_ = bytes;
  }
  return scratch_.get();
}

}  // namespace ringreduce::detail
