// CUDA's device runtime (device_runtime.h), and the process's choice of runtime.
#include "reduce/device_runtime.h"

#include <atomic>
#include <mutex>

#include "reduce/cuda/reduce_cuda.h"
#include "reduce/cuda/runtime.h"

namespace ringreduce::reduce {
namespace {

// CUDA's runtime (reduce/cuda/runtime.h). In a build without CUDA in_use() is false, so nothing
// else is ever called.
class CudaRuntime final : public DeviceRuntime {
  struct Pinned final : HostMemory {
    explicit Pinned(size_t bytes) : buffer(bytes) {}
    char* data() override { return buffer.data(); }
    cuda::PinnedBuffer buffer;
  };
  struct CudaEvent final : Event {
    void record(void* stream) override { event.record(stream); }
    bool done() override { return event.done(); }
    cuda::Event event;
  };
  struct Shared final : SharedMemory {
    explicit Shared(std::unique_ptr<cuda::SharedDeviceBuffer> b) : buffer(std::move(b)) {}
    char* data() override { return buffer->data(); }
    size_t size() const override { return buffer->size(); }
    core::Fd export_fd() override { return core::Fd(buffer->export_fd()); }
    std::unique_ptr<cuda::SharedDeviceBuffer> buffer;
  };

 public:
  bool in_use() override { return cuda::in_use(); }
  bool is_device(const void* p) override { return cuda::is_device_pointer(p); }
  std::unique_ptr<HostMemory> host_memory(size_t bytes) override {
    return std::make_unique<Pinned>(bytes);
  }
  std::unique_ptr<Event> event() override { return std::make_unique<CudaEvent>(); }
  void copy(void* dst, const void* src, size_t bytes, void* stream) override {
    cuda::copy_async(dst, src, bytes, stream);
  }
  void wait_value(void* stream, const uint32_t* flag, uint32_t value) override {
    cuda::wait_value(stream, flag, value);
  }
  int current_device() override { return cuda::current_device(); }
  void set_current_device(int device) override { cuda::set_current_device(device); }
  void* create_stream() override { return cuda::create_stream(); }
  void destroy_stream(void* stream) override { cuda::destroy_stream(stream); }
  void stream_wait(void* stream, Event& event) override {
    static_cast<CudaEvent&>(event).event.wait_on(stream);
  }
  std::unique_ptr<SharedMemory> shared_memory(size_t bytes) override {
    return std::make_unique<Shared>(cuda::SharedDeviceBuffer::create(bytes));
  }
  std::unique_ptr<SharedMemory> import_memory(int fd, size_t bytes) override {
    return std::make_unique<Shared>(cuda::SharedDeviceBuffer::import(fd, bytes));
  }
  void combine(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op,
               void* stream) override {
    cuda::combine(dst, a, b, count, type, op, stream);
  }
  void combine2(void* dst0, void* dst1, const void* a, const void* b, size_t count, DataType type,
                ReduceOp op, void* stream) override {
    cuda::combine2(dst0, dst1, a, b, count, type, op, stream);
  }
  void divide(void* dst, const void* src, size_t count, DataType type, uint64_t divisor,
              void* stream) override {
    cuda::divide(dst, src, count, type, divisor, stream);
  }
};

// A test's runtime, else null (CUDA's). Read on every call's path: an atomic, not a lock.
std::atomic<DeviceRuntime*> g_override{nullptr};
std::mutex g_override_mu;
std::shared_ptr<DeviceRuntime> g_override_owner;  // keeps g_override alive (g_override_mu)

}  // namespace

DeviceRuntime& device_runtime() {
  static CudaRuntime cuda;
  DeviceRuntime* o = g_override.load(std::memory_order_acquire);
  return o ? *o : static_cast<DeviceRuntime&>(cuda);
}

void set_device_runtime(std::shared_ptr<DeviceRuntime> runtime) {
  std::lock_guard<std::mutex> lk(g_override_mu);
  g_override.store(runtime.get(), std::memory_order_release);
  g_override_owner = std::move(runtime);
}

}  // namespace ringreduce::reduce
