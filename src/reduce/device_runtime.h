// The device runtime: the few services of a GPU runtime that staging device buffers through host
// memory (comm/device.h) and the device link kind (transport/device/) need, behind an interface
// so that the tests can run every path on an emulated device (tests/inprocess/emulated_device.h).
// CUDA's implementation is device_runtime.cc over reduce/cuda/; in a build without CUDA it is
// never in use. In the reduce layer, below the transports, because a device link reduces with it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "core/fd.h"
#include "ringreduce/types.h"

namespace ringreduce::reduce {

// What staging needs from a device runtime. CUDA's in production (reduce/cuda/runtime.h); the
// tests install an emulation whose streams are worker threads, so that the staging's order of
// work is checked on machines without a GPU.
class DeviceRuntime {
 public:
  struct HostMemory {
    virtual ~HostMemory() = default;
    virtual char* data() = 0;  // page-locked and reachable from the device
  };
  struct Event {
    virtual ~Event() = default;
    virtual void record(void* stream) = 0;
    virtual bool done() = 0;  // throws if the stream's work failed
  };

  virtual ~DeviceRuntime() = default;
  // Whether a runtime is in use in this process at all: false means no pointer is device memory
  // and is_device() need not be asked (CallOptions::memory automatic costs nothing then).
  virtual bool in_use() = 0;
  virtual bool is_device(const void* p) = 0;
  virtual std::unique_ptr<HostMemory> host_memory(size_t bytes) = 0;
  virtual std::unique_ptr<Event> event() = 0;
  // Enqueued on the stream, in any direction.
  virtual void copy(void* dst, const void* src, size_t bytes, void* stream) = 0;
  // Enqueues a wait until *flag has reached value, cyclically ((int32_t)(*flag - value) >= 0, as
  // CUDA's CU_STREAM_WAIT_VALUE_GEQ; flag in host_memory()), so that a host that has released
  // several waits at once by one store lets the stream through every one of them.
  virtual void wait_value(void* stream, const uint32_t* flag, uint32_t value) = 0;
  // The calling thread's current device, and making one current: a stream's work is enqueued with
  // its device current (the progress thread's is the first device otherwise).
  virtual int current_device() { return 0; }
  virtual void set_current_device(int device) { (void)device; }
  // A stream of the library's own (non-blocking, on the current device), and its end.
  virtual void* create_stream() = 0;
  virtual void destroy_stream(void* stream) = 0;
  // Enqueues on `stream` a wait for the point `event` was last recorded at.
  virtual void stream_wait(void* stream, Event& event) = 0;

  // Device memory another process of this host maps in place: what a device-to-device link
  // between processes is made of (issue 44; CUDA: SharedDeviceBuffer, reduce/cuda/runtime.h).
  struct SharedMemory {
    virtual ~SharedMemory() = default;
    virtual char* data() = 0;         // device memory
    virtual size_t size() const = 0;  // rounded up to what the device allocates in
    // A descriptor for the other process (sent over a Unix socket, SCM_RIGHTS).
    virtual core::Fd export_fd() = 0;
  };
  virtual std::unique_ptr<SharedMemory> shared_memory(size_t bytes) = 0;
  // Maps what another process exported (`fd` is not taken), of the size its size() said.
  virtual std::unique_ptr<SharedMemory> import_memory(int fd, size_t bytes) = 0;

  // Element-wise on device memory, enqueued on the stream (reduce_cuda.h's kernels): what a device
  // link reduces with. combine: dst = a (op) b; combine2 writes the result to two places at once
  // (the next rank's slot and the local output: the ring's fused step); divide: dst = src / d.
  virtual void combine(void* dst, const void* a, const void* b, size_t count, DataType type,
                       ReduceOp op, void* stream) = 0;
  virtual void combine2(void* dst0, void* dst1, const void* a, const void* b, size_t count,
                        DataType type, ReduceOp op, void* stream) = 0;
  virtual void divide(void* dst, const void* src, size_t count, DataType type, uint64_t divisor,
                      void* stream) = 0;
};

// The process's runtime: the one a test installed, else CUDA's (which, in a build without CUDA,
// is never in use).
DeviceRuntime& device_runtime();
// For tests: replaces the runtime (null: back to CUDA's). Not while communicators have ops on it.
void set_device_runtime(std::shared_ptr<DeviceRuntime> runtime);

}  // namespace ringreduce::reduce
