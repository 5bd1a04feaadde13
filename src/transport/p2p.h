// Point-to-point messages: sends and receives matched per (peer, tag) in a space of their own,
// independent of the collectives' sequence, over one lane per peer (a link every kind makes beside
// its collective links, whose messages carry a fixed tag; LinkKind::lane).
//
// Protocol (MPI's): a message up to eager_bytes goes at once, a header then its payload; the
// receiver puts it in the matching posted receive or, when none is posted yet, in a buffer of its
// own until one is. A larger message sends a request-to-send header; the receiver answers
// clear-to-send when a matching receive is posted, and the payload then goes straight into it.
// Receives match arrived messages in arrival order and messages match posted receives in posting
// order, so messages from one sender with one tag are received in the order they were sent (MPI's
// non-overtaking rule); a receive from any source takes the first match from any peer.
//
// Every open lane always has a header receive posted, so whatever a peer sends is taken off its
// lane even while no receive for it is posted: a sender never waits behind the receiver's
// collectives. A lane opens when this rank first sends on it or, for a kind whose lanes exist only
// once used (TCP: a connection), when the peer's first message opens it from the other side
// (open_lane); lanes a peer may write into at any time (shared memory) are open from the start.
// At 1,024 ranks over 8 hosts, a TCP lane to every peer made up front cost each rank 896 links
// it never used and ~7% of the job's start-up CPU.
// Lanes move in the engine's every pass (Engine::poll_all polls this after the kinds), so
// point-to-point traffic progresses inside any wait: a collective's, a window's or its own.
//
// Threads: submit() may be called from any thread; everything else runs in the thread that drives
// the engine. Failures (a size mismatch, a peer gone that a request needs, a request past its
// deadline) throw from poll(), which fails the wait in progress: the communicator then aborts and
// fails every request with fail_all().
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "core/deadline.h"
#include "transport/link.h"

namespace ringreduce::transport {

inline constexpr int kAnySource = -1;

// One send or receive, owned by its submitter until on_done has run.
struct P2pRequest {
  bool is_send = false;
  int peer = kAnySource;  // the destination, or the source (kAnySource: any)
  uint64_t tag = 0;
  void* buf = nullptr;  // the payload (read for a send, written for a receive)
  size_t bytes = 0;
  core::Deadline deadline = core::Deadline::never();
  // Called once by the driving thread when the request is done (error null on success).
  void (*on_done)(P2pRequest* request, std::exception_ptr error) = nullptr;
  void* owner = nullptr;
  // Set before on_done: the rank whose message a receive took.
  int source = -1;
  // "send to rank 2 (tag 7, 4096 bytes)", for errors.
  std::string describe(int rank) const;
};

// The first bytes of every lane message.
struct P2pHeader {
  uint32_t magic = 0;
  uint32_t type = 0;
  uint64_t tag = 0;
  uint64_t bytes = 0;  // of the message's payload
  uint64_t id = 0;     // the sender's number for the message on this lane
  uint64_t reserved[4] = {};
};
static_assert(sizeof(P2pHeader) == 64);

class P2p {
 public:
  // lane(r): the link of the lane to rank r, made when first asked for (null: no lane to r, as
  // for this rank). open: the ranks whose lanes are watched from the start. wake(): rouses a
  // driver that sleeps, after a submit from another thread.
  P2p(int rank, int size, std::function<Link*(int)> lane, const std::vector<int>& open,
      size_t eager_bytes, void (*wake)(void*), void* wake_arg);
  ~P2p();

  // Driver: `peer` opened its lane to this rank (LinkKind::take_opened_lanes); watched from now
  // (nothing, once fail_all() has run: the links have failed too).
  void open_lane(int peer) {
    if (!failed_.load(std::memory_order_relaxed)) lane_of(peer);
  }

  // Any thread: hands a request to the driver, which posts it at its next pass. False (and the
  // request is not taken) once fail_all() has run.
  bool submit(P2pRequest* r);
  // Driver: one pass. Posts submitted requests, reads arrived headers, finishes requests whose
  // bytes have moved (calling their on_done). Returns whether anything happened. lanes_moved:
  // some lane may have completed a receive since the last pass (LinkKind::lane_events); the
  // lanes are looked at only then, or while requests are outstanding or a header receive was
  // just posted (it may complete as it is posted).
  bool poll(bool lanes_moved = true);
  // Whether any request is submitted and not done.
  bool busy() const { return outstanding_.load(std::memory_order_acquire) > 0; }
  // Driver, after a failure: every request not done fails with `error`; nothing is posted again.
  void fail_all(std::exception_ptr error);

 private:
  struct Lane;
  struct Arrived;
  struct Moving;

  void post_header_recv(Lane& lane);
  void on_header(Lane& lane);
  void send_header(Lane& lane, uint32_t type, uint64_t tag, uint64_t bytes, uint64_t id,
                   P2pRequest* completes, const void* payload);
  // The payload of a matched message from lane's peer, straight into r's buffer.
  void receive_payload(Lane& lane, P2pRequest* r, uint64_t bytes);
  void post_request(P2pRequest* r);
  void match_recv(P2pRequest* r, Arrived& a);
  // The first posted receive that takes a message from src with tag (checking its size), or null.
  P2pRequest* take_posted(int src, uint64_t tag, uint64_t bytes);
  [[noreturn]] void size_mismatch(const P2pRequest& r, int src, uint64_t bytes);
  // r's bytes have all moved: its on_done runs at the end of this pass.
  void finish(P2pRequest* r);
  void check_lanes_and_deadlines();
  // The lane to peer, opened (its header receive posted) if it was not; throws for a rank
  // without one.
  Lane& lane_of(int peer);

  int rank_;
  int size_;
  size_t eager_bytes_;
  void (*wake_)(void*);
  void* wake_arg_;
  std::function<Link*(int)> make_lane_;
  std::vector<std::unique_ptr<Lane>> lanes_;  // by rank, null until opened
  std::vector<Lane*> open_;                   // the opened lanes, in the order they opened

  std::mutex submit_mu_;
  std::vector<P2pRequest*> submitted_;  // guarded by submit_mu_
  std::atomic<bool> has_submitted_{false};
  std::atomic<size_t> outstanding_{0};
  std::atomic<bool> failed_{false};  // written under submit_mu_

  // Driver-only state.
  std::deque<P2pRequest*> posting_;              // taken from submitted_, not yet posted
  std::list<P2pRequest*> posted_;                // receives waiting for a message, posting order
  std::list<std::unique_ptr<Arrived>> arrived_;  // messages waiting for a receive, arrival order
  std::list<std::unique_ptr<Moving>> moving_;    // payloads on their way
  // Rendezvous: sends whose request went out (by (peer, id)); receives that answered one.
  std::map<std::pair<int, uint64_t>, P2pRequest*> await_cts_;
  std::map<std::pair<int, uint64_t>, P2pRequest*> await_data_;
  std::vector<P2pRequest*> done_;  // finished in this pass, their on_done still to run
  core::Clock::time_point next_check_{};
  bool look_lanes_ = true;  // this layer posted on a lane since the lanes were last looked at
};

}  // namespace ringreduce::transport
