// The few CUDA runtime services the communicator needs to stage device buffers through host
// memory: is a pointer device memory, page-locked host memory the device can reach, events,
// copies in any direction and a stream that waits for a host flag. Like reduce_cuda.h, no CUDA
// types: streams are void* (a cudaStream_t), and in a build without CUDA every call refuses
// (in_use() is false, so nothing asks).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

namespace ringreduce::reduce::cuda {

// Whether this process uses CUDA already (the driver is loaded and initialised, by the
// application or by torch). Exact and cheap enough for every call (~12 ns while CUDA is not
// loaded: it looks for the driver again only when the process has loaded a library since), and
// it never loads or initialises the driver itself, so a CPU-only program on a GPU machine gets no
// CUDA context.
bool in_use();
// Whether p is device (or managed) memory. Asks the driver (cudaPointerGetAttributes); only call
// it when in_use().
bool is_device_pointer(const void* p);

// Page-locked host memory, mapped into the device's address space (cudaHostAlloc, portable and
// mapped): copies to and from it run at the bus's rate, and a stream can wait on a word of it.
class PinnedBuffer {
 public:
  explicit PinnedBuffer(size_t bytes);
  ~PinnedBuffer();
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  char* data() const { return ptr_; }
  size_t size() const { return bytes_; }

 private:
  char* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// A point in a stream (cudaEvent_t without timing).
class Event {
 public:
  Event();
  ~Event();
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;
  void record(void* stream);
  // Enqueues on `stream` a wait for the point last recorded (cudaStreamWaitEvent).
  void wait_on(void* stream);
  // Whether the stream has passed the recorded point (true for an event never recorded); throws
  // the stream's error if its work failed.
  bool done();

 private:
  void* event_ = nullptr;
};

// The calling thread's current device, and making one current (cudaGetDevice, cudaSetDevice): a
// thread that enqueues on a stream of another device (the progress thread) makes it current first.
int current_device();
void set_current_device(int device);

// A non-blocking stream on the current device (it does not wait for the legacy default stream).
void* create_stream();
void destroy_stream(void* stream);

// cudaMemcpyAsync with the direction found from the pointers (cudaMemcpyDefault).
void copy_async(void* dst, const void* src, size_t bytes, void* stream);
// Makes the stream wait until *flag has reached value, cyclically ((int32_t)(*flag - value) >= 0:
// a store of a later value releases every earlier wait); flag lies in a PinnedBuffer, and the host
// writes it with a release store. cuStreamWaitValue32 where the device supports stream memory
// operations, else a host function that polls the flag (it holds CUDA's callback thread meanwhile).
void wait_value(void* stream, const uint32_t* flag, uint32_t value);

// Device memory another process on this host maps (shared_memory.cc): CUDA's virtual memory
// management, cuMemCreate with POSIX file-descriptor handles, mapped read-write on the current
// device. export_fd() gives a descriptor for the other process (it travels over a Unix socket,
// SCM_RIGHTS); import() maps one into this process, for its current device (a peer GPU through
// peer access). Throws naming the driver's answer where the device or driver cannot (no VMM, no
// POSIX handles: the legacy cudaIpcGetMemHandle is the fallback, not yet built).
class SharedDeviceBuffer {
 public:
  // At least `bytes`, rounded up to the allocation granularity (size()).
  static std::unique_ptr<SharedDeviceBuffer> create(size_t bytes);
  // Maps the memory behind `fd` (not taken: the caller closes it), of `bytes` as the exporter's
  // size() said.
  static std::unique_ptr<SharedDeviceBuffer> import(int fd, size_t bytes);
  ~SharedDeviceBuffer();
  SharedDeviceBuffer(const SharedDeviceBuffer&) = delete;
  SharedDeviceBuffer& operator=(const SharedDeviceBuffer&) = delete;
  char* data() const { return reinterpret_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }
  // A new descriptor for the memory (the caller closes it).
  int export_fd() const;

 private:
  SharedDeviceBuffer() = default;
  void map_on(int device, size_t granularity);  // reserve, map, make read-write (shared_memory.cc)
  unsigned long long handle_ = 0;               // CUmemGenericAllocationHandle
  unsigned long long ptr_ = 0;                  // CUdeviceptr
  size_t bytes_ = 0;
  bool mapped_ = false, reserved_ = false, have_handle_ = false;
};

}  // namespace ringreduce::reduce::cuda
