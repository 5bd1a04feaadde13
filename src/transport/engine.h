// The progress engine: the one Transport every communicator has, over the kinds of link the
// transport table routed its peers to (table.h). link(peer) is the link of the peer's kind; wait()
// is the one loop that moves every kind's links, reads their failures, and sleeps on all of their
// events at once, so that a forward crossing kinds (the first rank of a host in a ring receives
// over TCP and sends over shared memory) moves as soon as either side can.
//
// Waiting: poll every kind (bounded spin with no more ranks than cores, yielding at once when
// ranks outnumber them: idle_policy.h); when nothing has moved for a while, ask the kinds for their
// idle checks (a peer in another call), raise every kind's sleep flag, look once more, and sleep
// in epoll_wait on every kind's event fd and the engine's own eventfd, which interrupt() writes.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/fd.h"
#include "core/timeline.h"
#include "transport/kind.h"
#include "transport/link.h"
#include "transport/p2p.h"

namespace ringreduce::transport {

struct EngineOptions {
  int rank = 0;
  int size = 1;
  int channels = 1;
  // Poll this long before sleeping: a sleeping thread costs tens of µs to wake.
  int spin_us = 50;
  // Ranks outnumber cores: yield at once, sleep after max_idle_yields idle yields in a row.
  bool oversubscribed = false;
  int max_idle_yields = 8;
  // Point-to-point messages up to this size go at once (eager); larger ones wait for the
  // receiver's clear-to-send and then go straight into its buffer (p2p.h).
  size_t p2p_eager_bytes = 64 << 10;
};

class Engine final : public Transport, public Driver {
 public:
  // kinds in table order (fastest first); route[r]: the index in kinds of the kind linking rank r
  // (-1 for this rank); device_route[r]: of the kind linking it for device memory (-1: none, or
  // empty). At least one kind.
  Engine(const EngineOptions& options, std::vector<std::unique_ptr<LinkKind>> kinds,
         std::vector<int> route, std::vector<int> device_route = {});
  ~Engine() override;

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  int channels() const override { return opts_.channels; }
  Link& link(int peer, int channel) override;
  Window* window() override { return window_; }
  void begin_op(const OpTag& tag, bool stream_output = false) override;
  void wait(Completion& c, const core::Deadline& deadline) override;
  // Drives every link until done() (asked before every pass); throws as wait() does, and a
  // TimeoutError at the deadline.
  void wait_until(FnRef<bool> done, const core::Deadline& deadline);
  void abort(int code, int blamed_rank, const std::string& reason) override;
  std::exception_ptr find_cause(std::chrono::milliseconds grace, int blamed) override;
  void set_describer(std::function<std::string(const OpTag&)> f) override;
  void interrupt(const std::string& reason, int code) override;

  void drive(FnRef<bool> poll, FnRef<bool> moved, FnRef<void> on_timeout,
             const core::Deadline& deadline) override;
  bool poll_all(bool stage) override;

  // What the communicator's links offer: its slowest host kind's traits (the last of the table's
  // kinds it uses for host memory: every ring crosses it).
  const KindTraits& traits() const { return host_kinds_.back()->traits(); }
  // Whether every peer has a link that reads and writes buffers in `space` in place: a call on
  // device buffers is staged through host memory unless they all have (comm/device.h).
  bool takes(MemorySpace space) const;
  // The memory the current op's buffers are in (until the next call): link() then gives each
  // peer's link for it. Device memory only where takes(device).
  void set_memory(MemorySpace space) { device_op_ = space == MemorySpace::device; }
  // The traits of the kind linking peers for device memory (takes(device) only).
  const KindTraits& device_traits() const;
  // The kinds in use, for logs: "shm", "tcp", "shm+tcp".
  std::string kinds_text() const;
  // Point-to-point messages over every peer's lane; moved in every pass of every wait.
  P2p& p2p() { return *p2p_; }
  // Thread-safe: rouses a wait that sleeps (only then: a busy one looks at its work anyway), so
  // that it sees what another thread has handed it (a point-to-point request, a queued op).
  void wake();
  // RINGREDUCE_TIMELINE: record every stretch in which nothing moved as a wait (null: off).
  void set_timeline(core::Timeline* timeline) { timeline_ = timeline; }

 private:
  // drive(), with the timeline's bookkeeping compiled in or out: off, a wait costs one test.
  template <bool kTraced>
  void drive_loop(FnRef<bool> poll, FnRef<bool> moved, FnRef<void> on_timeout,
                  const core::Deadline& deadline);
  // The peer a pending receive waits for, else one that has not taken our data; -1: none known.
  int waited_peer(bool* sending = nullptr);
  void check_interrupt();
  void throw_if_notice();
  // Sleeps on every kind's events unless recheck(), run once every sleep flag is up, finds work.
  void sleep(const core::Deadline& deadline, FnRef<bool> recheck);
  [[noreturn]] void throw_timeout();

  EngineOptions opts_;
  std::vector<std::unique_ptr<LinkKind>> kinds_;
  std::vector<LinkKind*> route_;         // by rank
  std::vector<LinkKind*> device_route_;  // by rank: for device memory (null: none)
  std::vector<LinkKind*> host_kinds_;    // the kinds route_ uses, in table order
  bool device_op_ = false;               // set_memory
  Window* window_ = nullptr;
  core::Fd epoll_;
  core::Fd wake_;  // eventfd: interrupt() wakes a sleeping wait through it
  std::atomic<bool> sleeping_{false};
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mu_;
  std::string interrupt_reason_;
  int interrupt_code_ = 0;
  // Last: destroyed first, while the links its completions sit in still exist.
  std::unique_ptr<P2p> p2p_;
  uint64_t lane_events_seen_ = 0;  // the kinds' lane_events() summed, at the last pass
  core::Timeline* timeline_ = nullptr;
};

}  // namespace ringreduce::transport
