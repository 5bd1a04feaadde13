#include "torch_tensors.h"

#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/version.h>

#include <type_traits>
#include <utility>

namespace ringreduce::torch_backend {

void fail(const Call& c, const std::string& what) {
  throw rr::InvalidArgument("rank " + std::to_string(c.rank) + ": " + c.name + ": " + what);
}

void check_tensor(const at::Tensor& t, const Call& c) {
  check(t.defined(), c, "an undefined tensor");
  check(t.device().is_cpu(), c,
        "tensors must be on the CPU here (this is " + t.device().str() + ")" +
            (t.device().is_cuda()
                 ? ": with CUDA tensors use the forms into and out of one tensor "
                   "(all_gather_into_tensor, reduce_scatter_tensor, all_to_all_single)"
                 : ""));
  check(t.layout() == c10::kStrided, c, "only dense tensors are supported here");
}

namespace {

// c10::Stream::native_handle() (torch 2.11 on): the raw cudaStream_t of a torch stream, which is
// what the library orders a call on. Older torches give extensions no way to it without CUDA's
// own headers (which a CPU build of torch, like Debian's, does not have).
template <class S, class = void>
struct HasNativeHandle : std::false_type {};
template <class S>
struct HasNativeHandle<S, std::void_t<decltype(std::declval<const S&>().native_handle())>>
    : std::true_type {};

template <class S>
void* native_handle(const S& s) {
  if constexpr (HasNativeHandle<S>::value)
    return s.native_handle();
  else
    return nullptr;
}

}  // namespace

bool cuda_tensors_supported() {
  return HasNativeHandle<c10::Stream>::value;
}

Placement place(const std::vector<const at::Tensor*>& tensors, const Call& c) {
  Placement p;
  bool first = true;
  for (const at::Tensor* t : tensors) {
    check(t->defined(), c, "an undefined tensor");
    check(t->layout() == c10::kStrided, c, "only dense tensors are supported here");
    const c10::Device d = t->device();
    check(d.is_cpu() || d.is_cuda(), c,
          "tensors must be on the CPU or a CUDA device (this is " + d.str() + ")");
    if (first) {
      p.cuda = d.is_cuda();
      p.device = d;
      first = false;
    }
    check(
        d == p.device, c,
        "the call's tensors are on different devices (" + p.device.str() + " and " + d.str() + ")");
    if (d.is_cuda())
      check(t->is_contiguous(), c,
            "CUDA tensors must be contiguous here (a view's copy back would run off torch's "
            "stream)");
  }
  if (!p.cuda) return p;
  check(cuda_tensors_supported(), c,
        "CUDA tensors need torch 2.11 or later here (this is " TORCH_VERSION
        "): an older torch gives extensions no handle to its CUDA stream "
        "(c10::Stream::native_handle)");
  const c10::Stream s = c10::impl::getDeviceGuardImpl(c10::DeviceType::CUDA)->getStream(p.device);
  p.stream = native_handle(s);
  return p;
}

void check_list(const std::vector<at::Tensor>& list, size_t n, const at::Tensor& like,
                const Call& c) {
  check(list.size() == n, c,
        "expects a list of one tensor per rank (" + std::to_string(n) + "), got " +
            std::to_string(list.size()));
  for (const auto& t : list) {
    check_tensor(t, c);
    check(t.scalar_type() == like.scalar_type(), c,
          std::string("tensors of the list differ in dtype (") + c10::toString(t.scalar_type()) +
              " vs " + c10::toString(like.scalar_type()) + ")");
  }
}

namespace {

bool library_dtype(at::ScalarType s, rr::DataType* out) {
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
    case at::kShort:
      *out = rr::DataType::i16;
      return true;
    case at::kInt:
      *out = rr::DataType::i32;
      return true;
    case at::kLong:
      *out = rr::DataType::i64;
      return true;
    case at::kBool:
      *out = rr::DataType::boolean;
      return true;
#if TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 3)
    case at::ScalarType::UInt32:
      *out = rr::DataType::u32;
      return true;
    case at::ScalarType::UInt64:
      *out = rr::DataType::u64;
      return true;
#endif
    default:
      return false;
  }
}

// Complex: pairs of the real type.
bool complex_dtype(at::ScalarType s, rr::DataType* out) {
  if (s == at::kComplexFloat) return *out = rr::DataType::f32, true;
  if (s == at::kComplexDouble) return *out = rr::DataType::f64, true;
  return false;
}

}  // namespace

Elems move_elems(const at::Tensor& t) {
  Elems e;
  const size_t n = static_cast<size_t>(t.numel());
  if (library_dtype(t.scalar_type(), &e.dtype)) return e.count = n, e;
  if (complex_dtype(t.scalar_type(), &e.dtype)) return e.count = 2 * n, e;
  e.dtype = rr::DataType::u8;
  e.count = static_cast<size_t>(t.nbytes());
  return e;
}

Elems reduce_elems(const at::Tensor& t, const c10d::ReduceOp& op, const Call& c) {
  Elems e;
  const size_t n = static_cast<size_t>(t.numel());
  if (library_dtype(t.scalar_type(), &e.dtype)) return e.count = n, e;
  if (complex_dtype(t.scalar_type(), &e.dtype)) {
    // Element-wise on the real and imaginary parts: right for sums and averages only.
    const auto o = static_cast<c10d::ReduceOp::RedOpType>(op);
    check(o == c10d::ReduceOp::SUM || o == c10d::ReduceOp::AVG || o == c10d::ReduceOp::PREMUL_SUM,
          c, "complex tensors reduce with SUM, AVG and PREMUL_SUM only");
    return e.count = 2 * n, e;
  }
  fail(c, std::string("dtype ") + c10::toString(t.scalar_type()) +
              " cannot be reduced (float16, bfloat16, float32, float64, complex, int8, uint8, "
              "int16, int32, int64 and bool can)");
}

std::vector<size_t> counts_of(const std::vector<at::Tensor>& list) {
  std::vector<size_t> v;
  v.reserve(list.size());
  for (const auto& t : list) v.push_back(move_elems(t).count);
  return v;
}

// The factor of a PREMUL_SUM: a double, or a one-element tensor (torch 1.13 keeps a list of
// them, 2.x one tensor; a template so that only the member this torch has is named).
template <class Supplement>
double premul_factor(const Supplement& s) {
  if constexpr (requires { s.tensor_factor; }) {
    if (s.tensor_factor.defined()) return s.tensor_factor.template item<double>();
  } else {
    if (!s.tensor_factors.empty()) return s.tensor_factors[0].template item<double>();
  }
  return s.double_factor;
}

Reduction reduction(const c10d::ReduceOp& op, const Call& c) {
  switch (static_cast<c10d::ReduceOp::RedOpType>(op)) {
    case c10d::ReduceOp::SUM:
      return {rr::ReduceOp::sum};
    case c10d::ReduceOp::PRODUCT:
      return {rr::ReduceOp::prod};
    case c10d::ReduceOp::MIN:
      return {rr::ReduceOp::min};
    case c10d::ReduceOp::MAX:
      return {rr::ReduceOp::max};
    case c10d::ReduceOp::AVG:
      return {rr::ReduceOp::avg};
    case c10d::ReduceOp::BAND:
      return {rr::ReduceOp::band};
    case c10d::ReduceOp::BOR:
      return {rr::ReduceOp::bor};
    case c10d::ReduceOp::BXOR:
      return {rr::ReduceOp::bxor};
    case c10d::ReduceOp::PREMUL_SUM: {
      // torch.distributed._make_nccl_premul_sum(factor): a float, or a one-element tensor.
      const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
      check(s != nullptr, c, "PREMUL_SUM without its factor");
      return {rr::ReduceOp::premul_sum, premul_factor(*s)};
    }
    default:
      fail(c, "reduce op " + std::to_string(static_cast<int>(op.op_)) + " is not supported");
  }
}

at::Tensor Staging::input(const at::Tensor& t) {
  if (t.is_contiguous()) return t;
  at::Tensor copy = t.contiguous();
  keep_.push_back(copy);
  return copy;
}

at::Tensor Staging::inout(const at::Tensor& t) {
  if (t.is_contiguous()) return t;
  at::Tensor copy = t.contiguous();
  keep_.push_back(copy);
  back_.emplace_back(t, copy);
  return copy;
}

at::Tensor Staging::output(const at::Tensor& t) {
  if (t.is_contiguous()) return t;
  at::Tensor copy = at::empty(t.sizes(), t.options().memory_format(at::MemoryFormat::Contiguous));
  keep_.push_back(copy);
  back_.emplace_back(t, copy);
  return copy;
}

std::function<void()> Staging::after(std::function<void()> more) const {
  if (back_.empty()) return more;
  return [back = back_, more = std::move(more)]() mutable {
    for (auto& [user, staged] : back) user.copy_(staged);
    if (more) more();
  };
}

at::Tensor pack(const std::vector<at::Tensor>& list) {
  std::vector<at::Tensor> flat;
  flat.reserve(list.size());
  for (const auto& t : list) flat.push_back(t.reshape({-1}));
  return at::cat(flat);
}

std::function<void()> unpack(at::Tensor flat, std::vector<at::Tensor> list) {
  return [flat, list]() mutable {
    int64_t off = 0;
    for (auto& t : list) {
      // copy_ follows t's strides: any view of the caller's gets its elements.
      t.copy_(flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
  };
}

rr::CallOptions call_options(const Placement& where, std::chrono::milliseconds timeout,
                             double premul_factor) {
  rr::CallOptions o = call_options(timeout, premul_factor);
  if (where.cuda) {
    o.memory = rr::Memory::device;
    o.stream = where.stream;
  }
  return o;
}

rr::CallOptions call_options(std::chrono::milliseconds timeout, double premul_factor) {
  rr::CallOptions o;
  // Where the tensors live is known (checked per call): saying so spares each call the driver's
  // pointer lookups in a process that uses CUDA (~0.1 us a buffer, docs/GPU.md).
  o.memory = rr::Memory::host;
  if (timeout != c10d::kUnsetTimeout && timeout.count() > 0) o.timeout = timeout;
  o.premul_factor = premul_factor;
  return o;
}

}  // namespace ringreduce::torch_backend
