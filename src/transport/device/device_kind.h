// Device links (issue 44): between the ranks of one host whose buffers are on a GPU, the ring's
// messages go device to device, never through host memory. Each rank has, per peer that sends to
// it, an inbox of kSlots slots in device memory it exports (DeviceRuntime::shared_memory: CUDA's
// VMM with POSIX descriptors), which the sender maps (its descriptor taken with pidfd_getfd, as
// shared memory takes a peer's memfd). A send is a device-to-device copy into the peer's slot; a
// forward with reduction is one kernel reading the slot and writing the next rank's slot (and the
// output, when kept): the existing ring algorithms run unchanged on device pointers, the link doing
// the moving and reducing as the shared-memory link does on the host.
//
// Flow control is host memory: each rank publishes a control block (a memfd, mapped by its peers)
// with, per sender, how many slots it has filled (written by the sender once its copy or kernel
// has passed on the stream) and freed (written by the owner once the work reading the slot has
// passed), and each slot's byte count and op tag (so that a mismatched call is named, never
// reduced). The host drives: work is enqueued on the kind's own stream, and the engine's polls
// retire it through events, then publish. So every step costs an event's passing plus a host
// poll, which large slots (RINGREDUCE_DEVICE_SLOT_BYTES) amortise; persistent kernels would not
// pay it (NCCL's design) and are the next step if the device check finds it matters.
//
// Inboxes are made on first use (a receive posted from that peer), so only ring neighbours pay for
// them. A peer whose process exits is found through its pidfd.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/deadline.h"
#include "core/fd.h"
#include "core/mapping.h"
#include "reduce/device_runtime.h"
#include "transport/kind.h"
#include "transport/link.h"

namespace ringreduce::transport::device {

constexpr size_t kSlots = 4;
// The control block is indexed by rank: communicators of more ranks link no peer this way.
constexpr int kMaxRanks = 65536;

// One slot's description, written by the sender before it publishes the slot.
struct SlotMeta {
  uint64_t bytes;
  OpTag tag;
  uint64_t reserved;
};
static_assert(sizeof(SlotMeta) == 64);

// What the owner of a control block and one sender share: the owner's line, the sender's line,
// the slots' descriptions. Plain words accessed through std::atomic_ref (the block is a mapping).
struct Entry {
  // Written by the owner (the receiver).
  uint32_t ready;  // 1: fd, inbox_bytes and slot_bytes are set
  int32_t fd;      // the inbox's descriptor in the owner's process
  uint64_t inbox_bytes;
  uint64_t slot_bytes;
  uint64_t freed;  // slots released, a count that only grows
  uint64_t owner_aborted;
  uint64_t owner_reserved[3];
  // Written by the sender.
  uint64_t filled;  // slots filled, a count that only grows
  uint64_t sender_aborted;
  uint64_t sender_reserved[6];
  SlotMeta meta[kSlots];
};
static_assert(sizeof(Entry) == 128 + 64 * kSlots);

// The block's first line: whether its owner sleeps (then a peer that publishes rings its bell).
struct Header {
  uint32_t sleeping;
  uint32_t reserved[15];
};
static_assert(sizeof(Header) == 64);
inline size_t block_bytes(int ranks) {
  return sizeof(Header) + sizeof(Entry) * static_cast<size_t>(ranks);
}

// What a rank opens before the join: its control block (sized at connect, when the communicator's
// size is known) and its doorbell.
class DeviceListener final : public KindListener {
 public:
  DeviceListener();
  // "<pid>|<block fd>|<bell fd>|<pid namespace>"
  std::string published() const override;
  core::Fd block, bell;

 private:
  std::string pidns_;
};

struct DeviceOptions {
  int rank = 0;
  int size = 1;
  size_t slot_bytes = 8 << 20;
  std::vector<int> peers;
  DeviceListener* listener = nullptr;
  std::vector<std::string> published;  // by rank
  std::function<void()> check_failed;
};

class DeviceKind;

// One primitive posted on a device link.
struct Item {
  enum class Type : uint8_t { send, recv, recv_reduce, reduce_send, copy_send };
  Type type = Type::send;
  const char* src = nullptr;    // send
  char* dst = nullptr;          // receives
  const char* local = nullptr;  // reductions
  size_t bytes = 0;
  Reduction red;
  bool keep = false;
  class DeviceLink* next = nullptr;  // forwards
  OpTag tag;
  size_t enqueued = 0;  // bytes whose work is on the stream
  size_t pending = 0;   // chunks on the stream not retired yet
  Completion* c = nullptr;
};

class DeviceLink final : public Link {
 public:
  DeviceLink(DeviceKind& kind, int peer) : kind_(kind), peer_(peer) {}
  int peer() const override { return peer_; }
  void send(const void* src, size_t bytes, Completion* c) override;
  void recv(void* dst, size_t bytes, Completion* c) override;
  void recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                   Completion* c) override;
  void recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r, Link& next,
                        bool keep, Completion* c) override;
  void recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) override;
  // Not on device links: a coded call is staged through host memory (comm/device.cc).
  void send_coded(const float*, size_t, Wire, Completion*) override;
  void recv_coded(float*, const float*, size_t, Wire, Completion*) override;
  void* reserve_forward(const void*, size_t, Completion*) override;
  void forward_ready(void*, size_t) override;
  bool closed() const override { return false; }

 private:
  friend class DeviceKind;
  std::shared_ptr<Item> post(Item item, Completion* c);
  // What can be enqueued now on the stream; whether anything was.
  bool advance();
  bool advance_send(Item& it);
  bool advance_recv(Item& it);
  // Sending: the peer's inbox for us is mapped (once it has published it), and a slot is free.
  bool remote_ready();
  bool room() const;
  char* remote_slot(uint64_t n) const;
  // Receiving: our inbox for the peer exists (made on first use), and a slot is filled.
  void ensure_inbox();
  bool available() const;
  char* inbox_slot(uint64_t n) const;
  // The next filled slot's description, checked against the receive: its tag (else the
  // MismatchError naming both calls) and its byte count.
  void check_slot(const Item& it, size_t chunk) const;

  DeviceKind& kind_;
  int peer_;
  std::deque<std::shared_ptr<Item>> sends_;  // in posting order: sends and forwards out
  std::deque<std::shared_ptr<Item>> recvs_;  // in posting order: receives and forwards in
  // The peer's inbox for us, as mapped here, and our entry in its block.
  std::unique_ptr<reduce::DeviceRuntime::SharedMemory> remote_;
  Entry* out_ = nullptr;
  uint64_t posted_ = 0;  // slots we have enqueued work into
  // Our inbox for the peer, and the peer's entry in our block.
  std::unique_ptr<reduce::DeviceRuntime::SharedMemory> inbox_;
  core::Fd inbox_fd_;  // kept open for the peer's pidfd_getfd
  Entry* in_ = nullptr;
  uint64_t consumed_ = 0;  // slots whose reading work is enqueued
};

class DeviceKind final : public LinkKind {
 public:
  DeviceKind(const DeviceOptions& options, const core::Deadline& deadline);
  ~DeviceKind() override;

  const KindTraits& traits() const override { return traits_; }
  Link& link(int peer, int channel) override;
  Link& lane(int peer) override;
  void begin_op(const OpTag& tag, bool) override {
    tag_ = tag;
    device_set_ = false;
  }
  void set_describer(std::function<std::string(const OpTag&)> f) override {
    describe_ = std::move(f);
  }
  bool poll(bool stage) override;
  uint64_t lane_events() const override { return 0; }
  void throw_if_notice() override {}
  void check_idle() override;
  int prepare_sleep() override;
  void end_sleep() override;
  int event_fd() const override { return bell_.get(); }
  void handle_events() override;
  int stuck_peer(bool* sending) const override;
  void abort(int code, int blamed_rank, const std::string& reason) override;
  std::exception_ptr find_cause(int) override { return nullptr; }

 private:
  friend class DeviceLink;
  struct Peer {
    pid_t pid = 0;
    core::Fd pidfd;
    core::Fd bell;        // its doorbell
    core::Mapping block;  // its control block
    std::unique_ptr<DeviceLink> link;
  };
  // Work on the stream, retired in order (one stream: its events pass in order).
  struct InFlight {
    std::unique_ptr<reduce::DeviceRuntime::Event> event;
    std::shared_ptr<Item> item;
    DeviceLink* freed_on = nullptr;   // a slot of its inbox to release
    DeviceLink* filled_on = nullptr;  // a slot of its peer's inbox to publish
    uint64_t filled_bytes = 0;
    OpTag filled_tag;
  };
  Peer& peer(int q) const;
  Entry& my_entry(int sender) const;
  Entry& entry_of(int owner) const;  // ours in owner's block
  std::unique_ptr<reduce::DeviceRuntime::Event> take_event();
  void enqueued(std::shared_ptr<Item> item, DeviceLink* freed_on, DeviceLink* filled_on,
                uint64_t filled_bytes);
  bool retire();
  void ring(int q);  // after publishing to q: wakes it if it sleeps
  std::string describe(const OpTag& t) const { return describe_ ? describe_(t) : "an op"; }
  void drain();

  DeviceOptions opts_;
  KindTraits traits_;
  reduce::DeviceRuntime& runtime_;
  void* stream_ = nullptr;
  int device_ = 0;  // the stream's (current when the communicator was made)
  // device_ made current in the driving thread since the op began (the driving thread may be the
  // progress thread, whose current device is the first; an op runs in one thread).
  bool device_set_ = false;
  core::Fd block_fd_, bell_;
  core::Mapping block_;
  std::vector<std::unique_ptr<Peer>> peers_;  // by rank (null: not linked here)
  std::vector<DeviceLink*> links_;            // the linked peers' (every poll looks at them)
  std::deque<InFlight> in_flight_;
  std::vector<std::unique_ptr<reduce::DeviceRuntime::Event>> spare_events_;
  OpTag tag_;
  std::function<std::string(const OpTag&)> describe_;
  bool aborted_ = false;
};

}  // namespace ringreduce::transport::device
