#include "torch_work.h"

#include <c10/util/Exception.h>
#include <torch/csrc/Exceptions.h>

#include <optional>

#include "interrupt.h"

namespace ringreduce::torch_backend {

thread_local bool t_completing = false;

namespace {

// What torch.profiler shows for a call, as gloo's "gloo:all_reduce": torch's Work starts an async
// RecordFunction under this name when the profiler is on (a test of a flag when off) and ends it
// in finish(). String literals: the RecordFunction keeps the pointer.
const char* profiling_title(c10d::OpType type) {
  switch (type) {
    case c10d::OpType::BROADCAST:
      return "ringreduce:broadcast";
    case c10d::OpType::ALLREDUCE:
      return "ringreduce:all_reduce";
    case c10d::OpType::ALLREDUCE_COALESCED:
      return "ringreduce:all_reduce_coalesced";
    case c10d::OpType::REDUCE:
      return "ringreduce:reduce";
    case c10d::OpType::ALLGATHER:
      return "ringreduce:all_gather";
    case c10d::OpType::_ALLGATHER_BASE:
      return "ringreduce:_allgather_base";
    case c10d::OpType::ALLGATHER_COALESCED:
      return "ringreduce:all_gather_coalesced";
    case c10d::OpType::GATHER:
      return "ringreduce:gather";
    case c10d::OpType::SCATTER:
      return "ringreduce:scatter";
    case c10d::OpType::REDUCE_SCATTER:
      return "ringreduce:reduce_scatter";
    case c10d::OpType::_REDUCE_SCATTER_BASE:
      return "ringreduce:_reduce_scatter_base";
    case c10d::OpType::ALLTOALL_BASE:
      return "ringreduce:all_to_all_base";
    case c10d::OpType::ALLTOALL:
      return "ringreduce:all_to_all";
    case c10d::OpType::SEND:
      return "ringreduce:send";
    case c10d::OpType::RECV:
      return "ringreduce:recv";
    case c10d::OpType::RECVANYSOURCE:
      return "ringreduce:recv_any_source";
    case c10d::OpType::BARRIER:
      return "ringreduce:barrier";
    default:
      return "ringreduce:op";
  }
}

}  // namespace

WorkRR::WorkRR(int rank, c10d::OpType type, std::vector<at::Tensor> outputs,
               std::function<void()> after, rr::Communicator* comm)
    : Work(rank, type, profiling_title(type), outputs),
      outputs_(std::move(outputs)),
      after_(std::move(after)),
      comm_(comm),
      future_(
          c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {
  if (after_) caller_state_.emplace();
}

c10::intrusive_ptr<c10d::Work> WorkRR::launch(c10::intrusive_ptr<WorkRR> self,
                                              std::vector<rr::Work> ops,
                                              std::vector<at::Tensor> keep) {
  self->ops_ = std::move(ops);
  self->keep_ = std::move(keep);
  self->pending_.store(self->ops_.size());
  if (self->ops_.empty()) {
    self->complete(nullptr);
    return self;
  }
  // Each op's callback holds the Work: it completes even if nobody keeps the handle.
  for (auto& op : self->ops_) op.then([self](std::exception_ptr e) { self->one_done(e); });
  return self;
}

c10::intrusive_ptr<c10d::Work> WorkRR::done(c10::intrusive_ptr<WorkRR> self,
                                            std::exception_ptr error) {
  self->complete(error);
  return self;
}

void WorkRR::one_done(std::exception_ptr e) {
  if (e) {
    std::lock_guard<std::mutex> lk(first_error_mu_);
    if (!first_error_) first_error_ = e;
  }
  if (pending_.fetch_sub(1) != 1) return;
  std::exception_ptr first;
  {
    std::lock_guard<std::mutex> lk(first_error_mu_);
    first = first_error_;
  }
  complete(first);
}

int WorkRR::sourceRank() const {
  for (const auto& op : ops_)
    if (op.source() >= 0) return op.source();
  return -1;
}

bool WorkRR::wait(std::chrono::milliseconds timeout) {
  // In a Future callback this thread may be the one that has to run the op: waiting would hang.
  TORCH_CHECK(!t_completing || isCompleted(), "ringreduce: rank ", rank_, ": ",
              c10d::opTypeToString(opType_),
              ": wait() inside a Future callback would wait for itself; chain with then()");
  // Ctrl-C while this waits (torch releases the GIL for it): the communicator is aborted, its
  // peers learn why, and the wait ends below.
  std::optional<python::Interruptible> interruptible;
  if (comm_ && !isCompleted()) interruptible.emplace(*comm_);
  // Drive the ops in this thread if nobody else is (saves waking the progress thread); their
  // errors, if any, arrive through complete().
  for (auto& op : ops_) {
    try {
      if (timeout == kNoTimeout)
        op.wait();
      else
        op.wait(timeout);
    } catch (...) {
    }
  }
  std::unique_lock<std::mutex> lk(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lk, [&] { return completed_; });
  } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
    TORCH_CHECK(false, "ringreduce: rank ", rank_, ": ", c10d::opTypeToString(opType_),
                ": wait timed out after ", timeout.count(), " ms");
  }
  if (interruptible && interruptible->interrupted()) {
    // Python's handlers run now (KeyboardInterrupt by default) and their exception goes up as
    // torch's python_error, which torch's bindings restore as it is: the caller gets
    // KeyboardInterrupt, not a RuntimeError about an aborted call.
    ::python_error raised;
    bool any = false;
    {
      pybind11::gil_scoped_acquire gil;
      if (PyErr_CheckSignals() != 0) {
        raised.persist();
        any = true;
      }
    }
    if (any) throw std::move(raised);
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

void WorkRR::complete(std::exception_ptr e) {
  if (!e && after_) {
    try {
      const at::ThreadLocalStateGuard as_the_caller(*caller_state_);
      after_();
    } catch (...) {
      e = std::current_exception();
    }
  }
  keep_.clear();
  finish(e);
  const bool outer = t_completing;
  t_completing = true;
  if (e)
    future_->setError(e);
  else
    future_->markCompleted(c10::IValue(outputs_));
  t_completing = outer;
}

}  // namespace ringreduce::torch_backend
