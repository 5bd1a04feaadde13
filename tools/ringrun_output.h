// ringrun's output: its own stdout and stderr (Sink), and the ranks' streams, which come back
// through pipes and leave ringrun one whole line at a time with the rank's prefix (pump). Apart
// from ringrun.cc, which launches and watches the ranks.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include "core/fd.h"

namespace ringrun {

// A pipe whose ends are close-on-exec: a rank must hold no end but its own, or another rank's
// stdout would never reach EOF.
void make_pipe(ringreduce::core::Fd* read_end, ringreduce::core::Fd* write_end);

// ringrun's own stdout or stderr. Writes block until done: the consumer's pace is the job's pace.
// A consumer that went away (EPIPE) just stops receiving output; the job is not disturbed.
class Sink {
 public:
  explicit Sink(int fd) : fd_(fd) {}
  void write(std::string_view data);

 private:
  int fd_;
  bool broken_ = false;
};

extern Sink g_out;
extern Sink g_err;

// "ringrun: message" on ringrun's stderr.
void say(const std::string& message);
// "0-3,5,7-8": a compact list of ranks, which matters with 1024 of them.
std::string rank_list(const std::vector<int>& ranks);
std::string signal_name(int sig);

// One of a rank's two output streams: the pipe's read end and the partial line not yet emitted.
struct Stream {
  ringreduce::core::Fd fd;
  std::string pending;
  Sink* sink = nullptr;
};

// What one pump() found: more may follow at once, nothing to read now, or the stream's end.
enum class Pump { more, drained, eof };

// Reads once from a stream and emits every whole line with its prefix in a single write. Reads
// go through one shared buffer and only a partial line stays with the stream, so 2048 mostly idle
// streams cost next to nothing.
Pump pump(Stream& s, const std::string& prefix);

}  // namespace ringrun
