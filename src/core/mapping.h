// An mmap'd region, unmapped on destruction (RAII, as core::Fd for descriptors): the shared-memory
// transport's segments and regions, and the communicator's private alloc() memory.
#pragma once

#include <sys/mman.h>

#include <cstddef>
#include <utility>

namespace ringreduce::core {

class Mapping {
 public:
  Mapping() = default;
  Mapping(void* p, size_t n) : p_(p), n_(n) {}
  ~Mapping() {
    if (p_) munmap(p_, n_);
  }
  Mapping(Mapping&& o) noexcept : p_(std::exchange(o.p_, nullptr)), n_(o.n_) {}
  Mapping& operator=(Mapping&& o) noexcept {
    if (this != &o) {
      if (p_) munmap(p_, n_);
      p_ = std::exchange(o.p_, nullptr);
      n_ = o.n_;
    }
    return *this;
  }
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  void* get() const { return p_; }
  size_t size() const { return n_; }
  // The mapping's start as a T (a layout's header).
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }

 private:
  void* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace ringreduce::core
