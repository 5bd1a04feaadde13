#include "core/log.h"

#include <fcntl.h>
#include <sys/time.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <string>

#include "core/config.h"
#include "core/fd.h"

namespace ringreduce::core {

const char* const kLogSubsysNames[kNumLogSubsys] = {"init",  "coll", "p2p",   "net", "shm",
                                                    "store", "tune", "stall", "env", "ft"};

namespace {

constexpr uint32_t kAllSubsys = (1u << kNumLogSubsys) - 1;

std::atomic<int> g_level{-1};
// Bit 31: not read yet (the mask itself never uses it).
constexpr uint32_t kUnread = 1u << 31;
std::atomic<uint32_t> g_subsys{kUnread};

// Where lines go: stderr until RINGREDUCE_DEBUG_FILE (or set_log_file) names a file. Opened by the
// first line, so a process that logs nothing creates no file. Never closed before exit: a line
// may be logged from any thread at any time, including static destruction.
struct Sink {
  std::mutex mu;
  bool resolved = false;
  int fd = STDERR_FILENO;
  Fd file;
};
Sink& sink() {
  static Sink* s = new Sink;  // leaked on purpose: see Sink
  return *s;
}

std::string upper(const std::string& text) {
  std::string t;
  for (char c : text) t += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return t;
}

// Opens path for appending; on failure says so on stderr and keeps stderr.
void open_sink_locked(Sink& s, const std::string& path) {
  s.file.reset();
  s.fd = STDERR_FILENO;
  if (path.empty()) return;
  s.file.reset(::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (s.file.valid()) {
    s.fd = s.file.get();
  } else {
    std::fprintf(stderr,
                 "ringreduce: RINGREDUCE_DEBUG_FILE: cannot open '%s' (%m); logging to stderr\n",
                 path.c_str());
  }
}

}  // namespace

const std::string& host_name() {
  static const std::string name = [] {
    char buf[256] = {};
    if (gethostname(buf, sizeof(buf) - 1) != 0) return std::string("?");
    return std::string(buf);
  }();
  return name;
}

bool parse_log_level(const std::string& text, LogLevel* out) {
  const std::string t = upper(text);
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

bool parse_log_subsys(const std::string& text, uint32_t* mask, std::string* error) {
  std::string t = text;
  const bool except = !t.empty() && t[0] == '^';
  if (except) t.erase(0, 1);
  uint32_t m = 0;
  size_t start = 0;
  while (start <= t.size()) {
    size_t end = t.find(',', start);
    if (end == std::string::npos) end = t.size();
    std::string name;
    for (size_t i = start; i < end; ++i)
      if (!std::isspace(static_cast<unsigned char>(t[i])))
        name += static_cast<char>(std::tolower(static_cast<unsigned char>(t[i])));
    start = end + 1;
    if (name.empty()) continue;
    if (name == "all") {
      m = kAllSubsys;
      continue;
    }
    int found = -1;
    for (int i = 0; i < kNumLogSubsys; ++i)
      if (name == kLogSubsysNames[i]) found = i;
    if (found < 0) {
      if (error) {
        *error = "'" + name + "' is not a subsystem (";
        for (int i = 0; i < kNumLogSubsys; ++i) *error += std::string(kLogSubsysNames[i]) + ", ";
        *error += "all; ^ before the list excludes)";
      }
      return false;
    }
    m |= 1u << found;
  }
  // An empty list means the default (everything), as an unset variable does.
  if (m == 0 && !except) m = kAllSubsys;
  *mask = except ? (kAllSubsys & ~m) : m;
  return true;
}

uint32_t log_subsys_mask() {
  uint32_t m = g_subsys.load(std::memory_order_relaxed);
  if (m & kUnread) {
    m = kAllSubsys;
    if (auto e = env("RINGREDUCE_DEBUG_SUBSYS")) {
      std::string why;
      if (!parse_log_subsys(*e, &m, &why)) {
        std::fprintf(stderr, "ringreduce: RINGREDUCE_DEBUG_SUBSYS='%s': %s; showing all\n",
                     e->c_str(), why.c_str());
        m = kAllSubsys;
      }
    }
    g_subsys.store(m, std::memory_order_relaxed);
  }
  return m;
}

void set_log_subsys_mask(uint32_t mask) {
  g_subsys.store(mask & kAllSubsys);
}

std::string expand_log_path(const std::string& pattern, const std::string& host, long pid) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == 'h')
      out += host;
    else if (c == 'p')
      out += std::to_string(pid);
    else if (c == '%')
      out += '%';
    else
      out += {'%', c};  // not ours: kept as written
  }
  return out;
}

void set_log_file(const std::string& path) {
  Sink& s = sink();
  std::lock_guard<std::mutex> lk(s.mu);
  s.resolved = true;
  open_sink_locked(s, path);
}

void log_line(LogLevel level, int rank, const std::string& message) {
  static const char* kNames[] = {"WARN", "INFO", "TRACE"};
  // Wall-clock time, to the microsecond: lines from several hosts and other programs' logs line
  // up by it (the timeline's monotonic clock does not leave the host).
  timeval tv{};
  gettimeofday(&tv, nullptr);
  tm local{};
  localtime_r(&tv.tv_sec, &local);
  char when[40];
  const size_t n = std::strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &local);
  std::snprintf(when + n, sizeof when - n, ".%06ld", static_cast<long>(tv.tv_usec));
  std::string line = "[ringreduce ";
  line += when;
  line += ' ';
  line += host_name() + ":" + std::to_string(getpid());
  if (rank >= 0) line += " rank " + std::to_string(rank);
  line += "] ";
  line += kNames[static_cast<int>(level)];
  line += ' ';
  line += message;
  if (line.back() != '\n') line += '\n';
  Sink& s = sink();
  int fd;
  {
    std::lock_guard<std::mutex> lk(s.mu);
    if (!s.resolved) {
      s.resolved = true;
      if (auto path = env("RINGREDUCE_DEBUG_FILE"); path && !path->empty())
        open_sink_locked(s, expand_log_path(*path, host_name(), getpid()));
    }
    fd = s.fd;
  }
  // One write per line (O_APPEND for a file) so lines from threads and processes do not
  // interleave mid-line.
  ssize_t ignored = ::write(fd, line.data(), line.size());
  (void)ignored;
}

}  // namespace ringreduce::core
