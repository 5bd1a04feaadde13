// runtime.h's SharedDeviceBuffer over CUDA's virtual memory management. The driver is never
// linked (runtime.cc): its cuMem* entry points come through cudaGetDriverEntryPointByVersion.
// Compiled only with CUDA; reduce_cuda_none.cc stands in otherwise.
#if defined(RINGREDUCE_HAVE_CUDA)

#include <cuda.h>
#include <cuda_runtime.h>
#include <unistd.h>

#include <string>

#include "reduce/cuda/runtime.h"
#include "ringreduce/error.h"

namespace ringreduce::reduce::cuda {
namespace {

struct Vmm {
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*,
                     unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*export_handle)(void*, CUmemGenericAllocationHandle, CUmemAllocationHandleType,
                            unsigned long long) = nullptr;
  CUresult (*import_handle)(CUmemGenericAllocationHandle*, void*,
                            CUmemAllocationHandleType) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*free_address)(CUdeviceptr, size_t) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle,
                  unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*,
                          CUmemAllocationGranularity_flags) = nullptr;
  std::string missing;  // the first entry point the driver did not give
};

template <class F>
void entry(const char* name, F* out, std::string* missing) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  if (cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status) !=
          cudaSuccess ||
      status != cudaDriverEntryPointSuccess) {
    if (missing->empty()) *missing = name;
    return;
  }
  *out = reinterpret_cast<F>(fn);
}

const Vmm& vmm() {
  static const Vmm v = [] {
    Vmm v;
    entry("cuMemCreate", &v.create, &v.missing);
    entry("cuMemRelease", &v.release, &v.missing);
    entry("cuMemExportToShareableHandle", &v.export_handle, &v.missing);
    entry("cuMemImportFromShareableHandle", &v.import_handle, &v.missing);
    entry("cuMemAddressReserve", &v.reserve, &v.missing);
    entry("cuMemAddressFree", &v.free_address, &v.missing);
    entry("cuMemMap", &v.map, &v.missing);
    entry("cuMemUnmap", &v.unmap, &v.missing);
    entry("cuMemSetAccess", &v.set_access, &v.missing);
    entry("cuMemGetAllocationGranularity", &v.granularity, &v.missing);
    return v;
  }();
  if (!v.missing.empty())
    throw Error("cuda: shared device memory needs the driver's " + v.missing +
                ", which it does not give");
  return v;
}

void check(CUresult r, const char* what) {
  if (r != CUDA_SUCCESS)
    throw Error(std::string("cuda: ") + what + " failed (CUresult " + std::to_string(r) + ")" +
                (r == CUDA_ERROR_NOT_SUPPORTED
                     ? ": this device or driver has no virtual memory management with POSIX "
                       "file-descriptor handles"
                     : ""));
}

CUmemAllocationProp props(int dev) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = dev;
  p.requestedHandleTypes = CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR;
  return p;
}

size_t granularity(const Vmm& v, const CUmemAllocationProp& p) {
  size_t gran = 0;
  check(v.granularity(&gran, &p, CU_MEM_ALLOC_GRANULARITY_MINIMUM),
        "cuMemGetAllocationGranularity");
  return gran;
}

}  // namespace

// Both ways end alike: a reserved range, the allocation (handle_) mapped into it, read-write for
// this process's current device.
void SharedDeviceBuffer::map_on(int device, size_t gran) {
  const Vmm& v = vmm();
  CUdeviceptr ptr = 0;
  check(v.reserve(&ptr, bytes_, gran, 0, 0), "cuMemAddressReserve");
  ptr_ = ptr;
  reserved_ = true;
  check(v.map(ptr, bytes_, 0, static_cast<CUmemGenericAllocationHandle>(handle_), 0), "cuMemMap");
  mapped_ = true;
  CUmemAccessDesc a{};
  a.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  a.location.id = device;
  a.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  check(v.set_access(ptr, bytes_, &a, 1), "cuMemSetAccess");
}

std::unique_ptr<SharedDeviceBuffer> SharedDeviceBuffer::create(size_t bytes) {
  const Vmm& v = vmm();
  const int dev = current_device();
  const CUmemAllocationProp p = props(dev);
  const size_t gran = granularity(v, p);
  std::unique_ptr<SharedDeviceBuffer> b(new SharedDeviceBuffer);
  b->bytes_ = (std::max<size_t>(bytes, 1) + gran - 1) / gran * gran;
  CUmemGenericAllocationHandle h = 0;
  check(v.create(&h, b->bytes_, &p, 0), "cuMemCreate");
  b->handle_ = h;
  b->have_handle_ = true;
  b->map_on(dev, gran);
  return b;
}

std::unique_ptr<SharedDeviceBuffer> SharedDeviceBuffer::import(int fd, size_t bytes) {
  const Vmm& v = vmm();
  const int dev = current_device();
  const size_t gran = granularity(v, props(dev));
  if (bytes == 0 || bytes % gran != 0)
    throw Error("cuda: an imported device buffer of " + std::to_string(bytes) +
                " bytes is not a multiple of the granularity (" + std::to_string(gran) + ")");
  std::unique_ptr<SharedDeviceBuffer> b(new SharedDeviceBuffer);
  b->bytes_ = bytes;
  CUmemGenericAllocationHandle h = 0;
  // The handle type's argument is the descriptor's value itself, cast to a pointer (CUDA's
  // convention for POSIX descriptors).
  check(v.import_handle(&h, reinterpret_cast<void*>(static_cast<uintptr_t>(fd)),
                        CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR),
        "cuMemImportFromShareableHandle");
  b->handle_ = h;
  b->have_handle_ = true;
  b->map_on(dev, gran);
  return b;
}

SharedDeviceBuffer::~SharedDeviceBuffer() {
  const Vmm& v = vmm();
  if (mapped_) v.unmap(static_cast<CUdeviceptr>(ptr_), bytes_);
  if (reserved_) v.free_address(static_cast<CUdeviceptr>(ptr_), bytes_);
  if (have_handle_) v.release(static_cast<CUmemGenericAllocationHandle>(handle_));
}

int SharedDeviceBuffer::export_fd() const {
  int fd = -1;
  check(vmm().export_handle(&fd, static_cast<CUmemGenericAllocationHandle>(handle_),
                            CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0),
        "cuMemExportToShareableHandle");
  return fd;
}

}  // namespace ringreduce::reduce::cuda

#endif  // RINGREDUCE_HAVE_CUDA
