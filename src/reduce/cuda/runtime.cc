// runtime.h over the CUDA runtime (static, inside libringreduce.so) and, for the two services the
// runtime lacks, the driver's entry points: whether the driver is initialised, and
// cuStreamWaitValue32. The driver is never linked: it is looked up in the process (dlopen with
// RTLD_NOLOAD) or through cudaGetDriverEntryPointByVersion.
// Compiled only with CUDA (the layer globs every .cc); reduce_cuda_none.cc stands in otherwise.
#if defined(RINGREDUCE_HAVE_CUDA)

#include "reduce/cuda/runtime.h"

#include <cuda.h>
#include <cuda_runtime.h>
#include <dlfcn.h>
#include <link.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>

#include "ringreduce/error.h"

namespace ringreduce::reduce::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw Error(std::string("cuda: ") + what + ": " + cudaGetErrorString(e));
}

using CtxGetCurrent = CUresult (*)(CUcontext*);
using StreamWaitValue32 = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

std::atomic<CtxGetCurrent> g_ctx_get_current{nullptr};
std::atomic<unsigned long long> g_looked_at_adds{~0ull};

int read_adds(dl_phdr_info* info, size_t, void* out) {
  *static_cast<unsigned long long*>(out) = info->dlpi_adds;
  return 1;  // the first object carries the count: stop there
}

// The path of the loaded libcuda (the driver: libcuda.so.1, or a versioned name), if any.
int find_libcuda(dl_phdr_info* info, size_t, void* out) {
  const char* name = info->dlpi_name;
  if (!name) return 0;
  const char* slash = std::strrchr(name, '/');
  const char* base = slash ? slash + 1 : name;
  if (std::strncmp(base, "libcuda.so", 10) != 0) return 0;
  *static_cast<std::string*>(out) = name;
  return 1;
}

// The driver's cuCtxGetCurrent if libcuda is loaded in this process; null otherwise. The loaded
// objects are looked at again only when the process has loaded another library since the last
// look (glibc's count of loads, which dl_iterate_phdr gives for ~12 ns): exact, so a call right
// after the application starts CUDA sees it, and cheap on every call of a program that never
// does. The look walks the loaded objects' names (microseconds); asking the loader for
// "libcuda.so.1" with RTLD_NOLOAD instead searched the library path when it was not loaded
// (40-odd failed opens, hundreds of microseconds on every program's first call).
CtxGetCurrent ctx_get_current() {
  if (CtxGetCurrent f = g_ctx_get_current.load(std::memory_order_acquire)) return f;
  unsigned long long adds = 0;
  dl_iterate_phdr(read_adds, &adds);
  if (g_looked_at_adds.load(std::memory_order_acquire) == adds) return nullptr;
  // Every thread that sees a new count waits for one look, so none goes on without it.
  static std::mutex look_mu;
  std::lock_guard<std::mutex> lk(look_mu);
  if (CtxGetCurrent f = g_ctx_get_current.load(std::memory_order_acquire)) return f;
  CtxGetCurrent f = nullptr;
  // The handle is kept: libcuda is never unloaded once a process has used it. Opened by the
  // loaded object's own path, so the loader finds it among the loaded ones without a search.
  std::string path;
  dl_iterate_phdr(find_libcuda, &path);
  if (void* lib = path.empty() ? nullptr : dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    f = reinterpret_cast<CtxGetCurrent>(dlsym(lib, "cuCtxGetCurrent"));
    if (f) g_ctx_get_current.store(f, std::memory_order_release);
  }
  g_looked_at_adds.store(adds, std::memory_order_release);
  return f;
}

StreamWaitValue32 stream_wait_value32() {
  static const StreamWaitValue32 f = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult status{};
    if (cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
                                         &status) != cudaSuccess ||
        status != cudaDriverEntryPointSuccess)
      return StreamWaitValue32{nullptr};
    return reinterpret_cast<StreamWaitValue32>(fn);
  }();
  return f;
}

// The fallback's host function: polls the flag. It runs on CUDA's callback thread and must not
// call CUDA; the communicator always sets the flag in the end (the op's completion, its failure,
// or the communicator's destruction).
struct FlagWait {
  const uint32_t* flag;
  uint32_t value;
};
void CUDART_CB poll_flag(void* p) {
  const auto* w = static_cast<FlagWait*>(p);
  std::atomic_ref<const uint32_t> flag(*w->flag);
  // Reached, cyclically (as CU_STREAM_WAIT_VALUE_GEQ compares).
  while (static_cast<int32_t>(flag.load(std::memory_order_acquire) - w->value) < 0)
    std::this_thread::sleep_for(std::chrono::microseconds(20));
  delete w;
}

}  // namespace

bool in_use() {
  const CtxGetCurrent f = ctx_get_current();
  if (!f) return false;
  // CUDA_ERROR_NOT_INITIALIZED until someone has called cuInit: then no pointer is device memory.
  CUcontext ctx = nullptr;
  return f(&ctx) == CUDA_SUCCESS;
}

bool is_device_pointer(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
    cudaGetLastError();  // not sticky; clear it for the caller's next check
    return false;
  }
  return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

PinnedBuffer::PinnedBuffer(size_t bytes) : bytes_(bytes) {
  void* p = nullptr;
  check(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable | cudaHostAllocMapped),
        "cudaHostAlloc");
  ptr_ = static_cast<char*>(p);
}

PinnedBuffer::~PinnedBuffer() {
  cudaFreeHost(ptr_);
}

Event::Event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cudaEventCreateWithFlags");
  event_ = e;
}

Event::~Event() {
  cudaEventDestroy(static_cast<cudaEvent_t>(event_));
}

void Event::record(void* stream) {
  check(cudaEventRecord(static_cast<cudaEvent_t>(event_), static_cast<cudaStream_t>(stream)),
        "cudaEventRecord");
}

void Event::wait_on(void* stream) {
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), static_cast<cudaEvent_t>(event_), 0),
        "cudaStreamWaitEvent");
}

int current_device() {
  int d = 0;
  check(cudaGetDevice(&d), "cudaGetDevice");
  return d;
}

void set_current_device(int device) {
  check(cudaSetDevice(device), "cudaSetDevice");
}

void* create_stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  return s;
}

void destroy_stream(void* stream) {
  cudaStreamDestroy(static_cast<cudaStream_t>(stream));
}

bool Event::done() {
  const cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event_));
  if (e == cudaErrorNotReady) return false;
  check(e, "cudaEventQuery (the stream's work before this call failed)");
  return true;
}

void copy_async(void* dst, const void* src, size_t bytes, void* stream) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)),
        "cudaMemcpyAsync");
}

void wait_value(void* stream, const uint32_t* flag, uint32_t value) {
  if (StreamWaitValue32 f = stream_wait_value32()) {
    void* dev = nullptr;
    check(cudaHostGetDevicePointer(&dev, const_cast<uint32_t*>(flag), 0),
          "cudaHostGetDevicePointer");
    const CUresult r = f(static_cast<CUstream>(stream), reinterpret_cast<CUdeviceptr>(dev), value,
                         CU_STREAM_WAIT_VALUE_GEQ);
    if (r == CUDA_SUCCESS) return;
    if (r != CUDA_ERROR_NOT_SUPPORTED)
      throw Error("cuda: cuStreamWaitValue32 failed (CUresult " + std::to_string(r) + ")");
  }
  auto* w = new FlagWait{flag, value};
  if (const cudaError_t e = cudaLaunchHostFunc(static_cast<cudaStream_t>(stream), poll_flag, w);
      e != cudaSuccess) {
    delete w;
    check(e, "cudaLaunchHostFunc");
  }
}

}  // namespace ringreduce::reduce::cuda

#endif  // RINGREDUCE_HAVE_CUDA
