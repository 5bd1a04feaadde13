// RINGREDUCE_TIMELINE: a per-rank trace of what the communicator does, in Chrome's Trace Event
// Format (JSON array form), which chrome://tracing and Perfetto open; tools/ringreduce-timeline
// merges the ranks' files into one.
//
// What it records, each a Complete ("X") event on the thread that did it (pid = rank, tid = the
// thread's id):
//   op     every collective, named as the call (allreduce, broadcast, ...), with its sequence
//          number, size (bytes, count, dtype), op, root and the tuner's plan ("ring seg=512K
//          ch=1 sliced");
//   phase  the parts an algorithm marks with Context::phase (the ring's reduce-scatter and
//          allgather, ...);
//   wait   a stretch of the progress engine in which nothing moved, and the peer it waited for
//          where the engine can tell ("wait rank 1");
// and point-to-point sends and receives as async ("b"/"e") spans, since they overlap each other.
//
// Clock: CLOCK_MONOTONIC in microseconds. It is one clock for every process of a host (time
// since boot), so the ranks of a host line up without any correction, and it never steps when
// NTP adjusts the wall clock mid-run. Across hosts it means nothing: every file's process_name
// event carries `realtime_minus_monotonic_us`, which the merge tool adds with --clock realtime.
//
// Cost: off, nothing is created and every hook is one test of a null pointer. On, events are
// formatted into a 64 KiB buffer that is written out when full, at least every half second from
// the op path, when the communicator aborts and when it is destroyed: memory stays bounded
// however long the run. The file is a JSON array whose closing "]" is written at destruction; a
// process killed before that leaves a file that the Trace Event Format still accepts (the "]" is
// optional there), and that the merge tool reads.
#pragma once

#include <cstdint>
#include <mutex>
#include <string>
#include <string_view>

#include "core/fd.h"

namespace ringreduce::core {

class Timeline {
 public:
  // Opens the file for `rank` named by `pattern` (file_name()); throws Error naming the setting
  // when it cannot be created. `comm_index` counts the communicators of this process that opened
  // a timeline before this one (splits, torch's groups): each gets a file of its own.
  Timeline(const std::string& pattern, int rank, int size, int comm_index);
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // The file for `rank`: %r, %h, %p and %% replaced; without %r, ".<rank>.json" is appended
  // (after removing a ".json" the pattern ends with). The comm_index-th further communicator of
  // a process adds ".comm<k>" before ".json".
  static std::string file_name(const std::string& pattern, int rank, const std::string& host,
                               long pid, int comm_index);
  // CLOCK_MONOTONIC, microseconds.
  static double now_us();
  const std::string& path() const { return path_; }

  // A Complete event on the calling thread; args_json: the members of its args object, without
  // braces ("\"seq\":3,\"peer\":1"), or empty.
  void complete(std::string_view cat, std::string_view name, double begin_us, double end_us,
                std::string_view args_json);
  // An async span (point-to-point): "b" at begin, "e" at end, matched by id.
  void async_span(std::string_view cat, std::string_view name, uint64_t id, double begin_us,
                  double end_us, std::string_view args_json);

  // The running collective (called by whoever drives it; one at a time): phases and waits
  // recorded meanwhile carry its sequence number.
  void op_begin(uint64_t seq) {
    op_seq_ = seq;
    phase_ = nullptr;
  }
  // Ends the running phase (if any) now and begins `name` (a string literal).
  void phase(const char* name);
  // Ends the running phase; returns the op's sequence number (later waits carry 0).
  uint64_t op_end();
  // The engine found nothing to do from begin_us to end_us, waiting for `peer` (-1: unknown);
  // slept: it slept in epoll_wait at least once.
  void wait(double begin_us, double end_us, int peer, bool slept);

  // Writes out what is buffered (an abort does, so that the file holds the events before it).
  void flush();

 private:
  void event_locked(char ph, std::string_view cat, std::string_view name, double ts,
                    const double* dur, const uint64_t* id, std::string_view args_json);
  void flush_locked();

  std::mutex mu_;
  Fd fd_;
  std::string path_;
  std::string buf_;
  int rank_;
  double last_flush_us_ = 0;
  // The running op (driver only).
  uint64_t op_seq_ = 0;
  const char* phase_ = nullptr;
  double phase_begin_us_ = 0;
};

}  // namespace ringreduce::core
