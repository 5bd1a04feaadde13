// What the fault and soak ranks check about their own process after a communicator is gone: open
// descriptors and threads (from /proc/self), and a wall clock all ranks on one machine share.
#pragma once

#include <dirent.h>

#include <chrono>
#include <cstring>
#include <string>

namespace rrtest {

// Entries of a /proc/self directory ("fd", "task"), not counting the descriptor that reads it.
inline int proc_self_entries(const char* what) {
  const std::string dir = std::string("/proc/self/") + what;
  int n = 0;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') ++n;
    closedir(d);
  }
  return n - (std::strcmp(what, "fd") == 0 ? 1 : 0);
}
inline int open_fds() {
  return proc_self_entries("fd");
}
inline int thread_count() {
  return proc_self_entries("task");
}

// Seconds since the epoch: the moment of a fault is agreed across processes on one clock.
inline double wall_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace rrtest
