#include "core/timeline.h"

#include <fcntl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <utility>

#include "ringreduce/error.h"
#include "ringreduce/version.h"

namespace ringreduce::core {
namespace {

constexpr size_t kBufferBytes = 64 << 10;
// Written out at least this often from the op path, so that a process killed mid-run leaves a
// file with its recent past in it; a write per op would cost a small allreduce a third.
constexpr double kFlushEveryUs = 500e3;

double clock_us(clockid_t id) {
  timespec t{};
  clock_gettime(id, &t);
  return static_cast<double>(t.tv_sec) * 1e6 + static_cast<double>(t.tv_nsec) / 1e3;
}

long thread_id() {
  thread_local const long tid = static_cast<long>(::syscall(SYS_gettid));
  return tid;
}

void append_escaped(std::string& out, std::string_view s) {
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\u%04x", static_cast<unsigned>(c));
      out += hex;
    } else {
      out += c;
    }
  }
}

void append_number(std::string& out, double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3f", v);
  out += text;
}

}  // namespace

double Timeline::now_us() {
  return clock_us(CLOCK_MONOTONIC);
}

std::string Timeline::file_name(const std::string& pattern, int rank, const std::string& host,
                                long pid, int comm_index) {
  std::string out;
  bool has_rank = false;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] != '%' || i + 1 == pattern.size()) {
      out += pattern[i];
      continue;
    }
    const char c = pattern[++i];
    if (c == 'r') {
      out += std::to_string(rank);
      has_rank = true;
    } else if (c == 'h') {
      out += host;
    } else if (c == 'p') {
      out += std::to_string(pid);
    } else if (c == '%') {
      out += '%';
    } else {
      out += {'%', c};
    }
  }
  const bool json = out.size() >= 5 && out.compare(out.size() - 5, 5, ".json") == 0;
  if (json) out.resize(out.size() - 5);
  if (!has_rank) out += "." + std::to_string(rank);
  if (comm_index > 0) out += ".comm" + std::to_string(comm_index);
  return out + ".json";
}

Timeline::Timeline(const std::string& pattern, int rank, int size, int comm_index) : rank_(rank) {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) host[0] = '?';
  path_ = file_name(pattern, rank, host, getpid(), comm_index);
  fd_.reset(::open(path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd_.valid())
    throw InvalidArgument("rank " + std::to_string(rank) +
                          ": RINGREDUCE_TIMELINE: cannot create '" + path_ + "': " + errno_text());
  buf_.reserve(kBufferBytes + 4096);
  // The process's name and order, and what the merge tool needs to line files up.
  const double mono = now_us();
  const double offset = clock_us(CLOCK_REALTIME) - mono;
  buf_ += "[\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
          ",\"tid\":0,\"args\":{\"name\":\"rank " + std::to_string(rank);
  if (comm_index > 0) buf_ += " (comm " + std::to_string(comm_index) + ")";
  buf_ += "\",\"rank\":" + std::to_string(rank) + ",\"size\":" + std::to_string(size) +
          ",\"comm\":" + std::to_string(comm_index) + ",\"host\":\"";
  append_escaped(buf_, host);
  buf_ += "\",\"os_pid\":" + std::to_string(getpid()) + ",\"clock\":\"CLOCK_MONOTONIC\"," +
          "\"realtime_minus_monotonic_us\":";
  append_number(buf_, offset);
  buf_ += ",\"version\":\"" RINGREDUCE_VERSION_STRING "\"}},\n";
  buf_ += "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
          ",\"tid\":0,\"args\":{\"sort_index\":" + std::to_string(rank) + "}},\n";
  last_flush_us_ = mono;
  std::lock_guard<std::mutex> lk(mu_);
  flush_locked();
}

Timeline::~Timeline() {
  std::lock_guard<std::mutex> lk(mu_);
  // The last event has no comma after it, so the file is strict JSON as well.
  buf_ += "{\"name\":\"trace_end\",\"ph\":\"i\",\"s\":\"p\",\"pid\":" + std::to_string(rank_) +
          ",\"tid\":" + std::to_string(thread_id()) + ",\"ts\":";
  append_number(buf_, now_us());
  buf_ += "}\n]\n";
  flush_locked();
}

void Timeline::event_locked(char ph, std::string_view cat, std::string_view name, double ts,
                            const double* dur, const uint64_t* id, std::string_view args_json) {
  buf_ += "{\"ph\":\"";
  buf_ += ph;
  buf_ += "\",\"cat\":\"";
  buf_ += cat;
  buf_ += "\",\"name\":\"";
  append_escaped(buf_, name);
  buf_ += "\",\"pid\":";
  buf_ += std::to_string(rank_);
  buf_ += ",\"tid\":";
  buf_ += std::to_string(thread_id());
  buf_ += ",\"ts\":";
  append_number(buf_, ts);
  if (dur) {
    buf_ += ",\"dur\":";
    append_number(buf_, *dur);
  }
  if (id) {
    buf_ += ",\"id\":\"0x";
    char hex[24];
    std::snprintf(hex, sizeof hex, "%llx", static_cast<unsigned long long>(*id));
    buf_ += hex;
    buf_ += '"';
  }
  if (!args_json.empty()) {
    buf_ += ",\"args\":{";
    buf_ += args_json;
    buf_ += '}';
  }
  buf_ += "},\n";
  if (buf_.size() >= kBufferBytes) flush_locked();
}

void Timeline::complete(std::string_view cat, std::string_view name, double begin_us, double end_us,
                        std::string_view args_json) {
  const double dur = end_us > begin_us ? end_us - begin_us : 0;
  std::lock_guard<std::mutex> lk(mu_);
  event_locked('X', cat, name, begin_us, &dur, nullptr, args_json);
  if (end_us - last_flush_us_ >= kFlushEveryUs) flush_locked();
}

void Timeline::async_span(std::string_view cat, std::string_view name, uint64_t id, double begin_us,
                          double end_us, std::string_view args_json) {
  std::lock_guard<std::mutex> lk(mu_);
  event_locked('b', cat, name, begin_us, nullptr, &id, args_json);
  event_locked('e', cat, name, end_us, nullptr, &id, {});
}

void Timeline::phase(const char* name) {
  const double now = now_us();
  if (phase_) complete("phase", phase_, phase_begin_us_, now, "\"seq\":" + std::to_string(op_seq_));
  phase_ = name;
  phase_begin_us_ = now;
}

uint64_t Timeline::op_end() {
  if (phase_) {
    complete("phase", phase_, phase_begin_us_, now_us(), "\"seq\":" + std::to_string(op_seq_));
    phase_ = nullptr;
  }
  // Waits between ops (point-to-point ones, driven with no collective running) carry seq 0.
  return std::exchange(op_seq_, 0);
}

void Timeline::wait(double begin_us, double end_us, int peer, bool slept) {
  std::string args = "\"seq\":" + std::to_string(op_seq_);
  if (peer >= 0) args += ",\"peer\":" + std::to_string(peer);
  args += slept ? ",\"slept\":true" : ",\"slept\":false";
  complete("wait", peer >= 0 ? "wait rank " + std::to_string(peer) : std::string("wait"), begin_us,
           end_us, args);
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lk(mu_);
  flush_locked();
}

void Timeline::flush_locked() {
  size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_.get(), buf_.data() + done, buf_.size() - done);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      break;  // a full disk loses events, never the job
    }
    done += static_cast<size_t>(n);
  }
  buf_.clear();
  last_flush_us_ = now_us();
}

}  // namespace ringreduce::core
