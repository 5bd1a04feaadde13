// The CUDA kernels of reduce_cuda.h: one grid-stride kernel per family (combine, combine2,
// divide, scale), instantiated per element type and operator from elementwise.inc, so that the
// GPU computes bit for bit what the CPU kernels do (built with --fmad=false, as the CPU kernels
// are with -ffp-contract=off: the software f16 rounding depends on it, and a fused multiply-add
// would round sums of products differently from the CPU).
//
// Memory access: 16 bytes per thread per step (one 128-bit load from each input, one store per
// output) when every pointer is 16-byte aligned, the elements of a partial vector at the end by
// scalar code; misaligned buffers take the scalar path throughout. Grids are capped at a few
// blocks per SM and stride over the rest, so a launch costs the same whatever the count.

#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

#include "reduce/cuda/reduce_cuda.h"
#include "ringreduce/error.h"

namespace ringreduce::reduce::cuda {
namespace {

#include "reduce/elementwise.inc"

// ---------------------------------------------------------------------------------------------
// Errors: every runtime failure names the call and the runtime's message.

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
  }
}

// ---------------------------------------------------------------------------------------------
// Kernels.

constexpr int kThreads = 256;
constexpr size_t kVecBytes = 16;

template <class S>
struct alignas(kVecBytes) Vec {
  static constexpr int kLanes = static_cast<int>(kVecBytes / sizeof(S));
  S v[kLanes];
};

__device__ __forceinline__ size_t first_thread() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t thread_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

// Out = E::store(Op(E::load(a), E::load(b))) into one or two outputs. dst0 may alias a or b
// exactly: each thread reads its elements before writing them.
template <class E, class Op, bool kTwo>
__global__ void combine_kernel(typename E::Storage* dst0, typename E::Storage* dst1,
                               const typename E::Storage* a, const typename E::Storage* b, size_t n,
                               bool vector) {
  using S = typename E::Storage;
  using V = Vec<S>;
  size_t scalar_from = 0;
  if (vector) {
    const size_t nv = n / V::kLanes;
    const V* va = reinterpret_cast<const V*>(a);
    const V* vb = reinterpret_cast<const V*>(b);
    for (size_t i = first_thread(); i < nv; i += thread_stride()) {
      const V x = va[i], y = vb[i];
      V r;
#pragma unroll
      for (int l = 0; l < V::kLanes; ++l)
        r.v[l] = E::store(Op::apply(E::load(x.v[l]), E::load(y.v[l])));
      reinterpret_cast<V*>(dst0)[i] = r;
      if constexpr (kTwo) reinterpret_cast<V*>(dst1)[i] = r;
    }
    scalar_from = nv * V::kLanes;
  }
  for (size_t i = scalar_from + first_thread(); i < n; i += thread_stride()) {
    const S r = E::store(Op::apply(E::load(a[i]), E::load(b[i])));
    dst0[i] = r;
    if constexpr (kTwo) dst1[i] = r;
  }
}

// What one element becomes: divided (avg) or multiplied (premul_sum). Float types compute in
// their compute type and round once; integers truncate toward zero.
template <class E>
struct DivideBy {
  typename E::Compute dv;
  __device__ __forceinline__ typename E::Storage operator()(typename E::Storage x) const {
    return E::store(E::load(x) / dv);
  }
};
template <class T>
struct DivideIntBy {
  uint64_t divisor;
  __device__ __forceinline__ T operator()(T x) const { return divide_trunc(x, divisor); }
};
template <class E>
struct ScaleBy {
  typename E::Compute f;
  __device__ __forceinline__ typename E::Storage operator()(typename E::Storage x) const {
    return E::store(E::load(x) * f);
  }
};

template <class S, class F>
__global__ void map_kernel(S* dst, const S* src, size_t n, F f, bool vector) {
  using V = Vec<S>;
  size_t scalar_from = 0;
  if (vector) {
    const size_t nv = n / V::kLanes;
    for (size_t i = first_thread(); i < nv; i += thread_stride()) {
      const V x = reinterpret_cast<const V*>(src)[i];
      V r;
#pragma unroll
      for (int l = 0; l < V::kLanes; ++l) r.v[l] = f(x.v[l]);
      reinterpret_cast<V*>(dst)[i] = r;
    }
    scalar_from = nv * V::kLanes;
  }
  for (size_t i = scalar_from + first_thread(); i < n; i += thread_stride()) dst[i] = f(src[i]);
}

// ---------------------------------------------------------------------------------------------
// Launch shape.

bool aligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % kVecBytes == 0;
}

// Enough blocks to fill the current device several times over (its SM count, asked once per
// device), fewer for small counts.
unsigned blocks_for(size_t units) {
  constexpr int kMaxDevices = 64;
  // Atomic: calls come from any thread (the progress thread, the caller's).
  static std::atomic<int> sms[kMaxDevices] = {};
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  int count = dev < kMaxDevices ? sms[dev].load(std::memory_order_relaxed) : 0;
  if (count == 0) {
    check(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, dev),
          "cudaDeviceGetAttribute(multiprocessor count)");
    if (dev < kMaxDevices) sms[dev].store(count, std::memory_order_relaxed);
  }
  const size_t cap = static_cast<size_t>(count) * 8;
  size_t blocks = (units + kThreads - 1) / kThreads;
  if (blocks > cap) blocks = cap;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks);
}

template <class E, class Op>
void launch_combine(void* dst0, void* dst1, const void* a, const void* b, size_t n,
                    cudaStream_t stream) {
  using S = typename E::Storage;
  const bool vector = aligned(dst0) && aligned(a) && aligned(b) && (!dst1 || aligned(dst1));
  const size_t units = vector ? (n + Vec<S>::kLanes - 1) / Vec<S>::kLanes : n;
  const unsigned blocks = blocks_for(units);
  if (dst1) {
    combine_kernel<E, Op, true><<<blocks, kThreads, 0, stream>>>(
        static_cast<S*>(dst0), static_cast<S*>(dst1), static_cast<const S*>(a),
        static_cast<const S*>(b), n, vector);
  } else {
    combine_kernel<E, Op, false>
        <<<blocks, kThreads, 0, stream>>>(static_cast<S*>(dst0), nullptr, static_cast<const S*>(a),
                                          static_cast<const S*>(b), n, vector);
  }
  check(cudaGetLastError(), "combine kernel launch");
}

template <class S, class F>
void launch_map(void* dst, const void* src, size_t n, F f, cudaStream_t stream) {
  const bool vector = aligned(dst) && aligned(src);
  const size_t units = vector ? (n + Vec<S>::kLanes - 1) / Vec<S>::kLanes : n;
  map_kernel<S, F><<<blocks_for(units), kThreads, 0, stream>>>(
      static_cast<S*>(dst), static_cast<const S*>(src), n, f, vector);
  check(cudaGetLastError(), "kernel launch");
}

// ---------------------------------------------------------------------------------------------
// Dispatch: the same table as the CPU's (kernels.inc fill_row): avg and premul_sum combine as
// sum; bool's sum and max are or, prod and min are and; the bitwise ops on integers only.

template <class E>
void dispatch_op(ReduceOp op, void* d0, void* d1, const void* a, const void* b, size_t n,
                 cudaStream_t s) {
  constexpr bool kInt = std::is_integral_v<typename E::Compute>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum:
      return launch_combine<E, Sum>(d0, d1, a, b, n, s);
    case ReduceOp::prod:
      return launch_combine<E, Prod>(d0, d1, a, b, n, s);
    case ReduceOp::min:
      return launch_combine<E, Min>(d0, d1, a, b, n, s);
    case ReduceOp::max:
      return launch_combine<E, Max>(d0, d1, a, b, n, s);
    case ReduceOp::band:
      if constexpr (kInt) return launch_combine<E, BAnd>(d0, d1, a, b, n, s);
      break;
    case ReduceOp::bor:
      if constexpr (kInt) return launch_combine<E, BOr>(d0, d1, a, b, n, s);
      break;
    case ReduceOp::bxor:
      if constexpr (kInt) return launch_combine<E, BXor>(d0, d1, a, b, n, s);
      break;
  }
}

void dispatch_bool(ReduceOp op, void* d0, void* d1, const void* a, const void* b, size_t n,
                   cudaStream_t s) {
  using E = Plain<uint8_t>;
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::max:
    case ReduceOp::bor:
      return launch_combine<E, BoolOr>(d0, d1, a, b, n, s);
    case ReduceOp::prod:
    case ReduceOp::min:
    case ReduceOp::band:
      return launch_combine<E, BoolAnd>(d0, d1, a, b, n, s);
    case ReduceOp::bxor:
      return launch_combine<E, BoolXor>(d0, d1, a, b, n, s);
    default:
      break;
  }
}

void validate(DataType type, ReduceOp op, const char* call) {
  if (static_cast<int>(type) >= kNumDataTypes || static_cast<int>(op) >= kNumReduceOps ||
      !op_applies(op, type)) {
    throw InvalidArgument(std::string("reduce::cuda::") + call + ": " +
                          (static_cast<int>(op) < kNumReduceOps ? op_name(op) : "unknown op") +
                          " does not apply to " +
                          (static_cast<int>(type) < kNumDataTypes ? dtype_name(type) : "unknown"));
  }
}

// f16 through the device's own conversions (cvt.f32.f16, cvt.rn.f16.f32): the same bits as
// HalfSoft and F16C for every number (exact widening, round to nearest even with subnormals),
// where HalfSoft's integer work made the f16 kernels compute-bound (61% of the copy bandwidth on
// an H200, against 94-97% for bf16 and f32). NaN payloads may differ, as for every GPU result.
struct HalfCuda {
  using Storage = uint16_t;
  using Compute = float;
  __device__ __forceinline__ static float load(uint16_t x) {
    return __half2float(__ushort_as_half(x));
  }
  __device__ __forceinline__ static uint16_t store(float x) {
    return __half_as_ushort(__float2half_rn(x));
  }
};

// Calls f(E{}) with the element type (elementwise.inc) that stores `type`; bool is Plain<uint8_t>.
template <class E>
struct ElementTag {
  using type = E;
};
template <class F>
void with_element(DataType type, F&& f) {
  switch (type) {
    case DataType::f16:
      return f(ElementTag<HalfCuda>{});
    case DataType::bf16:
      return f(ElementTag<Bf16>{});
    case DataType::f32:
      return f(ElementTag<Plain<float>>{});
    case DataType::f64:
      return f(ElementTag<Plain<double>>{});
    case DataType::i8:
      return f(ElementTag<Plain<int8_t>>{});
    case DataType::u8:
    case DataType::boolean:
      return f(ElementTag<Plain<uint8_t>>{});
    case DataType::i16:
      return f(ElementTag<Plain<int16_t>>{});
    case DataType::i32:
      return f(ElementTag<Plain<int32_t>>{});
    case DataType::u32:
      return f(ElementTag<Plain<uint32_t>>{});
    case DataType::i64:
      return f(ElementTag<Plain<int64_t>>{});
    case DataType::u64:
      return f(ElementTag<Plain<uint64_t>>{});
  }
}

void dispatch_combine(void* d0, void* d1, const void* a, const void* b, size_t n, DataType type,
                      ReduceOp op, void* stream, const char* call) {
  validate(type, op, call);
  if (n == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  if (type == DataType::boolean) return dispatch_bool(op, d0, d1, a, b, n, s);
  with_element(
      type, [&](auto tag) { dispatch_op<typename decltype(tag)::type>(op, d0, d1, a, b, n, s); });
}

}  // namespace

// ---------------------------------------------------------------------------------------------

std::string unavailable_reason() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no usable CUDA device: ") + cudaGetErrorString(e);
  if (count == 0) return "no CUDA device";
  return "";
}

bool available() {
  static const bool yes = unavailable_reason().empty();
  return yes;
}

std::string device_description() {
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp p{};
  check(cudaGetDeviceProperties(&p, dev), "cudaGetDeviceProperties");
  char text[320];
  std::snprintf(text, sizeof text, "%s, sm_%d%d, %d SMs, %.1f GiB", p.name, p.major, p.minor,
                p.multiProcessorCount, static_cast<double>(p.totalGlobalMem) / (1u << 30));
  return text;
}

void combine(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op,
             void* stream) {
  dispatch_combine(dst, nullptr, a, b, count, type, op, stream, "combine");
}

void combine2(void* dst0, void* dst1, const void* a, const void* b, size_t count, DataType type,
              ReduceOp op, void* stream) {
  dispatch_combine(dst0, dst1, a, b, count, type, op, stream, "combine2");
}

void divide(void* dst, const void* src, size_t count, DataType type, uint64_t divisor,
            void* stream) {
  if (divisor == 0) throw InvalidArgument("reduce::cuda::divide: divisor 0");
  if (type == DataType::boolean) throw InvalidArgument("reduce::cuda::divide: bool has no avg");
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  with_element(type, [&](auto tag) {
    using E = typename decltype(tag)::type;
    using C = typename E::Compute;
    if constexpr (std::is_integral_v<C>) {
      launch_map<C>(dst, src, count, DivideIntBy<C>{divisor}, s);
    } else {
      launch_map<typename E::Storage>(dst, src, count, DivideBy<E>{static_cast<C>(divisor)}, s);
    }
  });
}

void scale(void* dst, const void* src, size_t count, DataType type, double factor, void* stream) {
  if (!is_float(type)) {
    throw InvalidArgument(std::string("reduce::cuda::scale: ") + dtype_name(type) +
                          " is not a floating-point type");
  }
  if (count == 0) return;
  auto s = static_cast<cudaStream_t>(stream);
  with_element(type, [&](auto tag) {
    using E = typename decltype(tag)::type;
    using C = typename E::Compute;
    if constexpr (!std::is_integral_v<C>)
      launch_map<typename E::Storage>(dst, src, count, ScaleBy<E>{static_cast<C>(factor)}, s);
  });
}

DeviceBuffer::DeviceBuffer(size_t bytes) : bytes_(bytes) {
  check(cudaMalloc(&ptr_, bytes ? bytes : 1), "cudaMalloc");
}

DeviceBuffer::~DeviceBuffer() {
  cudaFree(ptr_);
}

void DeviceBuffer::upload(const void* src, size_t bytes, size_t offset) {
  if (offset + bytes > bytes_) throw InvalidArgument("DeviceBuffer::upload: past the end");
  check(cudaMemcpy(static_cast<char*>(ptr_) + offset, src, bytes, cudaMemcpyHostToDevice),
        "cudaMemcpy to the device");
}

void DeviceBuffer::download(void* dst, size_t bytes, size_t offset) const {
  if (offset + bytes > bytes_) throw InvalidArgument("DeviceBuffer::download: past the end");
  check(cudaMemcpy(dst, static_cast<const char*>(ptr_) + offset, bytes, cudaMemcpyDeviceToHost),
        "cudaMemcpy from the device");
}

void synchronize(void* stream) {
  check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)), "cudaStreamSynchronize");
}

void copy(void* dst, const void* src, size_t bytes, void* stream) {
  check(
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, static_cast<cudaStream_t>(stream)),
      "cudaMemcpyAsync device to device");
}

EventTimer::EventTimer() {
  cudaEvent_t a = nullptr, b = nullptr;
  check(cudaEventCreate(&a), "cudaEventCreate");
  if (const cudaError_t e = cudaEventCreate(&b); e != cudaSuccess) {
    cudaEventDestroy(a);
    check(e, "cudaEventCreate");
  }
  start_ = a;
  stop_ = b;
}

EventTimer::~EventTimer() {
  cudaEventDestroy(static_cast<cudaEvent_t>(start_));
  cudaEventDestroy(static_cast<cudaEvent_t>(stop_));
}

void EventTimer::start(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(start_), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}

void EventTimer::stop(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(stop_), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}

double EventTimer::elapsed_ms() {
  check(cudaEventSynchronize(static_cast<cudaEvent_t>(stop_)), "cudaEventSynchronize");
  float ms = 0;
  check(
      cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start_), static_cast<cudaEvent_t>(stop_)),
      "cudaEventElapsedTime");
  return ms;
}

}  // namespace ringreduce::reduce::cuda
