// The layout of a rank's shared-memory segment. Each rank owns one segment (a memfd) that holds
// the FIFOs its same-host peers write into; the peers map it after receiving the memfd over a
// Unix socket. Nothing is ever named in /dev/shm, so a crash leaves nothing behind.
//
//   SegmentHeader                      (one page)
//   Fifo[(sender local index) * channels + channel], each:
//     FifoControl                      head, tail and abort notice on separate cache lines
//     SlotMeta[kSlots]                 one cache line per slot: tag, sizes
//     data[kSlots][kSlotBytes]
//
// A FIFO is single-producer (the sender) single-consumer (the owner). head counts slots the
// sender has published, tail the slots the owner has released; the sender may write slot
// (head % kSlots) while head - tail < kSlots, so the free slots are the credits. Publishing is a
// release store of head after the slot is written; releasing is a release store of tail after
// the slot has been read.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "transport/link.h"

namespace ringreduce::transport::shm {

inline constexpr uint64_t kSegmentMagic = 0x314d485352525252ull;  // "RRRRSHM1"
inline constexpr uint32_t kShmVersion = 1;
// A few cache-sized slots: the fused ring keeps its staging in cache (the prototypes:
// 256-512 KiB slots reached 85-90% of the memory-bandwidth floor; a full-size staging copy costs
// 3x). 4 x 256 KiB per FIFO measured best at N=2, 4 and 8 (tuner.cc); 16 slots were up to 2x
// slower with 4 ranks per core, whose FIFOs then no longer fit the caches between turns. Slots are
// multiples of 64 bytes, so every slot boundary is an element boundary.
inline constexpr size_t kSlotBytes = 256 << 10;
inline constexpr uint32_t kSlots = 4;
inline constexpr size_t kMaxAbortReason = 2048;
inline constexpr size_t kPage = 4096;

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t owner_rank;
  uint64_t comm_id;
  uint64_t fifo_count;
  uint64_t fifo_stride;
  uint64_t total_bytes;
  // Set by the owner while it is about to sleep in epoll_wait on its doorbell eventfd; a peer
  // that makes progress possible for the owner writes the eventfd only then.
  alignas(64) std::atomic<uint32_t> sleeping;
};

struct FifoControl {
  alignas(64) std::atomic<uint64_t> head;  // written by the sender
  alignas(64) std::atomic<uint64_t> tail;  // written by the owner
  // The sender's abort notice: code and reason are written first, then state is set (release).
  alignas(64) std::atomic<uint32_t> abort_state;
  int32_t abort_code;
  int32_t abort_blamed;  // the rank the failure is pinned on, or -1
  uint32_t abort_len;
  char abort_reason[kMaxAbortReason];
};

struct alignas(64) SlotMeta {
  OpTag tag;               // the sender's op
  uint64_t message_bytes;  // the whole message this slot belongs to
  uint32_t bytes;          // payload bytes in this slot
  uint32_t first;          // 1 on a message's first slot
};
static_assert(sizeof(SlotMeta) == 64, "one cache line per slot");

inline constexpr size_t round_up(size_t v, size_t a) {
  return (v + a - 1) / a * a;
}
inline constexpr size_t kHeaderBytes = round_up(sizeof(SegmentHeader), kPage);
inline constexpr size_t kMetaOffset = round_up(sizeof(FifoControl), 64);
inline constexpr size_t kDataOffset = round_up(kMetaOffset + kSlots * sizeof(SlotMeta), kPage);
inline constexpr size_t kFifoStride = round_up(kDataOffset + kSlots * kSlotBytes, kPage);

// A view of one FIFO inside a mapped segment.
struct Fifo {
  char* base = nullptr;
  FifoControl* control() const { return reinterpret_cast<FifoControl*>(base); }
  SlotMeta* meta(uint64_t i) const {
    return reinterpret_cast<SlotMeta*>(base + kMetaOffset) + (i % kSlots);
  }
  char* data(uint64_t i) const { return base + kDataOffset + (i % kSlots) * kSlotBytes; }
};

inline Fifo fifo_at(void* segment, size_t index) {
  return Fifo{static_cast<char*>(segment) + kHeaderBytes + index * kFifoStride};
}

}  // namespace ringreduce::transport::shm
