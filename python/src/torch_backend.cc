// ringreduce._torch_backend: the torch.distributed backend "ringreduce" (its class: torch_group.h).
// Here: sends and receives, sparse all_reduce, the monitored barrier, the coalesced tensor pairs,
// and the module's create().
//
// Works complete asynchronously: ringreduce's progress thread runs the ops, and Work::then
// completes the torch Work and its Future (what DDP chains its bucket continuations on). A caller
// that waits drives the op itself if nobody else is (ringreduce's Work::wait).
#include <pybind11/chrono.h>

#include "torch_group.h"

namespace py = pybind11;

namespace ringreduce::torch_backend {

std::function<void()> RingreduceGroup::unpack_bytes(at::Tensor flat, std::vector<at::Tensor> list) {
  return [flat, list]() mutable {
    int64_t off = 0;
    for (auto& t : list) {
      const int64_t n = static_cast<int64_t>(t.nbytes());
      if (n > 0) t.copy_(flat.narrow(0, off, n).view(t.scalar_type()).view(t.sizes()));
      off += n;
    }
  };
}

c10::intrusive_ptr<c10d::Work> RingreduceGroup::receive(std::vector<at::Tensor>& tensors, int src,
                                                        int tag, c10d::OpType type) {
  const Call c{rank_, type == c10d::OpType::RECV ? "recv" : "recvAnysource"};
  at::Tensor& user = one(tensors, c);
  const Placement where = place({&user}, c);
  const auto on_device = device_scope(where);
  Staging staging;
  at::Tensor t = staging.output(user);
  const Elems e = move_elems(t);
  return launch(type, {user},
                {comm().recv_async(t.data_ptr(), e.count, e.dtype, src, as_tag(tag),
                                   call_options(where, c10d::kUnsetTimeout))},
                staging);
}

c10::intrusive_ptr<c10d::Work> RingreduceGroup::launch_pairs(c10d::OpType type, const Call& c,
                                                             std::vector<at::Tensor> outputs,
                                                             std::vector<at::Tensor> inputs,
                                                             std::chrono::milliseconds timeout,
                                                             bool gather,
                                                             const c10d::ReduceOp* op) {
  check(!outputs.empty() && outputs.size() == inputs.size(), c,
        "expects as many outputs as inputs");
  std::vector<const at::Tensor*> all;
  for (size_t i = 0; i < inputs.size(); ++i) all.insert(all.end(), {&inputs[i], &outputs[i]});
  const Placement where = place(all, c);
  const auto on_device = device_scope(where);
  Staging staging;
  std::vector<rr::Work> ops;
  const auto n = static_cast<size_t>(size());
  for (size_t i = 0; i < inputs.size(); ++i) {
    check(outputs[i].scalar_type() == inputs[i].scalar_type(), c,
          "output and input differ in dtype");
    at::Tensor in = staging.input(inputs[i]);
    at::Tensor out = staging.output(outputs[i]);
    if (gather) {
      const Elems e = move_elems(in);
      check(move_elems(out).count == e.count * n, c,
            "the output must hold size x input elements (" + std::to_string(out.numel()) + " vs " +
                std::to_string(in.numel()) + " x " + std::to_string(n) + ")");
      ops.push_back(comm().allgather_async(in.data_ptr(), out.data_ptr(), e.count, e.dtype,
                                           call_options(where, timeout)));
    } else {
      const Elems e = reduce_elems(out, *op, c);
      const Reduction r = reduction(*op, c);
      check(move_elems(in).count == e.count * n, c,
            "the input must hold size x output elements (" + std::to_string(in.numel()) + " vs " +
                std::to_string(out.numel()) + " x " + std::to_string(n) + ")");
      ops.push_back(comm().reduce_scatter_async(in.data_ptr(), out.data_ptr(), e.count, e.dtype,
                                                r.op,
                                                call_options(where, timeout, r.premul_factor)));
    }
  }
  return launch(type, outputs, std::move(ops), {}, nullptr, staging);
}

// gloo's algorithm: every rank's indices and values gathered (sizes first), then summed into one
// coalesced sparse tensor, which also replaces the input. Run in the calling thread: three
// collectives that depend on each other's results.
c10::intrusive_ptr<c10d::Work> RingreduceGroup::sparse_allreduce(
    at::Tensor& user, const c10d::AllreduceOptions& opts) {
  const Call c{rank_, "allreduce (sparse)"};
  check(user.device().is_cpu(), c, "tensors must be on the CPU");
  check(static_cast<c10d::ReduceOp::RedOpType>(opts.reduceOp) == c10d::ReduceOp::SUM, c,
        "sparse tensors reduce with SUM only");
  std::exception_ptr error;
  at::Tensor result;
  try {
    const at::Tensor t = user.coalesce();
    const at::Tensor idx = t._indices().contiguous();  // sparse_dim x nnz, int64
    const at::Tensor val = t._values().contiguous();   // nnz x dense dims
    const auto n = static_cast<size_t>(size());
    const rr::CallOptions call = call_options(opts.timeout);
    int64_t nnz = idx.size(1);
    std::vector<int64_t> all_nnz(n);
    comm().allgather(&nnz, all_nnz.data(), 1, rr::DataType::i64, call);
    int64_t total_nnz = 0;
    for (int64_t k : all_nnz) total_nnz += k;
    // Indices: each rank's (sparse_dim x nnz) block, transposed so that a rank's entries are
    // contiguous; values: its nnz rows.
    const at::Tensor idx_t = idx.t().contiguous();
    const int64_t sdim = idx.size(0);
    const int64_t row = val.numel() / std::max<int64_t>(1, val.size(0));
    std::vector<size_t> icounts(n), vcounts(n);
    for (size_t r = 0; r < n; ++r) {
      icounts[r] = static_cast<size_t>(all_nnz[r] * sdim);
      vcounts[r] = static_cast<size_t>(all_nnz[r] * row);
    }
    at::Tensor all_idx = at::empty({total_nnz, sdim}, idx.options());
    comm().allgatherv(idx_t.data_ptr(), all_idx.data_ptr(), icounts, rr::DataType::i64, call);
    std::vector<int64_t> vshape = val.sizes().vec();
    vshape[0] = total_nnz;
    at::Tensor all_val = at::empty(vshape, val.options());
    const Elems ve = move_elems(val);
    const size_t per = val.numel() > 0 ? ve.count / static_cast<size_t>(val.numel()) : 1;
    for (auto& v : vcounts) v *= per;
    comm().allgatherv(val.data_ptr(), all_val.data_ptr(), vcounts, ve.dtype, call);
    result = at::sparse_coo_tensor(all_idx.t(), all_val, t.sizes()).coalesce();
    user.copy_(result);
  } catch (...) {
    error = std::current_exception();
  }
  return WorkRR::done(work(c10d::OpType::ALLREDUCE, {result.defined() ? result : user}), error);
}

void RingreduceGroup::monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks) {
  const std::chrono::milliseconds timeout =
      opts.timeout != c10d::kUnsetTimeout && opts.timeout.count() > 0 ? opts.timeout : timeout_;
  rr::CallOptions call;
  call.timeout = timeout;
  call.memory = rr::Memory::host;
  uint8_t token = 1;
  if (rank_ != 0) {
    comm().send(&token, 1, rr::DataType::u8, 0, kMonitoredBarrierTag, call);
    comm().recv(&token, 1, rr::DataType::u8, 0, kMonitoredBarrierTag, call);
    return;
  }
  std::vector<uint8_t> tokens(static_cast<size_t>(size()));
  std::vector<rr::Work> reports;
  for (int q = 1; q < size(); ++q)
    reports.push_back(comm().recv_async(&tokens[static_cast<size_t>(q)], 1, rr::DataType::u8, q,
                                        kMonitoredBarrierTag, call));
  std::vector<int> missing;
  std::string first_error;
  for (int q = 1; q < size(); ++q) {
    try {
      reports[static_cast<size_t>(q - 1)].wait();
    } catch (const std::exception& e) {
      missing.push_back(q);
      if (first_error.empty()) first_error = e.what();
      if (!wait_all_ranks) break;
    }
  }
  if (!missing.empty()) {
    std::string ranks;
    for (int q : missing) ranks += (ranks.empty() ? "" : ", ") + std::to_string(q);
    throw rr::TimeoutError("rank 0: monitoredBarrier: rank" +
                           std::string(missing.size() > 1 ? "s " : " ") + ranks +
                           " failed to pass monitoredBarrier in " +
                           std::to_string(timeout.count()) + " ms (" + first_error + ")");
  }
  for (int q = 1; q < size(); ++q)
    comm().send(&token, 1, rr::DataType::u8, q, kMonitoredBarrierTag, call);
}

}  // namespace ringreduce::torch_backend

PYBIND11_MODULE(_torch_backend, m) {
  using ringreduce::torch_backend::RingreduceGroup;
  m.doc() = "The torch.distributed backend 'ringreduce' (import ringreduce.torch to register it)";
  m.attr("TORCH_MAJOR") = TORCH_VERSION_MAJOR;
  // Ctrl-C in a collective or a Work's wait (interrupt.h).
  ringreduce::python::install_interrupt_hook();
  m.def(
      "create",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout,
         bool reconfigure) -> c10::intrusive_ptr<ringreduce::torch_backend::Base> {
        return c10::make_intrusive<RingreduceGroup>(store, rank, size, timeout, !reconfigure);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("reconfigure") = false, py::call_guard<py::gil_scoped_release>(),
      "Creates the process group (torch 1.13) or backend (torch 2.x) that torch.distributed calls "
      "for 'ringreduce'; reconfigure (torch 2.14's enable_reconfigure): without members until "
      "reconfigure() names them.");
  m.def(
      "agree",
      [](const c10::intrusive_ptr<ringreduce::torch_backend::Base>& backend, bool flag) {
        auto* group = dynamic_cast<RingreduceGroup*>(backend.get());
        if (group == nullptr)
          throw ringreduce::InvalidArgument("agree: not a ringreduce process group or backend");
        // Converted to a tuple by pybind11 after the call, with the GIL held again.
        const ringreduce::Agreement a = group->agree(flag);
        return std::make_pair(a.flag, a.failed);
      },
      py::arg("backend"), py::arg("flag") = true, py::call_guard<py::gil_scoped_release>(),
      "agree(backend, flag): Communicator.agree on the backend's communicator: (the AND of every "
      "survivor's flag, the ranks taken as failed), the same on every survivor.");
  m.def(
      "allreduce_wire",
      [](const c10::intrusive_ptr<ringreduce::torch_backend::Base>& backend, at::Tensor tensor,
         const std::string& wire, bool average) {
        auto* group = dynamic_cast<RingreduceGroup*>(backend.get());
        if (group == nullptr)
          throw ringreduce::InvalidArgument(
              "allreduce_wire: not a ringreduce process group or backend");
        ringreduce::Wire w;
        if (!ringreduce::parse_wire(wire, &w))
          throw ringreduce::InvalidArgument("allreduce_wire: '" + wire +
                                            "' is not a wire format (none, bf16, f16, fp8e4m3, "
                                            "fp8e5m2, auto)");
        c10d::AllreduceOptions opts;
        opts.reduceOp = average ? c10d::ReduceOp::AVG : c10d::ReduceOp::SUM;
        std::vector<at::Tensor> tensors{std::move(tensor)};
        return group->allreduce_coded(tensors, opts, w);
      },
      py::arg("backend"), py::arg("tensor"), py::arg("wire"), py::arg("average") = true,
      py::call_guard<py::gil_scoped_release>(),
      "allreduce_wire(backend, tensor, wire, average=True): the backend's allreduce (average or "
      "sum) of a float32 tensor in place with a narrow wire format; returns its Work.");
  m.def(
      "wire_round",
      [](at::Tensor tensor, const std::string& wire) {
        ringreduce::Wire w;
        if (!ringreduce::parse_wire(wire, &w) || w == ringreduce::Wire::none ||
            w == ringreduce::Wire::automatic)
          throw ringreduce::InvalidArgument("wire_round: '" + wire +
                                            "' is not a format (bf16, f16, fp8e4m3, fp8e5m2)");
        if (tensor.scalar_type() != at::kFloat || !tensor.is_contiguous() || !tensor.is_cpu())
          throw ringreduce::InvalidArgument(
              "wire_round: a contiguous float32 CPU tensor, rounded in place");
        float* p = tensor.data_ptr<float>();
        ringreduce::wire_round(w, p, p, static_cast<size_t>(tensor.numel()));
      },
      py::arg("tensor"), py::arg("wire"), py::call_guard<py::gil_scoped_release>(),
      "wire_round(tensor, wire): in place, what coding a float32 tensor in a wire format and "
      "decoding it gives (scaled formats' blocks counted from its first element).");
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  m.attr("FAULT_TOLERANCE") = true;
#else
  m.attr("FAULT_TOLERANCE") = false;
#endif
}
