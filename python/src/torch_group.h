// The torch.distributed backend's class: one for torch 1.13 (a c10d::ProcessGroup) and torch 2.x
// (a c10d::Backend, registered for CPU tensors so that torch routes every call to it, point to
// point included). The methods are the same; the base class and a few 2.x-only calls are chosen
// by torch's version. A thin adapter: it maps tensors to buffers (torch_tensors.h) and calls the
// C++ Communicator; every algorithm, the rendezvous and the error handling are ringreduce's.
// The collectives are defined here; sends, receives, sparse tensors, the monitored barrier and
// the module in torch_backend.cc.
#pragma once

#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "interrupt.h"
#include "ringreduce/ringreduce.hpp"
#include "torch_tensors.h"
#include "torch_work.h"

namespace ringreduce::torch_backend {

#if TORCH_VERSION_MAJOR >= 2
using Base = c10d::Backend;
#else
using Base = c10d::ProcessGroup;
#endif

// A tag of ringreduce's own for monitoredBarrier (torch's tags are ints: no user tag maps here).
constexpr uint64_t kMonitoredBarrierTag = 0x5252'4d42'0000'0001ull;

class RingreduceGroup : public Base {
 public:
  // Allreduces up to this size run in the calling thread (see allreduce).
  static constexpr size_t kInlineBytes = 64 * 1024;

  // configured false (torch 2.14's init_process_group(enable_reconfigure=True)): no
  // communicator until reconfigure() makes one from the members' handles; every call before
  // fails, saying so.
  RingreduceGroup(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                  std::chrono::milliseconds timeout, bool configured = true)
      : Base(rank, size), timeout_(timeout) {
    if (configured) {
      rr::Options o;
      o.rank = rank;
      o.world_size = size;
      o.timeout = timeout;
      o.store = std::make_shared<TorchStore>(store);
      adopt(std::make_unique<rr::Communicator>(o));
    }
    init();
  }
  // Over a communicator made already (shrink, split, reconfigure).
  RingreduceGroup(std::unique_ptr<rr::Communicator> comm, std::chrono::milliseconds timeout)
      : Base(comm->rank(), comm->size()), timeout_(timeout) {
    adopt(std::move(comm));
    init();
  }
  ~RingreduceGroup() override {
    // Destroying the communicator joins its progress thread, which may be completing a Work
    // whose Future has a Python callback (it needs the GIL): never hold the GIL while joining.
    if (PyGILState_Check()) {
      py::gil_scoped_release nogil;
      comm_.reset();
      retired_.clear();
    } else {
      comm_.reset();
      retired_.clear();
    }
  }

  // Communicator::agree on this group's communicator (ringreduce.torch.agree).
  rr::Agreement agree(bool flag) { return comm().agree(flag); }

#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // torch 2.14's fault-tolerance contract (torch_fault.cc): shrink_group, split, reconfigure,
  // abort, shutdown, get_error, set_timeout and abort hooks.
  bool supportsSplitting() const override {
    return true;
  }
  bool supportsShrinking() const override {
    return true;
  }
  bool supportsReconfigure() const override {
    return true;
  }
  c10::intrusive_ptr<c10d::Backend> split(const c10::intrusive_ptr<c10d::Store>& store,
                                          const std::vector<int>& ranks,
                                          const c10::intrusive_ptr<Options>& opts) override;
  c10::intrusive_ptr<c10d::Backend> shrink(const std::vector<int64_t>& ranks_to_exclude,
                                           int shrink_flags,
                                           const c10::intrusive_ptr<Options>& opts) override;
  c10d::ReconfigureHandle get_reconfigure_handle() const override;
  c10::intrusive_ptr<c10d::Work> reconfigure(const c10d::ReconfigureOptions& opts) override;
  c10::intrusive_ptr<Options> getBackendOptions() override;
  c10d::ErrorType getError() override;
  void abort() override;
  void shutdown() override;
  void setTimeout(std::chrono::milliseconds timeout) override;
#endif
#ifdef C10D_BACKEND_HAS_HOOKS
  void registerAbortHook(int64_t hook_id, c10d::AbortHook hook) override;
  void unregisterAbortHook(int64_t hook_id) override;
#endif

  const std::string getBackendName() const override {
    return "ringreduce";
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    return allreduce_coded(tensors, opts, std::nullopt);
  }
  // allreduce with a wire format (CallOptions::wire): what ringreduce.torch.hooks' wire_hook
  // calls, since torch.distributed's all_reduce has no place for one.
  c10::intrusive_ptr<c10d::Work> allreduce_coded(std::vector<at::Tensor>& tensors,
                                                 const c10d::AllreduceOptions& opts,
                                                 std::optional<rr::Wire> wire) {
    const Call c{rank_, "allreduce"};
    check(tensors.size() == 1, c,
          "expects one tensor per rank, got " + std::to_string(tensors.size()));
    at::Tensor& user = tensors[0];
    if (user.is_sparse()) return sparse_allreduce(user, opts);
    const Placement where = place({&user}, c);
    const auto on_device = device_scope(where);
    const Elems e = reduce_elems(user, opts.reduceOp, c);
    const Reduction r = reduction(opts.reduceOp, c);
    rr::CallOptions call = call_options(where, opts.timeout, r.premul_factor);
    call.wire = wire;
    Staging staging;
    at::Tensor t = staging.inout(user);
    // (Not on a GPU: a blocking call there would wait for torch's stream to reach it.)
    if (t.nbytes() <= kInlineBytes && !t_completing && !where.cuda) {
      // Small: run it here and now. Handing it to the progress thread costs two thread
      // switches, more than the op itself (a 4-byte allreduce on shared memory takes
      // microseconds); what overlap could hide is as small. The Work is complete on return.
      // The Work first: its profiler record (torch.profiler) spans the call.
      auto w = work(c10d::OpType::ALLREDUCE, {user}, staging.after());
      std::exception_ptr error;
      try {
        // Ctrl-C aborts it; Python raises KeyboardInterrupt as soon as it runs again.
        python::Interruptible interruptible(comm());
        comm().allreduce(t.data_ptr(), t.data_ptr(), e.count, e.dtype, r.op, call);
      } catch (...) {
        error = std::current_exception();
      }
      return WorkRR::done(std::move(w), error);
    }
    return launch(
        c10d::OpType::ALLREDUCE, {user},
        {comm().allreduce_async(t.data_ptr(), t.data_ptr(), e.count, e.dtype, r.op, call)},
        staging);
  }

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    check(tensors.size() == 1 && tensors[0].is_sparse(), {rank_, "allreduce_sparse"},
          "expects one sparse tensor");
    return sparse_allreduce(tensors[0], opts);
  }
#endif

  // One allreduce over the tensors packed together (what gloo does too): one latency, not n.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    const Call c{rank_, "allreduce_coalesced"};
    check(!tensors.empty(), c, "no tensors");
    for (auto& t : tensors) {
      check_tensor(t, c);
      check(t.scalar_type() == tensors[0].scalar_type(), c, "tensors differ in dtype");
    }
    at::Tensor flat = pack(tensors);
    const Elems e = reduce_elems(flat, opts.reduceOp, c);
    const Reduction r = reduction(opts.reduceOp, c);
    return launch(c10d::OpType::ALLREDUCE_COALESCED, tensors,
                  {comm().allreduce_async(flat.data_ptr(), flat.data_ptr(), e.count, e.dtype, r.op,
                                          call_options(opts.timeout, r.premul_factor))},
                  {flat}, unpack(flat, tensors));
  }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    const Call c{rank_, "broadcast"};
    at::Tensor& user = one(tensors, c);
    const Placement where = place({&user}, c);
    const auto on_device = device_scope(where);
    check_root(opts.rootRank, c);
    check(opts.rootTensor == 0, c, "rootTensor must be 0 (one tensor per rank)");
    Staging staging;
    at::Tensor t = staging.inout(user);
    const Elems e = move_elems(t);
    return launch(
        c10d::OpType::BROADCAST, {user},
        {comm().broadcast_async(t.data_ptr(), e.count, e.dtype, static_cast<int>(opts.rootRank),
                                call_options(where, opts.timeout))},
        staging);
  }

  // The root gets the reduction; the other ranks' tensors are left as they were (gloo leaves
  // intermediate sums in them).
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    const Call c{rank_, "reduce"};
    at::Tensor& user = one(tensors, c);
    const Placement where = place({&user}, c);
    const auto on_device = device_scope(where);
    check_root(opts.rootRank, c);
    check(opts.rootTensor == 0, c, "rootTensor must be 0 (one tensor per rank)");
    const int root = static_cast<int>(opts.rootRank);
    const Elems e = reduce_elems(user, opts.reduceOp, c);
    const Reduction r = reduction(opts.reduceOp, c);
    Staging staging;
    at::Tensor t = rank_ == root ? staging.inout(user) : staging.input(user);
    return launch(
        c10d::OpType::REDUCE, {user},
        {comm().reduce_async(t.data_ptr(), rank_ == root ? t.data_ptr() : nullptr, e.count, e.dtype,
                             r.op, root, call_options(where, opts.timeout, r.premul_factor))},
        staging);
  }

  // Every rank's tensor into a list per rank; tensors of their own sizes go through allgatherv
  // (gloo refuses them).
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override {
    const Call c{rank_, "allgather"};
    at::Tensor& user_in = single(inputs, c);
    check(outputs.size() == 1, c, "expects one output list (one tensor per rank)");
    auto& outs = outputs[0];
    check_list(outs, size(), user_in, c);
    const std::vector<size_t> counts = counts_of(outs);
    const Elems e = move_elems(user_in);
    check(counts[static_cast<size_t>(rank_)] == e.count, c,
          "this rank's input and its tensor of the output list differ in size");
    Staging staging;
    at::Tensor in = staging.input(user_in);
    at::Tensor flat = at::empty({static_cast<int64_t>(total(counts) * dtype_size(e.dtype))},
                                at::TensorOptions().dtype(at::kByte));
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](size_t n) { return n == counts[0]; });
    const rr::CallOptions call = call_options(opts.timeout);
    rr::Work w =
        even ? comm().allgather_async(in.data_ptr(), flat.data_ptr(), e.count, e.dtype, call)
             : comm().allgatherv_async(in.data_ptr(), flat.data_ptr(), counts, e.dtype, call);
    return launch(c10d::OpType::ALLGATHER, outs, {w}, {flat, in}, unpack_bytes(flat, outs),
                  staging);
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions& opts) override {
    const Call c{rank_, "_allgather_base"};
    return launch_pairs(c10d::OpType::_ALLGATHER_BASE, c, {out}, {in}, opts.timeout, true);
  }

  // Several inputs gathered at once: output_lists[r][j] gets rank r's input j. Packed, one
  // allgather, unpacked (gloo does the same).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& output_lists, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    const Call c{rank_, "allgather_coalesced"};
    check(!inputs.empty(), c, "no inputs");
    check(output_lists.size() == static_cast<size_t>(size()), c,
          "expects one output list per rank (" + std::to_string(size()) + ")");
    for (auto& in : inputs) {
      check_tensor(in, c);
      check(in.scalar_type() == inputs[0].scalar_type(), c, "inputs differ in dtype");
    }
    for (auto& list : output_lists) {
      check_list(list, inputs.size(), inputs[0], c);
      for (size_t j = 0; j < inputs.size(); ++j)
        check(list[j].numel() == inputs[j].numel(), c,
              "output j of every rank must match input j's size");
    }
    at::Tensor flat_in = pack(inputs);
    at::Tensor flat_out = at::empty({flat_in.numel() * size()}, flat_in.options());
    const Elems e = move_elems(flat_in);
    std::vector<at::Tensor> all;
    for (auto& l : output_lists) all.insert(all.end(), l.begin(), l.end());
    // Rank r's block is its inputs one after another: exactly the lists, rank by rank.
    return launch(c10d::OpType::ALLGATHER_COALESCED, all,
                  {comm().allgather_async(flat_in.data_ptr(), flat_out.data_ptr(), e.count, e.dtype,
                                          call_options(opts.timeout))},
                  {flat_in, flat_out}, unpack(flat_out, all));
  }

  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const Call c{rank_, "gather"};
    at::Tensor& user_in = single(inputs, c);
    check_root(opts.rootRank, c);
    const int root = static_cast<int>(opts.rootRank);
    const Elems e = move_elems(user_in);
    Staging staging;
    at::Tensor in = staging.input(user_in);
    if (rank_ != root) {
      check(outputs.empty() || (outputs.size() == 1 && outputs[0].empty()), c,
            "only the root passes output tensors");
      return launch(c10d::OpType::GATHER, {},
                    {comm().gather_async(in.data_ptr(), nullptr, e.count, e.dtype, root,
                                         call_options(opts.timeout))},
                    {in});
    }
    check(outputs.size() == 1, c, "the root expects one output list (one tensor per rank)");
    check_list(outputs[0], size(), user_in, c);
    for (const auto& o : outputs[0])
      check(o.numel() == user_in.numel(), c, "every output must match the input's size");
    at::Tensor flat = at::empty({user_in.numel() * size()}, user_in.options());
    return launch(c10d::OpType::GATHER, outputs[0],
                  {comm().gather_async(in.data_ptr(), flat.data_ptr(), e.count, e.dtype, root,
                                       call_options(opts.timeout))},
                  {flat, in}, unpack(flat, outputs[0]));
  }

  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const Call c{rank_, "scatter"};
    at::Tensor& user_out = single(outputs, c);
    check_root(opts.rootRank, c);
    const int root = static_cast<int>(opts.rootRank);
    const Elems e = move_elems(user_out);
    Staging staging;
    at::Tensor out = staging.output(user_out);
    at::Tensor flat;
    if (rank_ == root) {
      check(inputs.size() == 1, c, "the root expects one input list (one tensor per rank)");
      check_list(inputs[0], size(), user_out, c);
      for (const auto& i : inputs[0])
        check(i.numel() == user_out.numel(), c, "every input must match the output's size");
      flat = pack(inputs[0]);
    } else {
      check(inputs.empty() || (inputs.size() == 1 && inputs[0].empty()), c,
            "only the root passes input tensors");
    }
    return launch(c10d::OpType::SCATTER, {user_out},
                  {comm().scatter_async(flat.defined() ? flat.data_ptr() : nullptr, out.data_ptr(),
                                        e.count, e.dtype, root, call_options(opts.timeout))},
                  staging, flat);
  }

  // The list of every rank's blocks; blocks of their own sizes go through reduce_scatterv.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    const Call c{rank_, "reduce_scatter"};
    at::Tensor& user_out = single(outputs, c);
    check(inputs.size() == 1, c, "expects one input list (one tensor per rank)");
    check_list(inputs[0], size(), user_out, c);
    const std::vector<size_t> counts = counts_of(inputs[0]);
    check(counts[static_cast<size_t>(rank_)] == move_elems(user_out).count, c,
          "the output and this rank's tensor of the input list differ in size");
    at::Tensor flat = pack(inputs[0]);
    const Elems e = reduce_elems(flat, opts.reduceOp, c);
    const Reduction r = reduction(opts.reduceOp, c);
    Staging staging;
    at::Tensor out = staging.output(user_out);
    const bool even =
        std::all_of(counts.begin(), counts.end(), [&](size_t n) { return n == counts[0]; });
    const rr::CallOptions call = call_options(opts.timeout, r.premul_factor);
    // counts_of counts complex tensors in real elements, as reduce_elems does.
    rr::Work w = even ? comm().reduce_scatter_async(flat.data_ptr(), out.data_ptr(),
                                                    e.count / static_cast<size_t>(size()), e.dtype,
                                                    r.op, call)
                      : comm().reduce_scatterv_async(flat.data_ptr(), out.data_ptr(), counts,
                                                     e.dtype, r.op, call);
    return launch(c10d::OpType::REDUCE_SCATTER, {user_out}, {w}, staging, flat);
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    const Call c{rank_, "_reduce_scatter_base"};
    return launch_pairs(c10d::OpType::_REDUCE_SCATTER_BASE, c, {out}, {in}, opts.timeout, false,
                        &opts.reduceOp);
  }

#if TORCH_VERSION_MAJOR >= 2
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts) override {
    const Call c{rank_, "allgather_into_tensor_coalesced"};
    return launch_pairs(c10d::OpType::COALESCED, c, outputs, inputs, opts.timeout, true);
  }
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    const Call c{rank_, "reduce_scatter_tensor_coalesced"};
    return launch_pairs(c10d::OpType::COALESCED, c, outputs, inputs, opts.timeout, false,
                        &opts.reduceOp);
  }
#endif

  // Rows of dim 0 split among the ranks: equally, or by the split sizes (alltoallv).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& user_out, at::Tensor& user_in,
                                               std::vector<int64_t>& out_splits,
                                               std::vector<int64_t>& in_splits,
                                               const c10d::AllToAllOptions& opts) override {
    const Call c{rank_, "alltoall_base"};
    const Placement where = place({&user_in, &user_out}, c);
    const auto on_device = device_scope(where);
    check(user_out.scalar_type() == user_in.scalar_type(), c, "output and input differ in dtype");
    auto blocks = [&](const at::Tensor& t, const std::vector<int64_t>& splits) {
      check(t.dim() > 0 || splits.empty(), c, "a tensor with no dim 0 cannot be split");
      const int64_t rows = t.dim() > 0 ? t.size(0) : 0;
      const size_t row = rows > 0 ? move_elems(t).count / static_cast<size_t>(rows) : 0;
      std::vector<size_t> counts;
      if (splits.empty()) {
        check(rows % size() == 0, c,
              "dim 0 (" + std::to_string(rows) + ") does not divide equally across the " +
                  std::to_string(size()) + " ranks; pass split sizes");
        counts.assign(static_cast<size_t>(size()), static_cast<size_t>(rows / size()) * row);
      } else {
        check(splits.size() == static_cast<size_t>(size()), c,
              "split sizes must have one entry per rank");
        int64_t sum = 0;
        for (int64_t s : splits) {
          check(s >= 0, c, "split sizes must not be negative");
          sum += s;
          counts.push_back(static_cast<size_t>(s) * row);
        }
        check(
            sum == rows, c,
            "split sizes add up to " + std::to_string(sum) + " rows, not " + std::to_string(rows));
      }
      return counts;
    };
    const std::vector<size_t> sc = blocks(user_in, in_splits), rc = blocks(user_out, out_splits);
    Staging staging;
    at::Tensor in = staging.input(user_in), out = staging.output(user_out);
    const Elems e = move_elems(in);
    return launch(c10d::OpType::ALLTOALL_BASE, {user_out},
                  {comm().alltoallv_async(in.data_ptr(), sc, out.data_ptr(), rc, e.dtype,
                                          call_options(where, opts.timeout))},
                  staging);
  }

  // A tensor per rank each way, of any sizes (gloo supports none of this).
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override {
    const Call c{rank_, "alltoall"};
    check(!inputs.empty(), c, "expects one input and one output tensor per rank");
    check_list(inputs, size(), inputs[0], c);
    check_list(outputs, size(), inputs[0], c);
    // Moved as bytes: blocks of any sizes, one dtype.
    std::vector<size_t> sc, rc;
    for (const auto& t : inputs) sc.push_back(static_cast<size_t>(t.nbytes()));
    for (const auto& t : outputs) rc.push_back(static_cast<size_t>(t.nbytes()));
    at::Tensor flat_in = pack(inputs).view(at::kByte);
    at::Tensor flat_out =
        at::empty({static_cast<int64_t>(total(rc))}, at::TensorOptions().dtype(at::kByte));
    return launch(c10d::OpType::ALLTOALL, outputs,
                  {comm().alltoallv_async(flat_in.data_ptr(), sc, flat_out.data_ptr(), rc,
                                          rr::DataType::u8, call_options(opts.timeout))},
                  {flat_in, flat_out}, unpack_bytes(flat_out, outputs));
  }

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override {
    return launch(c10d::OpType::BARRIER, {}, {comm().barrier_async(call_options(opts.timeout))});
  }

  // gloo's monitored barrier: every rank reports to rank 0 within the timeout, and rank 0 names
  // the ranks that did not (all of them with wait_all_ranks, else the first); then it releases
  // the others. Over ringreduce's sends and receives, on a tag of its own.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) override;

  // Sequence numbers agree by construction: every rank counts the collectives it issued.
  void setSequenceNumberForGroup() override {}
  uint64_t getSequenceNumberForGroup() override {
    return comm().sequence_number();
  }

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override {
    const Call c{rank_, "send"};
    at::Tensor& user = one(tensors, c);
    const Placement where = place({&user}, c);
    const auto on_device = device_scope(where);
    Staging staging;
    at::Tensor t = staging.input(user);
    const Elems e = move_elems(t);
    return launch(c10d::OpType::SEND, {user},
                  {comm().send_async(t.data_ptr(), e.count, e.dtype, dst, as_tag(tag),
                                     call_options(where, c10d::kUnsetTimeout))},
                  staging);
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override {
    return receive(tensors, src, tag, c10d::OpType::RECV);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return receive(tensors, rr::Communicator::kAnySource, tag, c10d::OpType::RECVANYSOURCE);
  }

 private:
  int size() const {
    return size_;
  }
  static size_t total(const std::vector<size_t>& v) {
    size_t t = 0;
    for (size_t x : v) t += x;
    return t;
  }
  // torch's int tags, in ringreduce's unsigned tag space.
  static uint64_t as_tag(int tag) {
    return static_cast<uint64_t>(static_cast<int64_t>(tag));
  }
  // The one tensor of a call that takes one per rank; single() also wants it on the CPU (one()
  // leaves that to place()).
  at::Tensor& one(std::vector<at::Tensor>& tensors, const Call& c) const {
    check(tensors.size() == 1, c,
          "expects one tensor per rank, got " + std::to_string(tensors.size()));
    return tensors[0];
  }
  at::Tensor& single(std::vector<at::Tensor>& tensors, const Call& c) const {
    at::Tensor& t = one(tensors, c);
    check_tensor(t, c);
    return t;
  }
  void check_root(int64_t root, const Call& c) const {
    check(root >= 0 && root < size(), c,
          "root " + std::to_string(root) + " is not a rank (size " + std::to_string(size()) + ")");
  }

  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int src, int tag,
                                         c10d::OpType type);
  c10::intrusive_ptr<c10d::Work> sparse_allreduce(at::Tensor& t,
                                                  const c10d::AllreduceOptions& opts);
  // _allgather_base / _reduce_scatter_base and their coalesced forms: pairs of (output, input)
  // tensors, each one collective, done together.
  c10::intrusive_ptr<c10d::Work> launch_pairs(c10d::OpType type, const Call& c,
                                              std::vector<at::Tensor> outputs,
                                              std::vector<at::Tensor> inputs,
                                              std::chrono::milliseconds timeout, bool gather,
                                              const c10d::ReduceOp* op = nullptr);
  // Copies a byte buffer of blocks back out into tensors of any dtype, one after another.
  static std::function<void()> unpack_bytes(at::Tensor flat, std::vector<at::Tensor> list);

  c10::intrusive_ptr<WorkRR> work(c10d::OpType type, std::vector<at::Tensor> outputs,
                                  std::function<void()> after = nullptr) {
    return c10::make_intrusive<WorkRR>(rank_, type, std::move(outputs), std::move(after), &comm());
  }
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                        std::vector<rr::Work> ops,
                                        std::vector<at::Tensor> keep = {},
                                        std::function<void()> after = nullptr,
                                        const Staging& staging = Staging()) {
    for (auto& k : staging.keep()) keep.push_back(k);
    return WorkRR::launch(work(type, std::move(outputs), staging.after(std::move(after))),
                          std::move(ops), std::move(keep));
  }
  c10::intrusive_ptr<c10d::Work> launch(c10d::OpType type, std::vector<at::Tensor> outputs,
                                        std::vector<rr::Work> ops, const Staging& staging,
                                        at::Tensor extra = at::Tensor()) {
    std::vector<at::Tensor> keep;
    if (extra.defined()) keep.push_back(extra);
    return launch(type, std::move(outputs), std::move(ops), std::move(keep), nullptr, staging);
  }

  // The communicator, or an error saying why there is none yet (enable_reconfigure).
  rr::Communicator& comm() const {
    if (!comm_ && shut_down_)
      throw rr::InvalidArgument("rank " + std::to_string(rank_) +
                                ": this process group was shut down (destroy_process_group)");
    if (!comm_)
      throw rr::InvalidArgument(
          "rank " + std::to_string(rank_) +
          ": this process group was made with enable_reconfigure=True and has no members yet: "
          "call torch.distributed._reconfigure with every member's handle first");
    return *comm_;
  }
  // Makes comm the one calls go to (its abort runs the abort hooks); the one it replaces stays,
  // aborted, until this group ends: unfinished Works point at it.
  void adopt(std::unique_ptr<rr::Communicator> comm);
  void run_abort_hooks();

  std::chrono::milliseconds timeout_;
  std::unique_ptr<rr::Communicator> comm_;
  std::vector<std::unique_ptr<rr::Communicator>> retired_;
  bool shut_down_ = false;
  // reconfigure's: this rank's endpoint, made by get_reconfigure_handle() and used by the next
  // reconfigure(), and the uuids used so far (a reused one is refused, as torch asks).
  mutable std::unique_ptr<rr::Endpoint> endpoint_;
  std::vector<int64_t> uuids_;
  std::mutex hooks_mu_;
  std::map<int64_t, std::function<void()>> hooks_;
};

}  // namespace ringreduce::torch_backend
