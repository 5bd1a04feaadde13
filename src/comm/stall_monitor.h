// The stall inspector (Horovod's is the model): when an op has waited longer than
// RINGREDUCE_STALL_WARN, a warning lists the ranks that have not reached it; again at its timeout.
// And the last line of mismatch detection: ranks that issued different calls which send each
// other nothing (a chain reduce whose ranks disagree on the root can have every rank waiting to
// receive) never see each other's fingerprint on a message; the store shows it to them.
//
// Nobody can ask a rank that never called the op where it is, so ranks leave word in the store:
// a rank whose op has waited longer than `publish_after` writes "stall/<rank>" = that op's
// sequence number and fingerprint, once per op. Every rank that has reached a stuck op S is stuck
// in it (nobody can finish it without the missing ranks), so after `publish_after` every rank at S
// has said so; the ranks whose word is below S (or missing) have not reached it (read only for a
// report). Mismatches take O(1) requests per rank, not N: the first rank to report S also writes
// its call under "stallop/S/first"; each later one compares its own with it, and one whose call
// differs fails with a MismatchError (through `mismatch`) and writes the verdict under
// "stallop/S/mismatch", which every rank stuck in S reads at its next check. (Reading every
// rank's word instead cost 2N requests per rank for every op that took a second: at 256 ranks on
// two cores, where many do, the store drowned.)
// An op that ends quickly costs the caller three relaxed atomic stores and nothing else: the
// monitor thread samples the current op every `tick` and measures waits in ticks, so the op path
// never reads a clock, and the store is touched only by ops that have waited a second (more where
// many ranks share each core: publish_delay() in the .cc).
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ringreduce/store.h"
#include "transport/link.h"

namespace ringreduce::detail {

class StallMonitor {
 public:
  struct Hooks {
    // The store to report through, made on first use by the monitor thread (a client of its own
    // with a short timeout, so that a store that no longer answers cannot hold the monitor up).
    std::function<std::shared_ptr<Store>()> store;
    // "allreduce #812 (float x 4194304, sum)".
    std::function<std::string(const transport::OpTag&)> describe;
    // Rank `peer` is in the same op with another call (`reason` says which): fail the op.
    std::function<void(const std::string& reason)> mismatch;
  };
  // warn_after 0: no warnings (the mismatch check still runs). crowding: this host's ranks per
  // core, rounded up (1 when there are cores to spare).
  StallMonitor(int rank, int size, std::chrono::milliseconds warn_after, Hooks hooks,
               int crowding = 1);
  ~StallMonitor();  // stops the thread; waits at most for one store call in flight
  StallMonitor(const StallMonitor&) = delete;
  StallMonitor& operator=(const StallMonitor&) = delete;

  // The op path: relaxed stores only.
  void op_started(const transport::OpTag& tag) noexcept {
    count_.store(tag.count, std::memory_order_relaxed);
    meta_.store(pack(tag), std::memory_order_relaxed);
    seq_.store(tag.seq, std::memory_order_release);
  }
  void op_ended() noexcept { seq_.store(0, std::memory_order_release); }
  // The op failed: if it timed out, or was reported stalled and then failed (say, from a peer's
  // timeout), the monitor reports once more, in its own thread: the caller must not wait on the
  // store. `how`: "timed out after 1.5 s", "failed".
  void op_failed(const transport::OpTag& tag, bool timed_out, std::string how);

  // Which ranks are not known to have reached op `seq`, as text ("ranks 2, 5 (rank 2 last waited
  // in #811, rank 5 never reported a wait)"); each store call is bounded by the store client's
  // own timeout. A rank stopped inside the op within its first second is listed too: it never
  // said it got there.
  std::string missing_ranks(Store& store, uint64_t seq);

 private:
  static uint64_t pack(const transport::OpTag& t) {
    return static_cast<uint64_t>(static_cast<uint32_t>(t.root)) | uint64_t{t.kind} << 32 |
           uint64_t{t.dtype} << 40 | uint64_t{t.op} << 48;
  }
  static transport::OpTag unpack(uint64_t seq, uint64_t count, uint64_t meta);
  void loop();
  // Store calls, each guarded: a store that fails is reported once and then left alone.
  void publish(const transport::OpTag& tag);
  // Compares this rank's call with the first one reported for the same op (once: *compared),
  // and reads the verdict of a rank that found them different; reports a mismatch through
  // hooks_.mismatch and returns true. A few store requests, whatever the number of ranks.
  bool compare(const transport::OpTag& tag, bool* compared);
  // A rank's word: its op's tag (seq 0: none, or unreadable).
  transport::OpTag word_of(Store& s, int q);
  // `how`: "has waited 60 s", "timed out after 300 s", ...
  void report(const transport::OpTag& tag, const std::string& how);
  Store* store();

  const int rank_;
  const int size_;
  const std::chrono::milliseconds warn_after_;
  const std::chrono::milliseconds publish_after_;
  const std::chrono::milliseconds tick_;
  Hooks hooks_;
  std::shared_ptr<Store> store_;
  bool store_failed_ = false;

  std::atomic<uint64_t> seq_{0};  // the running op's sequence number; 0: none
  std::atomic<uint64_t> count_{0};
  std::atomic<uint64_t> meta_{0};
  std::atomic<uint64_t> warned_seq_{0};  // the last op reported stalled

  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  bool pending_failure_ = false;  // guarded by mu_, as are the two below
  transport::OpTag failed_tag_;
  std::string failed_how_;
  std::thread thread_;  // last: started once everything above exists
};

}  // namespace ringreduce::detail
