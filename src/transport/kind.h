// A kind of link (shared memory, TCP; a device link later) as the progress engine sees it: the
// links it made to the peers routed to it, what it offers (its traits), and the few hooks the one
// engine (engine.h) calls to move its bytes, learn of its failures and sleep on its events. The
// transport table (table.h) decides, per peer, which kind links to it, as NCCL's transport table
// does: the first kind in the table that can connect the pair.
//
// A kind never waits by itself: waiting is the engine's, so that every wait (a collective's, a
// window's, a point-to-point receive's) moves the links of every kind at once.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <functional>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "ringreduce/error.h"
#include "transport/link.h"

namespace ringreduce::transport {

// The cost of one kind of link in the tuner's model (docs/TUNING.md): measured at start-up (comm/
// probes it) or read from a calibration file; the kind's traits give a default until then.
struct LinkCost {
  double alpha = 0;  // seconds per message step, every rank stepping at once
  double beta = 0;   // seconds per byte through one link while every link carries as much
  // A step costs max(alpha, bytes * beta) instead of their sum: across hosts the kernel's TCP
  // stack overlaps a message's latency with the transfer of the one before (measured on the
  // emulated cluster: the ring's 64 KiB steps at 1 Gbit/s took their transfer time alone).
  bool overlap = false;
  double step(double bytes) const {
    return overlap ? std::max(alpha, bytes * beta) : alpha + bytes * beta;
  }
};

// Where a buffer lives, as a kind of link sees it: what its links can read from and write to in
// place (KindTraits::memory, a mask of these). Plain host memory every kind takes; registered
// memory is host memory the peers map (the shared window, link.h); device memory is a GPU's. A
// call whose buffers live where some kind of its links cannot reach is staged through host
// memory (comm/device.h); one whose every kind takes them is not.
enum class MemorySpace : uint8_t { host = 1, registered = 2, device = 4 };
constexpr uint8_t memory_mask(MemorySpace s) {
  return static_cast<uint8_t>(s);
}

// What a kind offers, for the tuner and the algorithms' context: the communicator takes the traits
// of its slowest kind (the last in the table among those it uses), since every ring crosses it.
struct KindTraits {
  std::string name;          // "shm", "tcp": the tuner's and the tuning file's name for it
  size_t segment_bytes = 0;  // what one message of a pipelined schedule should carry
  // Ring schedules go slice by slice (algorithms/ring_phases.h) from this many bytes per ring
  // step (an allreduce's chunk, K / N), step by step below: 0 at every size, SIZE_MAX never.
  size_t sliced_from_step_bytes = SIZE_MAX;
  bool sliced(size_t step_bytes) const { return step_bytes >= sliced_from_step_bytes; }
  bool stream_output = false;  // large out-of-place outputs pay to be written with streaming stores
  LinkCost costs;              // until the start-up probe measures them
  uint8_t memory = memory_mask(MemorySpace::host);  // the spaces its links take (MemorySpace)
  bool takes(MemorySpace s) const { return (memory & memory_mask(s)) != 0; }
};

// What a kind listens on before the ranks join (a socket, a named endpoint), opened so that its
// address travels in the join record. published() is the kind's own part of that record: opaque
// to everyone but the kind's connect on the other ranks (as NCCL's connect info is).
class KindListener {
 public:
  virtual ~KindListener() = default;
  virtual std::string published() const = 0;
};

// The engine as a kind sees it: a kind whose Window waits (shared memory) waits through it.
class Driver {
 public:
  virtual ~Driver() = default;
  // Waits until poll() returns true, moving every kind's links meanwhile (poll should move them
  // too, through poll_all(), and say through moved() whether that pass moved anything); throws
  // peers' notices, interrupts, and on_timeout() once the deadline has passed.
  virtual void drive(FnRef<bool> poll, FnRef<bool> moved, FnRef<void> on_timeout,
                     const core::Deadline& deadline) = 0;
  // One pass over every kind's links (see LinkKind::poll); whether anything moved.
  virtual bool poll_all(bool stage) = 0;
};

class LinkKind {
 public:
  virtual ~LinkKind() = default;
  virtual const KindTraits& traits() const = 0;
  // The link to `peer` (routed to this kind) on `channel`.
  virtual Link& link(int peer, int channel) = 0;
  // The point-to-point lane to `peer` (p2p.h): a link of its own, beside the collectives' ones,
  // whose messages carry lane_tag().
  virtual Link& lane(int peer) = 0;
  // Whether a lane exists only once used: a peer's first message on it comes with its connection
  // (TCP), and take_opened_lanes() reports it. Otherwise a peer may write into any lane at any
  // time (shared memory), and the point-to-point layer watches them all from the start.
  virtual bool lanes_on_demand() const { return false; }
  // The peers that opened their lane to this rank since the last call (lanes_on_demand).
  virtual std::vector<int> take_opened_lanes() { return {}; }
  // Memory every rank reads in place (link.h), when this kind links every rank; else null.
  virtual Window* window() { return nullptr; }
  // Set once by the engine before any wait.
  virtual void set_driver(Driver* driver) { (void)driver; }

  // Sets the tag this kind's messages carry and its receives expect (Transport::begin_op).
  virtual void begin_op(const OpTag& tag, bool stream_output) = 0;
  virtual void set_describer(std::function<std::string(const OpTag&)> f) = 0;

  // One pass over the links: moves what can move now without waiting; returns whether anything
  // moved. With `stage`, a forward that waits for room stages its bytes instead (shared memory:
  // what keeps any posting order free of deadlock; asked for only before the engine sleeps).
  // Throws PeerError / MismatchError for a failed or mismatched peer.
  virtual bool poll(bool stage) = 0;
  // Receives completed on lanes and lanes opened by peers so far (a count that only grows): the
  // engine has the point-to-point layer look at its lanes only in a pass after it moved (at 1,024
  // ranks a look at every lane in every pass cost more than the pass).
  virtual uint64_t lane_events() const = 0;
  // Wake-ups owed to peers for what primitives moved eagerly when they were posted.
  virtual void flush() {}
  // A peer's abort notice, if one has arrived: rethrown, so the op fails with the peer's reason.
  virtual void throw_if_notice() = 0;
  // Called when nothing has moved for a while, before sleeping: checks that may name a cause
  // (shared memory: a peer that began this op's sequence number in another call).
  virtual void check_idle() {}

  // Sleeping. prepare_sleep() tells the peers to wake this rank from now on and returns the
  // longest safe sleep in ms; the engine then looks once more, and sleeps on every kind's
  // event_fd() (readable: something arrived for handle_events()); end_sleep() follows either way.
  virtual int prepare_sleep() { return 1000; }
  virtual void end_sleep() {}
  virtual int event_fd() const = 0;
  // Takes what made event_fd() readable (never blocks).
  virtual void handle_events() = 0;

  // For a timed-out wait: the peer to name (a pending receive first: *sending false), or -1.
  virtual int stuck_peer(bool* sending) const = 0;
  // "timed out waiting for rank Q: its host has acknowledged nothing ...", or empty.
  virtual std::string unreachable_text() const { return {}; }
  // Fails every link (Transport::abort).
  virtual void abort(int code, int blamed_rank, const std::string& reason) = 0;
  // One look (no waiting) for a peer's notice giving a deeper cause (Transport::find_cause).
  virtual std::exception_ptr find_cause(int blamed) = 0;
};

// Calls `check` (ConnectArgs::check_failed: throws if the job was marked failed elsewhere); the
// failure it throws gains what this rank saw meanwhile, the last start-up connection it dropped
// (`last_drop`, if any), as the message of a timeout would have named it.
inline void check_job_failed(const std::function<void()>& check, const std::string& last_drop) {
  if (!check) return;
  try {
    check();
  } catch (const Error& e) {
    if (last_drop.empty()) throw;
    throw Error(
        std::string(e.what()) + " (this rank meanwhile dropped a connection: " + last_drop + ")",
        e.code());
  }
}

}  // namespace ringreduce::transport
