// Deadlines: every wait in the library is bounded by one of these.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>

namespace ringreduce::core {

using Clock = std::chrono::steady_clock;

class Deadline {
 public:
  static Deadline after(std::chrono::milliseconds d) { return Deadline(Clock::now() + d); }
  // d after the first time anyone asks (at, expired, remaining_ms), for a collective whose data is
  // usually there when it first looks: reading the clock costs as much as a small allreduce.
  static Deadline after_first_use(std::chrono::milliseconds d) {
    Deadline x(Clock::time_point::max());
    x.pending_ = d;
    return x;
  }
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const {
    if (pending_.count() > 0) {
      at_ = Clock::now() + pending_;
      pending_ = std::chrono::milliseconds(0);
    }
    return at_;
  }
  bool expired() const { return Clock::now() >= at(); }
  // Milliseconds left, clamped to [0, cap]: suitable for poll/epoll_wait timeouts.
  int remaining_ms(int cap = 1 << 30) const {
    if (at() == Clock::time_point::max()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, cap));
  }
  Deadline earliest(const Deadline& other) const { return Deadline(std::min(at(), other.at())); }

 private:
  // Mutable for after_first_use: starting the clock is not a change a caller can see.
  mutable Clock::time_point at_;
  mutable std::chrono::milliseconds pending_{0};
};

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace ringreduce::core
