// How a communicator fails (split from comm_impl.cc, which runs ops): an op's error turned into
// the communicator's (fail_communicator: the peers told why, a deeper cause looked for), abort()
// from any thread, and the hooks that hear of it.
#include <sstream>

#include "comm/comm_impl.h"
#include "comm/errors.h"
#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {

std::exception_ptr CommImpl::fail_communicator(std::exception_ptr error,
                                               const std::function<std::string()>& prefix,
                                               bool passed_on) {
  // After a failure the links are in an unknown state: fail the communicator for good, and tell
  // the peers why so that they report this cause rather than a closed connection.
  std::string what;
  int code = static_cast<int>(ErrorCode::internal);
  int blamed = -1;
  try {
    std::rethrow_exception(error);
  } catch (const Error& e) {
    what = e.what();
    code = static_cast<int>(e.code());
    blamed = blamed_rank(e);
  } catch (const std::exception& e) {
    what = prefix() + e.what();
    error = std::make_exception_ptr(Error(what));
  }
  if (code == static_cast<int>(ErrorCode::peer) && !passed_on) {
    // A neighbour that went away may have been failed by a mismatch or an abort elsewhere that it
    // could not pass on; if another peer tells us, that cause is the error. (Not for a peer's
    // notice: its sender looked already. Looking again cost every rank but the dead one's
    // neighbours another 100 ms before it could shrink.)
    if (auto cause = transport_->find_cause(kCauseGrace, blamed)) {
      try {
        std::rethrow_exception(cause);
      } catch (const Error& e) {
        error = with_prefix(e, prefix(), "");
        what = prefix() + e.what();
        code = static_cast<int>(e.code());
        blamed = blamed_rank(e);
      }
    }
  }
  RR_LOG(warn, coll, rank_, what);
  if (timeline_) timeline_->flush();  // the events up to the failure, should the process die
  run_abort_hook(error);
  transport_->abort(code, blamed, what);
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (!abort_error_) abort_error_ = error;
    aborted_.store(true);
  }
  transport_->p2p().fail_all(error);
  return error;
}

void CommImpl::run_abort_hook(std::exception_ptr error) {
  std::function<void(std::exception_ptr)> hook;
  {
    std::lock_guard<std::mutex> lk(mu_);
    hook = std::move(abort_hook_);
    abort_hook_ = nullptr;
  }
  if (!hook) return;
  try {
    hook(error);
  } catch (...) {  // a hook's failure is its own; the abort goes on
  }
}

void CommImpl::on_abort(std::function<void(std::exception_ptr)> fn) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!aborted_.load()) abort_hook_ = std::move(fn);
}

void CommImpl::abort(const std::string& reason) {
  const std::string msg = "rank " + std::to_string(rank_) + ": aborted: " + reason;
  if (!aborted_.load()) run_abort_hook(std::make_exception_ptr(Error(msg, ErrorCode::aborted)));
  std::unique_lock<std::mutex> lk(mu_);
  if (aborted_.load()) return;
  abort_error_ = std::make_exception_ptr(Error(msg, ErrorCode::aborted));
  aborted_.store(true);
  // Queued ops that have not started fail now; the running one is interrupted and fails when
  // its driver notices (the transport wakes it).
  std::shared_ptr<OpState> running = driving_ && !queue_.empty() ? queue_.front() : nullptr;
  std::vector<std::shared_ptr<OpState>> failed;
  for (auto& op : queue_) {
    if (op == running) continue;
    op->error = abort_error_;
    op->finished.store(true);
    failed.push_back(op);
  }
  queue_.clear();
  if (running) queue_.push_back(running);
  queued_.store(!queue_.empty());
  if (driving_) {
    // The driver fails the transport and the point-to-point ops when it notices.
    transport_->interrupt(msg, static_cast<int>(ErrorCode::aborted));
  } else {
    driving_ = true;
    lk.unlock();
    transport_->abort(static_cast<int>(ErrorCode::aborted), -1, msg);
    transport_->p2p().fail_all(abort_error_);
    lk.lock();
    release_driver();
  }
  done_cv_.notify_all();
  lk.unlock();
  for (auto& op : failed) fire_callback(*op);
  if (timeline_) timeline_->flush();  // the events up to the abort, should the process die
}

std::exception_ptr CommImpl::error() {
  if (!aborted_.load()) return nullptr;
  std::lock_guard<std::mutex> lk(mu_);
  return abort_error_;
}

}  // namespace ringreduce::detail
