#include "core/log.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>

#include "core/config.h"

namespace ringreduce::core {
namespace {

std::atomic<int> g_level{-1};

const std::string& hostname() {
  static const std::string name = [] {
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return name;
}

}  // namespace

bool parse_log_level(const std::string& text, LogLevel* out) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (t == "WARN" || t == "WARNING" || t.empty())
    *out = LogLevel::warn;
  else if (t == "INFO")
    *out = LogLevel::info;
  else if (t == "TRACE" || t == "DEBUG")
    *out = LogLevel::trace;
  else
    return false;
  return true;
}

LogLevel log_level() {
  int l = g_level.load(std::memory_order_relaxed);
  if (l < 0) {
    LogLevel parsed = LogLevel::warn;
    if (auto e = env("RINGREDUCE_DEBUG")) {
      if (!parse_log_level(*e, &parsed))
        std::fprintf(stderr, "ringreduce: RINGREDUCE_DEBUG='%s' is not WARN, INFO or TRACE\n",
                     e->c_str());
    }
    l = static_cast<int>(parsed);
    g_level.store(l, std::memory_order_relaxed);
  }
  return static_cast<LogLevel>(l);
}

void set_log_level(LogLevel level) {
  g_level.store(static_cast<int>(level));
}

void log_line(LogLevel level, int rank, const std::string& message) {
  static const char* kNames[] = {"WARN", "INFO", "TRACE"};
  std::string line = "[ringreduce " + hostname() + ":" + std::to_string(getpid());
  if (rank >= 0) line += " rank " + std::to_string(rank);
  line += "] ";
  line += kNames[static_cast<int>(level)];
  line += ' ';
  line += message;
  if (line.back() != '\n') line += '\n';
  // One write per line so lines from threads and processes do not interleave mid-line.
  ssize_t ignored = ::write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace ringreduce::core
