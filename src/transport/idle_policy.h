// When a waiter that finds nothing to do should stop polling and sleep. Shared by the engines
// that poll shared memory (ShmTransport, HybridTransport).
//
// With no more ranks than cores, poll for spin_us and then sleep: a sleeping thread costs tens of
// µs to wake. With more ranks than cores, yield at once, and sleep after max_idle_yields yields
// in a row found nothing: counted in yields, not time, because a yield that lets a co-located
// rank work is the point and must not count as idle, and because sched_yield may return at once
// while that rank is runnable (the scheduler finds it not yet eligible), so a waiter that only
// yielded could keep the core from the very rank it waits for.
#pragma once

#include <sched.h>

#include <chrono>

#include "core/deadline.h"

namespace ringreduce::transport {

class IdlePolicy {
 public:
  IdlePolicy(bool oversubscribed, int max_idle_yields, int spin_us)
      : oversubscribed_(oversubscribed),
        max_idle_yields_(max_idle_yields),
        spin_(std::chrono::microseconds(spin_us)),
        spin_until_(core::Clock::now() + spin_) {}

  // After a pass that moved something (or not): true when it is time to sleep.
  bool should_sleep(bool moved) {
    if (oversubscribed_) {
      if (moved) {
        idle_yields_ = 0;
        return false;
      }
      if (idle_yields_++ < max_idle_yields_) {
        sched_yield();
        return false;
      }
      idle_yields_ = 0;
      return true;
    }
    const auto now = core::Clock::now();
    if (moved) {
      spin_until_ = now + spin_;
      return false;
    }
    return now >= spin_until_;
  }

 private:
  bool oversubscribed_;
  int max_idle_yields_;
  core::Clock::duration spin_;
  core::Clock::time_point spin_until_;
  int idle_yields_ = 0;
};

}  // namespace ringreduce::transport
