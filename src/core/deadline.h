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
  static Deadline never() { return Deadline(Clock::time_point::max()); }
  explicit Deadline(Clock::time_point at) : at_(at) {}

  Clock::time_point at() const { return at_; }
  bool expired() const { return Clock::now() >= at_; }
  // Milliseconds left, clamped to [0, cap]: suitable for poll/epoll_wait timeouts.
  int remaining_ms(int cap = 1 << 30) const {
    if (at_ == Clock::time_point::max()) return cap;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(at_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>(left + 1, 0, cap));
  }
  Deadline earliest(const Deadline& other) const { return Deadline(std::min(at_, other.at_)); }

 private:
  Clock::time_point at_;
};

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

}  // namespace ringreduce::core
