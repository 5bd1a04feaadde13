// Element-wise reductions on device memory: the CUDA counterpart of reduce.h, for every
// DataType x ReduceOp, with the arithmetic of elementwise.inc (the same code the CPU kernels
// run). Every call is enqueued on the given stream (a cudaStream_t; nullptr is the legacy
// default stream) and returns without waiting for it.
//
// The header has no CUDA types, so the layers above can include it in a build without CUDA:
// there available() is false and says why, and every other call throws InvalidArgument.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ringreduce/types.h"

namespace ringreduce::reduce::cuda {

// Whether this build has the CUDA kernels and the process sees at least one device.
bool available();
// Why not, when available() is false: "built without CUDA ...", or the runtime's own error
// (no driver, no device).
std::string unavailable_reason();
// The device's name and compute capability ("NVIDIA H100 80GB HBM3, sm_90"), for reports.
std::string device_description();

// dst[i] = a[i] (op) b[i]; avg and premul_sum combine as sum, as on the CPU. dst may alias a or
// b exactly. Pointers of any alignment; 16-byte aligned ones take the vector path.
void combine(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op,
             void* stream);
// dst0[i] = dst1[i] = a[i] (op) b[i]: the ring's fused step, which writes the reduced chunk to
// the next rank's slot and to the local output in one pass.
void combine2(void* dst0, void* dst1, const void* a, const void* b, size_t count, DataType type,
              ReduceOp op, void* stream);
// dst[i] = src[i] / divisor (integers truncate toward zero); dst may alias src.
void divide(void* dst, const void* src, size_t count, DataType type, uint64_t divisor,
            void* stream);
// dst[i] = src[i] * factor, floating point only; dst may alias src.
void scale(void* dst, const void* src, size_t count, DataType type, double factor, void* stream);

// Device memory owned by one object (cudaMalloc'd on the current device), for the tests, the
// benchmark and staging.
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t bytes);
  ~DeviceBuffer();
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  void* data() const { return ptr_; }
  size_t size() const { return bytes_; }
  // Synchronous copies between this buffer (from offset) and host memory.
  void upload(const void* src, size_t bytes, size_t offset = 0);
  void download(void* dst, size_t bytes, size_t offset = 0) const;

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Waits for everything enqueued on the stream; a kernel's asynchronous error surfaces here.
void synchronize(void* stream);

// A device-to-device copy enqueued on the stream (cudaMemcpyAsync): the reference the kernels'
// bandwidth is measured against.
void copy(void* dst, const void* src, size_t bytes, void* stream);

// Device time between two points of a stream (a pair of CUDA events), for the benchmark.
class EventTimer {
 public:
  EventTimer();
  ~EventTimer();
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  void start(void* stream);
  void stop(void* stream);
  // Waits for the stop event; milliseconds between the two.
  double elapsed_ms();

 private:
  void* start_ = nullptr;
  void* stop_ = nullptr;
};

}  // namespace ringreduce::reduce::cuda
