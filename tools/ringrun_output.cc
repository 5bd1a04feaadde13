#include "ringrun_output.h"

#include <fcntl.h>
#include <poll.h>
#include <string.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace ringrun {

namespace {

constexpr size_t kReadChunk = 64 * 1024;
// A "line" longer than this is emitted in pieces, each with its prefix, so memory stays bounded
// whatever a rank writes.
constexpr size_t kMaxLine = 64 * 1024;

}  // namespace

void make_pipe(ringreduce::core::Fd* read_end, ringreduce::core::Fd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  *read_end = ringreduce::core::Fd(fds[0]);
  *write_end = ringreduce::core::Fd(fds[1]);
}

void Sink::write(std::string_view data) {
  while (!data.empty() && !broken_) {
    ssize_t n = ::write(fd_, data.data(), data.size());
    if (n > 0) {
      data.remove_prefix(static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else if (n < 0 && errno == EAGAIN) {
      // Someone made the shared file description non-blocking; wait for room instead.
      pollfd p{fd_, POLLOUT, 0};
      ::poll(&p, 1, -1);
    } else {
      broken_ = true;
    }
  }
}

Sink g_out(STDOUT_FILENO);
Sink g_err(STDERR_FILENO);

void say(const std::string& message) {
  g_err.write("ringrun: " + message + "\n");
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (size_t i = 0; i < ranks.size();) {
    size_t j = i;
    while (j + 1 < ranks.size() && ranks[j + 1] == ranks[j] + 1) ++j;
    if (!s.empty()) s += ',';
    s += std::to_string(ranks[i]);
    if (j > i) s += '-' + std::to_string(ranks[j]);
    i = j + 1;
  }
  return s;
}

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev != nullptr ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

Pump pump(Stream& s, const std::string& prefix) {
  static char buf[kReadChunk];
  ssize_t n = ::read(s.fd.get(), buf, sizeof(buf));
  if (n < 0 && (errno == EAGAIN || errno == EINTR)) return Pump::drained;
  bool eof = n <= 0;  // 0: EOF; other errors: treat the stream as gone
  std::string_view data(buf, eof ? 0 : static_cast<size_t>(n));

  std::string batch;
  for (size_t nl = data.find('\n'); nl != std::string_view::npos; nl = data.find('\n')) {
    batch.append(prefix).append(s.pending).append(data.substr(0, nl + 1));
    s.pending.clear();
    data.remove_prefix(nl + 1);
  }
  s.pending.append(data);
  if ((eof && !s.pending.empty()) || s.pending.size() >= kMaxLine) {
    // A last line without newline, or a runaway one: emit it as a line of its own so that the
    // next line of any rank still starts at the beginning of a line.
    batch.append(prefix).append(s.pending).push_back('\n');
    s.pending.clear();
  }
  if (s.pending.empty() && s.pending.capacity() > 4096) std::string().swap(s.pending);
  if (!batch.empty()) s.sink->write(batch);
  if (eof) {
    s.fd.reset();
    return Pump::eof;
  }
  return Pump::more;
}

}  // namespace ringrun
