// The CPUs a floor benchmark may use and pinning the calling thread to one (bench/latency_floor.cc,
// bench/jitter_floor.cc, bench/stream_copy.cc): each measures what pinned processes or threads
// can do.
#pragma once

#include <sched.h>

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

}  // namespace bench
