// Logging controlled by RINGREDUCE_DEBUG (WARN by default, INFO, TRACE). Every line carries host,
// pid and rank so interleaved output from many processes can be untangled:
//   "[ringreduce host1:4242 rank 3] WARN stall: ..."
#pragma once

#include <sstream>
#include <string>

namespace ringreduce::core {

enum class LogLevel { warn = 0, info = 1, trace = 2 };

// Current level, read from the environment on first use.
LogLevel log_level();
// Overrides the level (a Communicator built with an explicit RINGREDUCE_DEBUG option does this).
void set_log_level(LogLevel level);
bool parse_log_level(const std::string& text, LogLevel* out);
inline bool log_enabled(LogLevel level) {
  return static_cast<int>(level) <= static_cast<int>(log_level());
}

// rank < 0 means "not yet known".
void log_line(LogLevel level, int rank, const std::string& message);

// Concatenates anything streamable: cat("rank ", r, ": ", what).
template <typename... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}

}  // namespace ringreduce::core

#define RR_LOG(level, rank, ...)                                                \
  do {                                                                          \
    if (::ringreduce::core::log_enabled(::ringreduce::core::LogLevel::level))   \
      ::ringreduce::core::log_line(::ringreduce::core::LogLevel::level, (rank), \
                                   ::ringreduce::core::cat(__VA_ARGS__));       \
  } while (0)
