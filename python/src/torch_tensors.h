// Tensors as ringreduce buffers, for the torch backend (torch_backend.cc): which dtype and count a
// tensor is to the library, which ReduceOp a c10d op is, and staging: contiguous copies for views
// that are not (copied back once the op has succeeded), and one buffer for a list of tensors.
// Every refusal is an InvalidArgument naming the rank and the call.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <torch/csrc/distributed/c10d/Types.hpp>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "ringreduce/ringreduce.hpp"

namespace ringreduce::torch_backend {

namespace rr = ringreduce;

// Who is calling what, for error messages: "rank 3: allgather: ...".
struct Call {
  int rank;
  const char* name;
};
[[noreturn]] void fail(const Call& c, const std::string& what);
inline void check(bool ok, const Call& c, const std::string& what) {
  if (!ok) fail(c, what);
}
// A dense CPU tensor (any layout of strides: staging makes it contiguous). What the list forms
// (allgather into a list, gather, scatter, alltoall of lists, allreduce_coalesced) take, whose
// packing and unpacking would run off torch's stream on a GPU.
void check_tensor(const at::Tensor& t, const Call& c);

// Where a call's tensors live, all of them alike: the CPU, or one CUDA device, in which case the
// call is ordered on the stream torch orders work on there (its current stream when the call is
// made), as NCCL's calls are: the library stages the tensors through host memory on that stream
// (docs/GPU.md) and the call returns at once.
struct Placement {
  bool cuda = false;
  c10::Device device{c10::kCPU};
  void* stream = nullptr;  // the cudaStream_t
};
// Checks every tensor (dense; on the CPU, or all contiguous on one CUDA device) and says where.
// CUDA tensors need torch to give extensions the stream's handle (c10::Stream::native_handle,
// torch 2.11 on); an older torch has them refused, naming why. `alternative` names the form
// to use with CUDA tensors where only CPU ones are taken ("" where CUDA ones are).
Placement place(const std::vector<const at::Tensor*>& tensors, const Call& c);
// Whether this build of the backend can take CUDA tensors at all (see place()).
bool cuda_tensors_supported();
// Makes the call's device current while the call is issued (the staging's events and copies are
// made on it); nothing on the CPU.
inline c10::OptionalDeviceGuard device_scope(const Placement& p) {
  return p.cuda ? c10::OptionalDeviceGuard(p.device) : c10::OptionalDeviceGuard();
}
// Every tensor of a per-rank list: `n` of them, dense, on the CPU, of like's dtype.
void check_list(const std::vector<at::Tensor>& list, size_t n, const at::Tensor& like,
                const Call& c);

// A tensor as elements of a library dtype. Complex tensors are pairs of their real type (sums
// and averages are element-wise there); a dtype the library does not know is moved as bytes.
struct Elems {
  rr::DataType dtype = rr::DataType::u8;
  size_t count = 0;
};
Elems move_elems(const at::Tensor& t);
// For a reduction with `op`: refuses dtypes and ops the library cannot reduce (naming them).
Elems reduce_elems(const at::Tensor& t, const c10d::ReduceOp& op, const Call& c);
// The elements of every tensor of a list, as move_elems counts them.
std::vector<size_t> counts_of(const std::vector<at::Tensor>& list);

struct Reduction {
  rr::ReduceOp op = rr::ReduceOp::sum;
  double premul_factor = 1.0;  // PREMUL_SUM's
};
Reduction reduction(const c10d::ReduceOp& op, const Call& c);

// Contiguous memory for the tensors an op reads and writes. A contiguous tensor is used as it is;
// another (a transposed or sliced view) gets a contiguous copy, and an output's copy is copied
// back by after() once the op has succeeded. gloo reads and writes such views as if they were
// contiguous (wrong results, and bytes outside the view written).
class Staging {
 public:
  at::Tensor input(const at::Tensor& t);
  at::Tensor inout(const at::Tensor& t);
  at::Tensor output(const at::Tensor& t);
  // The staging tensors, for the op to hold until it completes.
  std::vector<at::Tensor> keep() const { return keep_; }
  // Copies the staged outputs back, then runs `more` (may be null).
  std::function<void()> after(std::function<void()> more = nullptr) const;
  bool copies_back() const { return !back_.empty(); }

 private:
  std::vector<std::pair<at::Tensor, at::Tensor>> back_;  // (the caller's tensor, its copy)
  std::vector<at::Tensor> keep_;
};

// One contiguous buffer holding a list's tensors one after another (one collective instead of
// n), and what copies such a buffer back out into a list's tensors.
at::Tensor pack(const std::vector<at::Tensor>& list);
std::function<void()> unpack(at::Tensor flat, std::vector<at::Tensor> list);

// A c10d per-call timeout as ringreduce's (kUnsetTimeout: the communicator's), for tensors on
// the CPU, or placed as `where` says.
rr::CallOptions call_options(std::chrono::milliseconds timeout, double premul_factor = 1.0);
rr::CallOptions call_options(const Placement& where, std::chrono::milliseconds timeout,
                             double premul_factor = 1.0);

}  // namespace ringreduce::torch_backend
