// Logging controlled by RINGREDUCE_DEBUG (WARN by default, INFO, TRACE), RINGREDUCE_DEBUG_SUBSYS
// (which subsystems' INFO and TRACE lines appear; warnings always do, as NCCL's) and
// RINGREDUCE_DEBUG_FILE (where lines go; %h: hostname, %p: pid; default stderr). Every line
// carries the wall-clock time, host, pid and rank, so that interleaved output from many processes
// can be untangled and lined up with other logs:
//   "[ringreduce 2026-11-27 18:35:33.123456 host1:4242 rank 3] WARN stall: ..."
#pragma once

#include <cstdint>
#include <sstream>
#include <string>

namespace ringreduce::core {

enum class LogLevel { warn = 0, info = 1, trace = 2 };

// The code's layers as a log sees them: every RR_LOG names one. RINGREDUCE_DEBUG_SUBSYS spells
// them in lower or upper case (kLogSubsysNames).
enum class LogSubsys : uint32_t {
  init = 0,   // start-up: launch, settings, version, communicator ready
  coll = 1,   // collective calls (their trace lines, failures)
  p2p = 2,    // point-to-point sends and receives
  net = 3,    // the TCP transport
  shm = 4,    // the shared-memory transport
  store = 5,  // the rendezvous store (server and client)
  tune = 6,   // the tuner and the start-up probes
  stall = 7,  // stall reports
  env = 8,    // settings and environment (unknown RINGREDUCE_* variables)
  ft = 9,     // fault tolerance: agreement, shrink, the control plane
};
inline constexpr int kNumLogSubsys = 10;
extern const char* const kLogSubsysNames[kNumLogSubsys];

// Current level, read from the environment on first use.
LogLevel log_level();
// Overrides the level (a Communicator built with an explicit RINGREDUCE_DEBUG option does this).
void set_log_level(LogLevel level);
bool parse_log_level(const std::string& text, LogLevel* out);

// The subsystems whose INFO and TRACE lines are shown, one bit each (RINGREDUCE_DEBUG_SUBSYS,
// read on first use; default all). Like NCCL_DEBUG_SUBSYS: "init,coll", "ALL", "^net,shm" (all
// but). Returns false on an unknown name (`error` says which and lists the known ones).
bool parse_log_subsys(const std::string& text, uint32_t* mask, std::string* error);
uint32_t log_subsys_mask();
void set_log_subsys_mask(uint32_t mask);

inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}
inline bool log_enabled(LogLevel level, LogSubsys subsys) {
  return log_enabled(level) &&
         (level == LogLevel::warn || (log_subsys_mask() >> static_cast<uint32_t>(subsys)) & 1u);
}

// RINGREDUCE_DEBUG_FILE's pattern with %h (hostname), %p (pid) and %% replaced.
std::string expand_log_path(const std::string& pattern, const std::string& host, long pid);
// Sends later lines to `path` (appended; "" : stderr again). Tests use it; otherwise the file is
// RINGREDUCE_DEBUG_FILE's, opened by the first line.
void set_log_file(const std::string& path);

// rank < 0 means "not yet known".
void log_line(LogLevel level, int rank, const std::string& message);

// The hostname (gethostname), read once.
const std::string& host_name();

// Concatenates anything streamable: cat("rank ", r, ": ", what).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace ringreduce::core

// RR_LOG(info, init, rank, "launched by ", launcher): formats only when the level is on and the
// subsystem shown.
#define RR_LOG(level, subsys, rank, ...)                                        \
  do {                                                                          \
    if (::ringreduce::core::log_enabled(::ringreduce::core::LogLevel::level,    \
                                        ::ringreduce::core::LogSubsys::subsys)) \
      ::ringreduce::core::log_line(::ringreduce::core::LogLevel::level, (rank), \
                                   ::ringreduce::core::cat(__VA_ARGS__));       \
  } while (0)
