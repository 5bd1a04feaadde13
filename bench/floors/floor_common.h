// What the floor benchmarks share (bench/floors/latency_floor.cc, bench/floors/jitter_floor.cc,
// bench/floors/stream_copy.cc): the CPUs they may use, pinning the calling thread to one (each
// measures what pinned processes or threads can do), and their whole-number options.
#pragma once

#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

namespace bench {

// The CPUs this process may run on, in order.
inline std::vector<int> usable_cpus() {
  cpu_set_t set;
  std::vector<int> out;
  if (sched_getaffinity(0, sizeof set, &set) != 0) return out;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) out.push_back(c);
  return out;
}

// Pins the calling thread (a process's only one, or one of stream_copy's) to one CPU; false if
// the kernel refused.
inline bool pin(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  return sched_setaffinity(0, sizeof set, &set) == 0;
}

// A whole decimal number in [lo, hi], or false for anything else ("x", "4k", "", "5x").
inline bool parse_long(const char* s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  const long v = std::strtol(s, &end, 10);
  if (errno != 0 || end == s || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

}  // namespace bench
