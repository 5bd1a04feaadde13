// What the flat collectives share: their layout of the shared window (transport/link.h) and the
// publish-and-wait step. Every rank has two areas, used by ops of even and odd sequence numbers;
// an area is one of the rank's window lines, holding the stamp (the sequence number of the op that
// wrote it, stored last with release), the op's fingerprint and payloads of up to 48 bytes, and a
// 64 KiB part of its region for larger payloads. The lines of every rank lie together, so a small
// message costs a reader one cache line per peer, all in a few pages.
//
// Reuse: a rank rewrites an area two ops after it last wrote it, and waits first until every peer
// has begun the op in between (Window::wait_all_reached), by which time every peer has finished
// reading it. After a flat op that guard is free: reading every peer's stamp proved it.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/peer_wait.h"
#include "algorithms/window_areas.h"

namespace ringreduce::algorithms::flat {

inline constexpr size_t kAreaBytes = 64 << 10;
// Payloads up to this size travel in the line, beside the stamp.
inline constexpr size_t kLinePayload = transport::Window::kLineBytes - 16;
// The largest payload a flat collective can carry. The tuner keeps to it.
inline constexpr size_t kMaxBytes = kAreaBytes - 16;
static_assert(2 * kAreaBytes == window_areas::kFlatBytes);
static_assert(2 * kAreaBytes <= transport::Window::kHotBytes,
              "the areas lie where the transport makes the window resident at creation");

struct Area {
  char* line;  // stamp, fingerprint, small payload
  transport::Window* w;
  int q, my_rank;
  size_t offset;  // of the part of q's region for larger payloads
  std::atomic_ref<uint64_t> stamp() const { return std::atomic_ref<uint64_t>(words()[0]); }
  std::atomic_ref<uint64_t> fingerprint() const { return std::atomic_ref<uint64_t>(words()[1]); }
  // Where a payload of `bytes` is (every rank of an op has the same size). Only a large one
  // touches q's region (a mapping of its own, made on first use).
  char* payload(size_t bytes) const {
    if (bytes <= kLinePayload) return line + 16;
    return (q == my_rank ? w->mine() : const_cast<char*>(w->of(q))) + offset;
  }
  uint64_t* words() const { return reinterpret_cast<uint64_t*>(line); }
};

// This op's area of rank q (ours when q is our rank).
inline Area area(transport::Window& w, int q, int my_rank, uint64_t seq) {
  const int which = static_cast<int>(seq % 2);
  return Area{w.line(q, which), &w, q, my_rank, static_cast<size_t>(which) * kAreaBytes};
}

// Writes bytes of src as this rank's payload for op ctx.seq and stamps it.
inline void publish(Context& ctx, transport::Window& w, const void* src, size_t bytes) {
  // Everyone has finished reading what we wrote in this area two ops ago.
  w.wait_all_reached(ctx.seq - 1, ctx.deadline);
  const Area mine = area(w, ctx.rank, ctx.rank, ctx.seq);
  if (bytes > 0) std::memcpy(mine.payload(bytes), src, bytes);
  mine.fingerprint().store(w.fingerprint(), std::memory_order_relaxed);
  mine.stamp().store(ctx.seq, std::memory_order_release);
  w.notify();
}

// Waits until every peer has stamped this op's area (then every peer has begun this op); a
// MismatchError if one did so in another call.
inline void wait_for_all(Context& ctx, transport::Window& w) {
  wait_all_peers(ctx, w, [&](int q) {
    return [&w, q, seq = ctx.seq, a = area(w, q, ctx.rank, ctx.seq)] {
      if (a.stamp().load(std::memory_order_acquire) != seq) return false;
      if (a.fingerprint().load(std::memory_order_relaxed) != w.fingerprint()) w.mismatch(q);
      return true;
    };
  });
  w.note_all_reached(ctx.seq);
}

}  // namespace ringreduce::algorithms::flat
