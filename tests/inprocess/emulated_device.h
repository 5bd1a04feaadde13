// An emulated device for the tests of device memory (device_test.cc): "device memory" is address
// space the host cannot touch (PROT_NONE; a host access to it crashes the test), backed by host
// memory only the emulated streams' copies reach, and a stream is a worker thread running its
// tasks in order. Shared memory (DeviceRuntime::SharedMemory, CUDA's VMM export and import) is a
// memfd behind a device range, so two emulated devices in one process stand for two processes.
#pragma once

#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <iostream>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "comm/device.h"
#include "core/fd.h"
#include "reduce/reduce.h"
#include "ringreduce/error.h"

namespace rrtest {

using ringreduce::detail::DeviceRuntime;
namespace core = ringreduce::core;

// A stream: tasks run in order on a thread of its own. A gate holds it, as a long kernel would.
class Stream {
 public:
  Stream() : thread_([this] { loop(); }) {}
  ~Stream() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      stop_ = true;
      open_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void enqueue(std::function<void()> task) {
    {
      std::lock_guard<std::mutex> lk(mu_);
      tasks_.push_back(std::move(task));
    }
    cv_.notify_all();
  }
  // Every task enqueued so far has run.
  void synchronize() {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return tasks_.empty() && !running_; });
  }
  // A task that waits until open() (or the stream's end).
  void gate() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = false;
    }
    enqueue([this] {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return open_; });
    });
  }
  void open() {
    {
      std::lock_guard<std::mutex> lk(mu_);
      open_ = true;
    }
    cv_.notify_all();
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lk(mu_);
    for (;;) {
      cv_.wait(lk, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      auto task = std::move(tasks_.front());
      tasks_.pop_front();
      running_ = true;
      lk.unlock();
      task();
      lk.lock();
      running_ = false;
      cv_.notify_all();
    }
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool running_ = false, stop_ = false, open_ = true;
  std::thread thread_;
};

class EmulatedDevice final : public DeviceRuntime {
 public:
  static constexpr size_t kSpace = size_t{1} << 30;

  EmulatedDevice() {
    void* p = mmap(nullptr, kSpace, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::runtime_error("mmap");
    base_ = static_cast<char*>(p);
    backing_ = static_cast<char*>(mmap(nullptr, kSpace, PROT_READ | PROT_WRITE,
                                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0));
  }
  ~EmulatedDevice() override {
    munmap(base_, kSpace);
    munmap(backing_, kSpace);
  }

  // "cudaMalloc": address space the host cannot touch.
  char* alloc(size_t bytes) {
    std::lock_guard<std::mutex> lk(mu_);
    char* p = base_ + next_;
    next_ += (std::max<size_t>(bytes, 1) + 255) / 256 * 256;
    if (next_ > kSpace) throw std::runtime_error("emulated device out of memory");
    return p;
  }
  template <class T>
  T* alloc_of(size_t n) {
    return reinterpret_cast<T*>(alloc(n * sizeof(T)));
  }
  // The host's view of device memory, for the test to fill and read (never the library's).
  template <class T>
  T* view(T* device) {
    return reinterpret_cast<T*>(translate(reinterpret_cast<char*>(device)));
  }
  Stream& default_stream() { return default_; }
  size_t host_allocations() const { return host_allocations_.load(); }
  // Waits on a host flag enqueued so far: one per piece a call is staged in.
  size_t value_waits() const { return value_waits_.load(); }

  bool in_use() override { return true; }
  bool is_device(const void* p) override {
    const auto* c = static_cast<const char*>(p);
    return c >= base_ && c < base_ + kSpace;
  }
  std::unique_ptr<HostMemory> host_memory(size_t bytes) override {
    ++host_allocations_;
    struct Mem final : HostMemory {
      explicit Mem(size_t n) : bytes(n) {}
      char* data() override { return bytes.data(); }
      std::vector<char> bytes;
    };
    return std::make_unique<Mem>(bytes);
  }
  struct Ev final : Event {
    explicit Ev(EmulatedDevice& d) : dev(d) {}
    void record(void* stream) override {
      auto state = std::make_shared<std::atomic<bool>>(false);
      current = state;
      dev.stream(stream).enqueue([state] { state->store(true); });
    }
    bool done() override { return !current || current->load(); }
    EmulatedDevice& dev;
    std::shared_ptr<std::atomic<bool>> current;
  };
  std::unique_ptr<Event> event() override { return std::make_unique<Ev>(*this); }
  void* create_stream() override { return new Stream; }
  void destroy_stream(void* s) override { delete static_cast<Stream*>(s); }
  void stream_wait(void* s, Event& event) override {
    auto state = static_cast<Ev&>(event).current;
    if (!state) return;
    stream(s).enqueue([state] {
      while (!state->load()) std::this_thread::sleep_for(std::chrono::microseconds(20));
    });
  }
  void copy(void* dst, const void* src, size_t bytes, void* s) override {
    if (bytes == 0) return;
    char* d = translate(static_cast<char*>(dst));
    const char* from = translate(const_cast<char*>(static_cast<const char*>(src)));
    stream(s).enqueue([=] { std::memcpy(d, from, bytes); });
  }
  // Shared memory as CUDA's VMM gives it (SharedDeviceBuffer): whole granules, exported as a
  // descriptor; here a memfd, which the "device" range maps through, so that a copy into one
  // process's range is seen in another's that imported it.
  static constexpr size_t kGranule = size_t{2} << 20;  // CUDA's usual minimum granularity
  struct Shared final : SharedMemory {
    Shared(EmulatedDevice& d, core::Fd f, size_t n) : dev(d), fd(std::move(f)), bytes(n) {
      host =
          static_cast<char*>(mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd.get(), 0));
      if (host == MAP_FAILED) throw std::runtime_error("mmap of a shared granule");
      device = dev.alloc(bytes);
      std::lock_guard<std::mutex> lk(dev.mu_);
      dev.shared_[device] = {bytes, host};
    }
    ~Shared() override {
      {
        std::lock_guard<std::mutex> lk(dev.mu_);
        dev.shared_.erase(device);
      }
      munmap(host, bytes);
    }
    char* data() override { return device; }
    size_t size() const override { return bytes; }
    core::Fd export_fd() override { return core::Fd(dup(fd.get())); }
    EmulatedDevice& dev;
    core::Fd fd;
    size_t bytes;
    char* host = nullptr;
    char* device = nullptr;
  };
  std::unique_ptr<SharedMemory> shared_memory(size_t bytes) override {
    const size_t n = (std::max<size_t>(bytes, 1) + kGranule - 1) / kGranule * kGranule;
    core::Fd fd(memfd_create("emulated-device", MFD_CLOEXEC));
    if (!fd.valid() || ftruncate(fd.get(), static_cast<off_t>(n)) != 0)
      throw std::runtime_error("memfd");
    return std::make_unique<Shared>(*this, std::move(fd), n);
  }
  std::unique_ptr<SharedMemory> import_memory(int fd, size_t bytes) override {
    struct stat st {};
    // What cuMemImportFromShareableHandle and cuMemMap refuse: a size that is not the export's.
    if (fstat(fd, &st) != 0 || bytes == 0 || bytes % kGranule != 0 ||
        static_cast<size_t>(st.st_size) != bytes)
      throw ringreduce::Error("emulated device: an import of " + std::to_string(bytes) +
                              " bytes that is not the exported size");
    return std::make_unique<Shared>(*this, core::Fd(dup(fd)), bytes);
  }
  // The kernels: the host's own, on the stream's thread, through the device ranges' backing.
  void combine(void* dst, const void* a, const void* b, size_t count, ringreduce::DataType type,
               ringreduce::ReduceOp op, void* s) override {
    combine2(dst, nullptr, a, b, count, type, op, s);
  }
  void combine2(void* dst0, void* dst1, const void* a, const void* b, size_t count,
                ringreduce::DataType type, ringreduce::ReduceOp op, void* s) override {
    if (count == 0) return;
    ++kernels_;
    char* d0 = translate(static_cast<char*>(dst0));
    char* d1 = dst1 ? translate(static_cast<char*>(dst1)) : nullptr;
    const char* x = translate(const_cast<char*>(static_cast<const char*>(a)));
    const char* y = translate(const_cast<char*>(static_cast<const char*>(b)));
    const size_t bytes = count * ringreduce::dtype_size(type);
    stream(s).enqueue([=] {
      ringreduce::reduce::combine(d0, x, y, count, type, op);
      if (d1) std::memcpy(d1, d0, bytes);
    });
  }
  void divide(void* dst, const void* src, size_t count, ringreduce::DataType type, uint64_t divisor,
              void* s) override {
    if (count == 0) return;
    char* d = translate(static_cast<char*>(dst));
    const char* from = translate(const_cast<char*>(static_cast<const char*>(src)));
    stream(s).enqueue([=] { ringreduce::reduce::divide(d, from, count, type, divisor); });
  }
  // Kernels enqueued so far (combine, combine2): what a device link runs instead of staging.
  size_t kernels() const { return kernels_.load(); }

  void wait_value(void* s, const uint32_t* flag, uint32_t value) override {
    ++value_waits_;
    stream(s).enqueue([flag, value] {
      std::atomic_ref<const uint32_t> f(*flag);
      // Bounded, so that a staging bug fails the test instead of hanging it.
      const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (static_cast<int32_t>(f.load(std::memory_order_acquire) - value) < 0) {
        if (std::chrono::steady_clock::now() > until) {
          std::cerr << "emulated stream: the flag was never released\n";
          std::abort();
        }
        std::this_thread::sleep_for(std::chrono::microseconds(20));
      }
    });
  }

 private:
  Stream& stream(void* s) { return s ? *static_cast<Stream*>(s) : default_; }
  char* translate(char* p) {
    if (!is_device(p)) return p;
    std::lock_guard<std::mutex> lk(mu_);
    // A shared range (the last one starting at or before p) maps through its memfd.
    auto it = shared_.upper_bound(p);
    if (it != shared_.begin() && p < std::prev(it)->first + std::prev(it)->second.first)
      return std::prev(it)->second.second + (p - std::prev(it)->first);
    return backing_ + (p - base_);
  }

  std::mutex mu_;
  std::map<char*, std::pair<size_t, char*>> shared_;  // device start -> (bytes, host mapping)
  char* base_ = nullptr;
  char* backing_ = nullptr;
  size_t next_ = 0;
  std::atomic<size_t> host_allocations_{0};
  std::atomic<size_t> value_waits_{0};
  std::atomic<size_t> kernels_{0};
  Stream default_;
};

}  // namespace rrtest
