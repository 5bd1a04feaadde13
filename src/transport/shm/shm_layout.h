// The layout of a rank's shared-memory segment. Each rank owns one segment (a memfd) that holds
// the FIFOs its same-host peers write into; a peer maps it when it first needs it, after
// receiving the memfd over a Unix socket. Nothing is ever named in /dev/shm, so a crash leaves
// nothing behind.
//
//   SegmentHeader                      (one page): identity, liveness, counters
//   Fifo[(sender rank) * channels + channel], each:
//     FifoControl                      head, tail and abort notice on separate cache lines
//     SlotMeta[kSlots]                 one cache line per slot: tag, sizes
//     data[kSlots][kSlotBytes]
//   window[kWindowBytes]               the owner's region of the shared Window (link.h)
//   board                              used in the host's first rank's segment only (below)
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
inline constexpr uint32_t kShmVersion = 3;
// A few cache-sized slots: the fused ring keeps its staging in cache (the prototypes:
// 256-512 KiB slots reached 85-90% of the memory-bandwidth floor; a full-size staging copy costs
// 3x). 4 x 256 KiB per FIFO measured best at N=2, 4 and 8 (tuner.cc); 16 slots were up to 2x
// slower with 4 ranks per core, whose FIFOs then no longer fit the caches between turns. Slots are
// multiples of 64 bytes, so every slot boundary is an element boundary.
inline constexpr size_t kSlotBytes = 256 << 10;
inline constexpr uint32_t kSlots = 4;
inline constexpr size_t kMaxAbortReason = 2048;
// The flat small-message collectives keep two buffers here, the direct reduce-scatter its staging.
inline constexpr size_t kWindowBytes = size_t{2} << 20;
inline constexpr size_t kPage = 4096;

struct alignas(64) SegmentHeader {
  uint64_t magic;
  uint32_t version;
  int32_t owner_rank;
  uint64_t comm_id;
  uint64_t fifo_count;
  uint64_t fifo_stride;
  uint64_t total_bytes;
  // 1 if the owner registered for membarrier(MEMBARRIER_CMD_GLOBAL_EXPEDITED) (see
  // ShmTransport::flush_rings): only when every rank did may wakers skip their fence.
  uint32_t membarrier_ok;
  // Bumped by a peer after it publishes into one of this segment's lane FIFOs, and after it posts
  // an abort notice beside any of its FIFOs: the owner's passes read the lanes (whose header
  // receives are always posted) and the notices only when these have moved, instead of every
  // peer's on every pass (at 256 ranks those reads were a quarter of the CPU).
  alignas(64) std::atomic<uint64_t> lane_posts;
  alignas(64) std::atomic<uint64_t> notices;
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

inline size_t window_offset(size_t fifo_count) {
  return kHeaderBytes + fifo_count * kFifoStride;
}
// The board, in the host's first rank's segment, which every rank of the host maps: what a rank
// publishes for all its peers to read, each kind in an array of one cache line per rank, so that a
// rank that reads every peer's (a wake-up pass, the window's stamps, "has every peer begun op s")
// touches a few pages of one mapping instead of a line in each of N - 1 mappings: at 256 ranks on
// this project's VM such loads, each from another mapping, were 98% of the wake-up pass, and the
// first touches of N - 1 mappings by N ranks made the first flat allreduce take seconds
// (docs/PERFORMANCE.md). Arrays, not a record per rank: each scan reads one of them.
struct alignas(64) BoardLine {
  // Set by its rank while it is about to sleep in epoll_wait on its doorbell eventfd; a peer
  // that makes progress possible for it writes the eventfd only then.
  std::atomic<uint32_t> sleeping;
  // Set by its rank when its communicator is destroyed: its process may live on (another
  // communicator, or ranks that are threads), so no pidfd or socket says so.
  std::atomic<uint32_t> closed;
  // When ranks outnumber cores: the core its rank last began an op on, plus one (0: not known).
  // A peer waiting for this rank gives up its core at once only if they share it.
  std::atomic<uint32_t> core;
};
static_assert(sizeof(BoardLine) == 64);

// The board's first line: counts the ranks that have set `closed`, so that a woken rank reads the
// flags only when the count has moved.
struct alignas(64) BoardHeader {
  std::atomic<uint64_t> closed_count;
};

// The op a rank has begun, for peers that check whether it is in the same call (and the window's
// "has every peer reached op s"). A seqlock: version is odd while tag is rewritten; seq is stored
// last, with release, so a peer that sees it also sees the tag.
struct alignas(64) OpLine {
  std::atomic<uint64_t> version;
  std::atomic<uint64_t> seq;
  std::atomic<uint64_t> tag[sizeof(OpTag) / 8];
};
static_assert(sizeof(OpTag) % 8 == 0, "the op line copies the tag in words");
static_assert(sizeof(OpLine) == 64, "one cache line per rank");

// A rank's lines of the shared Window (link.h Window::line).
struct alignas(64) WindowLines {
  char line[Window::kLines][Window::kLineBytes];
};
static_assert(sizeof(WindowLines) == Window::kLines * Window::kLineBytes);

inline size_t board_offset(size_t fifo_count) {
  return window_offset(fifo_count) + kWindowBytes;
}
// Each array has one entry per FIFO (at least one per local rank), so that the layout needs no
// other count, and starts on a page.
inline size_t board_array_bytes(size_t fifo_count, size_t entry) {
  return round_up(fifo_count * entry, kPage);
}
struct Board {
  BoardHeader* head = nullptr;
  BoardLine* sleep = nullptr;
  OpLine* ops = nullptr;
  WindowLines* lines = nullptr;
};
inline Board board_at(void* segment, size_t fifo_count) {
  char* b = static_cast<char*>(segment) + board_offset(fifo_count);
  Board board;
  board.head = reinterpret_cast<BoardHeader*>(b);
  b += board_array_bytes(1, sizeof(BoardHeader));
  board.sleep = reinterpret_cast<BoardLine*>(b);
  b += board_array_bytes(fifo_count, sizeof(BoardLine));
  board.ops = reinterpret_cast<OpLine*>(b);
  b += board_array_bytes(fifo_count, sizeof(OpLine));
  board.lines = reinterpret_cast<WindowLines*>(b);
  return board;
}
inline size_t segment_bytes(size_t fifo_count) {
  return board_offset(fifo_count) + board_array_bytes(1, sizeof(BoardHeader)) +
         board_array_bytes(fifo_count, sizeof(BoardLine)) +
         board_array_bytes(fifo_count, sizeof(OpLine)) +
         board_array_bytes(fifo_count, sizeof(WindowLines));
}

}  // namespace ringreduce::transport::shm
