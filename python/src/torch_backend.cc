// ringreduce._torch_backend: the torch.distributed backend "ringreduce" (torch 1.13's
// c10d::ProcessGroup API). A thin adapter: it checks and maps tensors to buffers and calls the
// C++ Communicator's async collectives; every algorithm, the rendezvous and the error handling are
// ringreduce's. torch 2.x moves these methods to c10d::Backend with the same signatures, so a 2.x
// adapter is this class with another base.
//
// Works complete asynchronously: ringreduce's progress thread runs the op, and Work::then
// completes the torch Work and its Future (what DDP chains its bucket continuations on). A
// caller that waits drives the op itself if nobody else is (ringreduce's Work::wait).
#include <pybind11/chrono.h>
#include <torch/csrc/utils/pybind.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ringreduce/ringreduce.hpp"

namespace py = pybind11;
namespace rr = ringreduce;

namespace {

// torch's store (the prefix store init_process_group made for this group) as a ringreduce Store:
// the communicator's rendezvous and stall reports go through it.
class TorchStore : public rr::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    s_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    return s_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    try {
      s_->wait(keys, timeout);
    } catch (const std::exception& e) {
      std::string names;
      for (const auto& k : keys) names += (names.empty() ? "" : ", ") + k;
      throw rr::TimeoutError("torch store: waiting for " + names + ": " + e.what());
    }
  }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }

 private:
  c10::intrusive_ptr<c10d::Store> s_;
};

// Set while this thread completes a Work (runs its Future's callbacks). Such a callback may issue
// the next collective (PowerSGD's hook does); it runs in the thread that finished the op, which may
// be ringreduce's progress thread still driving the queue, where a blocking call would wait for
// itself. So collectives issued from there always go async.
thread_local bool t_completing = false;

// A torch Work over a ringreduce Work. `after` runs once the op has succeeded, before the Work
// and Future complete (copying results out of a staging buffer).
class WorkRR : public c10d::Work {
 public:
  WorkRR(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::function<void()> after)
      : Work(rank, type),
        outputs_(std::move(outputs)),
        after_(std::move(after)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  // Starts watching op; `keep` holds tensors (staging buffers) the op uses until it completes.
  static c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkRR> self, rr::Work op,
                                               std::vector<at::Tensor> keep) {
    self->op_ = op;
    self->keep_ = std::move(keep);
    op.then([self](std::exception_ptr e) { self->complete(e); });
    return self;
  }
  // A Work for an op that already ran in the calling thread (error: how it ended).
  static c10::intrusive_ptr<c10d::Work> done(c10::intrusive_ptr<WorkRR> self,
                                             std::exception_ptr error) {
    self->complete(error);
    return self;
  }

  bool wait(std::chrono::milliseconds timeout) override {
    // In a Future callback this thread may be the one that has to run the op: waiting would hang.
    TORCH_CHECK(!t_completing || isCompleted(), "ringreduce: rank ", rank_, ": ",
                c10d::opTypeToString(opType_),
                ": wait() inside a Future callback would wait for itself; chain with then()");
    // Drive the op in this thread if nobody else is (saves waking the progress thread); its
    // error, if any, arrives through complete().
    try {
      if (!op_.valid()) {
      } else if (timeout == kNoTimeout) {
        op_.wait();
      } else {
        op_.wait(timeout);
      }
    } catch (...) {
    }
    std::unique_lock<std::mutex> lk(mutex_);
    if (timeout == kNoTimeout) {
      cv_.wait(lk, [&] { return completed_; });
    } else if (!cv_.wait_for(lk, timeout, [&] { return completed_; })) {
      TORCH_CHECK(false, "ringreduce: rank ", rank_, ": ", c10d::opTypeToString(opType_),
                  ": wait timed out after ", timeout.count(), " ms");
    }
    if (exception_) std::rethrow_exception(exception_);
    return true;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }

 private:
  void complete(std::exception_ptr e) {
    if (!e && after_) {
      try {
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

  rr::Work op_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> after_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

class ProcessGroupRingreduce : public c10d::ProcessGroup {
 public:
  // Allreduces up to this size run in the calling thread (see allreduce).
  static constexpr size_t kInlineBytes = 64 * 1024;

  ProcessGroupRingreduce(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                         std::chrono::milliseconds timeout)
      : ProcessGroup(rank, size) {
    rr::Options o;
    o.rank = rank;
    o.world_size = size;
    o.timeout = timeout;
    o.store = std::make_shared<TorchStore>(store);
    comm_ = std::make_unique<rr::Communicator>(o);
    init();
  }
  ~ProcessGroupRingreduce() override {
    // Destroying the communicator joins its progress thread, which may be completing a Work
    // whose Future has a Python callback (it needs the GIL): never hold the GIL while joining.
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      comm_.reset();
    } else {
      comm_.reset();
    }
  }

  const std::string getBackendName() const override { return "ringreduce"; }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    const char* call = "allreduce";
    at::Tensor& t = single(tensors, call);
    const rr::DataType dt = reduce_dtype(t, call);
    const rr::ReduceOp op = reduce_op(opts.reduceOp, call);
    if (t.nbytes() <= kInlineBytes && !t_completing) {
      // Small: run it here and now. Handing it to the progress thread costs two thread
      // switches, more than the op itself (a 4-byte allreduce on shared memory takes
      // microseconds); what overlap could hide is as small. The Work is complete on return.
      std::exception_ptr error;
      try {
        comm_->allreduce(t.data_ptr(), t.data_ptr(), count(t), dt, op);
      } catch (...) {
        error = std::current_exception();
      }
      return WorkRR::done(c10::make_intrusive<WorkRR>(rank_, c10d::OpType::ALLREDUCE,
                                                      std::vector<at::Tensor>{t}, nullptr),
                          error);
    }
    return launch(c10d::OpType::ALLREDUCE, {t},
                  comm_->allreduce_async(t.data_ptr(), t.data_ptr(), count(t), dt, op));
  }

  // One allreduce over the tensors packed together (what gloo does too): one latency, not n.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const char* call = "allreduce_coalesced";
    check(!tensors.empty(), call, "no tensors");
    for (auto& t : tensors) {
      check_tensor(t, call);
      check(t.scalar_type() == tensors[0].scalar_type(), call, "tensors differ in dtype");
    }
    const rr::DataType dt = reduce_dtype(tensors[0], call);
    at::Tensor flat = pack(tensors);
    auto after = unpack(flat, tensors);
    return launch(c10d::OpType::ALLREDUCE_COALESCED, tensors,
                  comm_->allreduce_async(flat.data_ptr(), flat.data_ptr(), count(flat), dt,
                                         reduce_op(opts.reduceOp, call)),
                  {flat}, after);
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const char* call = "broadcast";
    at::Tensor& t = single(tensors, call);
    check_root(opts.rootRank, call);
    check(opts.rootTensor == 0, call, "rootTensor must be 0 (one tensor per rank)");
    const auto [dt, n] = move_dtype(t);
    return launch(c10d::OpType::BROADCAST, {t},
                  comm_->broadcast_async(t.data_ptr(), n, dt, static_cast<int>(opts.rootRank)));
  }

  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const char* call = "reduce";
    at::Tensor& t = single(tensors, call);
    check_root(opts.rootRank, call);
    const rr::DataType dt = reduce_dtype(t, call);
    const int root = static_cast<int>(opts.rootRank);
    return launch(c10d::OpType::REDUCE, {t},
                  comm_->reduce_async(t.data_ptr(), rank_ == root ? t.data_ptr() : nullptr,
                                      count(t), dt, reduce_op(opts.reduceOp, call), root));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    const char* call = "allgather";
    at::Tensor& in = single(inputs, call);
    check(outputs.size() == 1, call, "expects one output list (one tensor per rank)");
    auto& outs = outputs[0];
    check_list(outs, in, call);
    const auto [dt, n] = move_dtype(in);
    // Staged through one buffer: the outputs are separate tensors, the collective writes one
    // block per rank into one buffer.
    at::Tensor flat = at::empty({static_cast<int64_t>(size_) * in.numel()}, in.options());
    auto after = unpack(flat, outs);
    return launch(c10d::OpType::ALLGATHER, outs,
                  comm_->allgather_async(in.data_ptr(), flat.data_ptr(), n, dt), {flat, in}, after);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    const char* call = "_allgather_base";
    check_tensor(in, call);
    check_tensor(out, call);
    check(out.scalar_type() == in.scalar_type(), call, "output and input differ in dtype");
    check(out.numel() == in.numel() * size_, call,
          "output must hold size x input elements (" + std::to_string(out.numel()) + " vs " +
              std::to_string(in.numel()) + " x " + std::to_string(size_) + ")");
    const auto [dt, n] = move_dtype(in);
    return launch(c10d::OpType::_ALLGATHER_BASE, {out},
                  comm_->allgather_async(in.data_ptr(), out.data_ptr(), n, dt), {in});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const char* call = "reduce_scatter";
    at::Tensor& out = single(outputs, call);
    check(inputs.size() == 1, call, "expects one input list (one tensor per rank)");
    check_list(inputs[0], out, call);
    const rr::DataType dt = reduce_dtype(out, call);
    at::Tensor flat = pack(inputs[0]);
    return launch(c10d::OpType::REDUCE_SCATTER, {out},
                  comm_->reduce_scatter_async(flat.data_ptr(), out.data_ptr(), count(out), dt,
                                              reduce_op(opts.reduceOp, call)),
                  {flat});
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    const char* call = "_reduce_scatter_base";
    check_tensor(in, call);
    check_tensor(out, call);
    check(out.scalar_type() == in.scalar_type(), call, "output and input differ in dtype");
    check(in.numel() == out.numel() * size_, call,
          "input must hold size x output elements (" + std::to_string(in.numel()) + " vs " +
              std::to_string(out.numel()) + " x " + std::to_string(size_) + ")");
    const rr::DataType dt = reduce_dtype(out, call);
    return launch(c10d::OpType::_REDUCE_SCATTER_BASE, {out},
                  comm_->reduce_scatter_async(in.data_ptr(), out.data_ptr(), count(out), dt,
                                              reduce_op(opts.reduceOp, call)),
                  {in});
  }

  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions&) override {
    const char* call = "alltoall_base";
    check_tensor(in, call);
    check_tensor(out, call);
    check(out.scalar_type() == in.scalar_type(), call, "output and input differ in dtype");
    check(out.numel() == in.numel(), call, "output and input differ in size");
    // Blocks are whole rows (dim 0), as torch's other backends require; split sizes count rows
    // of their own tensor, and equal ones are what ringreduce's alltoall does.
    for (const at::Tensor* t : {&in, &out})
      check(t->dim() > 0 && t->size(0) % size_ == 0, call,
            "dim 0 of input and output must divide equally across the " + std::to_string(size_) +
                " ranks");
    for (auto [splits, rows] :
         {std::pair{&out_splits, out.size(0)}, std::pair{&in_splits, in.size(0)}}) {
      check(splits->empty() || splits->size() == static_cast<size_t>(size_), call,
            "split sizes must have one entry per rank");
      for (int64_t s : *splits)
        check(s * size_ == rows, call,
              "uneven split sizes are not supported (ringreduce's alltoall sends equal blocks)");
    }
    const auto [dt, n] = move_dtype(in);
    return launch(c10d::OpType::ALLTOALL_BASE, {out},
                  comm_->alltoall_async(in.data_ptr(), out.data_ptr(), n / size_, dt), {in});
  }

  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    const char* call = "alltoall";
    check(inputs.size() == static_cast<size_t>(size_) && outputs.size() == inputs.size(), call,
          "expects one input and one output tensor per rank");
    check_list(inputs, inputs[0], call);
    check_list(outputs, inputs[0], call);
    at::Tensor flat_in = pack(inputs);
    at::Tensor flat_out = at::empty_like(flat_in);
    const auto [dt, n] = move_dtype(inputs[0]);
    auto after = unpack(flat_out, outputs);
    return launch(c10d::OpType::ALLTOALL, outputs,
                  comm_->alltoall_async(flat_in.data_ptr(), flat_out.data_ptr(), n, dt),
                  {flat_in, flat_out}, after);
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return launch(c10d::OpType::BARRIER, {}, comm_->barrier_async());
  }

 private:
  [[noreturn]] void fail(const char* call, const std::string& what) const {
    throw rr::InvalidArgument("rank " + std::to_string(rank_) + ": " + call + ": " + what);
  }
  void check(bool ok, const char* call, const std::string& what) const {
    if (!ok) fail(call, what);
  }
  void check_tensor(const at::Tensor& t, const char* call) const {
    check(t.device().is_cpu(), call,
          "tensors must be on the CPU (this is " + t.device().str() + ")");
    check(t.is_contiguous(), call, "tensors must be contiguous");
    check(!t.is_sparse(), call, "sparse tensors are not supported");
  }
  at::Tensor& single(std::vector<at::Tensor>& tensors, const char* call) const {
    check(tensors.size() == 1, call,
          "expects one tensor per rank, got " + std::to_string(tensors.size()));
    check_tensor(tensors[0], call);
    return tensors[0];
  }
  // Every tensor of a per-rank list matches `like` in dtype and size.
  void check_list(const std::vector<at::Tensor>& list, const at::Tensor& like,
                  const char* call) const {
    check(list.size() == static_cast<size_t>(size_), call,
          "expects a list of one tensor per rank (" + std::to_string(size_) + "), got " +
              std::to_string(list.size()));
    for (const auto& t : list) {
      check_tensor(t, call);
      check(t.scalar_type() == like.scalar_type() && t.numel() == like.numel(), call,
            "tensors of the list differ in dtype or size");
    }
  }
  void check_root(int64_t root, const char* call) const {
    check(root >= 0 && root < size_, call,
          "root " + std::to_string(root) + " is not a rank (size " + std::to_string(size_) + ")");
  }
  // The tensors of a list one after another in one new buffer (one collective instead of n).
  static at::Tensor pack(const std::vector<at::Tensor>& list) {
    std::vector<at::Tensor> flat;
    for (const auto& t : list) flat.push_back(t.reshape({-1}));
    return at::cat(flat);
  }
  // What copies a packed buffer back out into the list's tensors once the op has succeeded.
  static std::function<void()> unpack(at::Tensor flat, std::vector<at::Tensor> list) {
    return [flat, list]() mutable {
      int64_t off = 0;
      for (auto& t : list) {
        t.view({-1}).copy_(flat.narrow(0, off, t.numel()));
        off += t.numel();
      }
    };
  }
  static size_t count(const at::Tensor& t) { return static_cast<size_t>(t.numel()); }

  static bool dtype_of(at::ScalarType s, rr::DataType* out) {
    switch (s) {
      case at::kHalf:
        *out = rr::DataType::f16;
        return true;
      case at::kBFloat16:
        *out = rr::DataType::bf16;
        return true;
      case at::kFloat:
        *out = rr::DataType::f32;
        return true;
      case at::kDouble:
        *out = rr::DataType::f64;
        return true;
      case at::kChar:
        *out = rr::DataType::i8;
        return true;
      case at::kByte:
        *out = rr::DataType::u8;
        return true;
      case at::kInt:
        *out = rr::DataType::i32;
        return true;
      case at::kLong:
        *out = rr::DataType::i64;
        return true;
      default:
        return false;
    }
  }
  rr::DataType reduce_dtype(const at::Tensor& t, const char* call) const {
    rr::DataType d;
    if (!dtype_of(t.scalar_type(), &d))
      fail(call, std::string("dtype ") + c10::toString(t.scalar_type()) +
                     " cannot be reduced (ringreduce reduces float16, bfloat16, float32, "
                     "float64, int8, uint8, int32, int64)");
    return d;
  }
  // Data movement works for any dtype: unknown ones travel as bytes.
  static std::pair<rr::DataType, size_t> move_dtype(const at::Tensor& t) {
    rr::DataType d;
    if (dtype_of(t.scalar_type(), &d)) return {d, count(t)};
    return {rr::DataType::u8, t.nbytes()};
  }
  rr::ReduceOp reduce_op(const c10d::ReduceOp& op, const char* call) const {
    switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
      case c10d::ReduceOp::SUM:
        return rr::ReduceOp::sum;
      case c10d::ReduceOp::PRODUCT:
        return rr::ReduceOp::prod;
      case c10d::ReduceOp::MIN:
        return rr::ReduceOp::min;
      case c10d::ReduceOp::MAX:
        return rr::ReduceOp::max;
      case c10d::ReduceOp::AVG:
        return rr::ReduceOp::avg;
      default:
        fail(call, "reduce op " + std::to_string(static_cast<int>(op.op_)) +
                       " is not supported (SUM, PRODUCT, MIN, MAX, AVG are)");
    }
  }

  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                        rr::Work op, std::vector<at::Tensor> keep = {},
                                        std::function<void()> after = nullptr) {
    auto w = c10::make_intrusive<WorkRR>(rank_, type, std::move(outputs), std::move(after));
    return WorkRR::launch(std::move(w), std::move(op), std::move(keep));
  }

  std::unique_ptr<rr::Communicator> comm_;
};

}  // namespace

PYBIND11_MODULE(_torch_backend, m) {
  m.doc() = "The torch.distributed backend 'ringreduce' (import ringreduce.torch to register it)";
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout) -> c10::intrusive_ptr<c10d::ProcessGroup> {
        return c10::make_intrusive<ProcessGroupRingreduce>(store, rank, size, timeout);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::call_guard<py::gil_scoped_release>(),
      "Creates the process group (what torch.distributed calls for backend 'ringreduce').");
}
