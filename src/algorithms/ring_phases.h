// Pieces the ring collectives share: how a channel's part of the buffer is cut into chunks and
// slices, the order a schedule is posted in, and the allgather step, which ring_allreduce and
// ring_allgather post identically.
#pragma once

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {

// A channel's part of the buffer cut into n chunks, and every chunk into the same number of
// slices of at most segment_bytes. Equal slice counts let a schedule be posted slice by slice:
// slice s of a step on one rank is slice s of the matching step on its neighbour, even where
// chunks differ in length by an element.
class RingCuts {
 public:
  // allreduce: chunk j is split(part.count, n, j), seed 000's near-equal chunks.
  static RingCuts split_chunks(const Range& part, int n, size_t elem, size_t segment_bytes) {
    return RingCuts(part, 0, n, elem, segment_bytes);
  }
  // reduce_scatter, allgather: chunk j is this channel's part of the block of the rank at ring
  // position j (ring[j], or j without a ring).
  static RingCuts blocks(const Range& part, size_t block, int n, size_t elem, size_t segment_bytes,
                         const int* ring = nullptr) {
    RingCuts c(part, block, n, elem, segment_bytes);
    c.ring_ = ring;
    return c;
  }

  size_t slices() const { return slices_; }

  // fn(byte offset, bytes) for slice s of chunk; not called for an empty slice.
  template <typename Fn>
  void slice(int chunk, size_t s, Fn&& fn) const {
    const Range c = chunk_range(chunk);
    const Range p = split(c.count, slices_, s);
    if (p.count > 0) fn((c.offset + p.offset) * elem_, p.count * elem_);
  }

 private:
  RingCuts(const Range& part, size_t block, int n, size_t elem, size_t segment_bytes)
      : part_(part), block_(block), n_(static_cast<size_t>(n)), elem_(elem) {
    // The first chunk is the longest (split gives the remainder to the first chunks).
    const size_t longest = chunk_range(0).count;
    const size_t per = segment_bytes / elem > 0 ? segment_bytes / elem : 1;
    slices_ = (longest + per - 1) / per;
  }
  Range chunk_range(int chunk) const {
    const auto j = static_cast<size_t>(chunk);
    if (block_ > 0) {
      const size_t b = ring_ ? static_cast<size_t>(ring_[chunk]) : j;
      return {b * block_ + part_.offset, part_.count};
    }
    const Range c = split(part_.count, n_, j);
    return {part_.offset + c.offset, c.count};
  }

  Range part_;
  size_t block_;  // 0: chunks are split from part_
  size_t n_;
  size_t elem_;
  size_t slices_ = 0;
  const int* ring_ = nullptr;
};

// Posts step(t, s) for every step t < steps and slice s < slices. Streamed: step by step, each
// step over every slice before the next step; a rank's first sends then run ahead of everything
// it forwards, which suits TCP, where socket buffers absorb them. Sliced (NCCL's order): slice by
// slice, each slice through every step before the next slice, so that on shared memory a slice
// travels the whole ring through a few cache-resident FIFO slots and is forwarded the moment it
// arrives. Either order is correct on any transport (messages leave in posting order); the tuner
// picks (Context::sliced).
template <typename Step>
void post_ring_steps(bool sliced, int steps, size_t slices, Step&& step) {
  if (sliced) {
    for (size_t s = 0; s < slices; ++s)
      for (int t = 0; t < steps; ++t) step(t, s);
  } else {
    for (int t = 0; t < steps; ++t)
      for (size_t s = 0; s < slices; ++s) step(t, s);
  }
}

// Allgather step t (0 <= t < n-1), slice s: receive a finished chunk into out and pass it on,
// except at the last step, after which it has visited every rank.
inline void post_ring_gather_step(transport::Link& left, transport::Link& right,
                                  const RingCuts& cuts, int r, int n, int shift, int t, size_t s,
                                  char* out, transport::Completion* done) {
  cuts.slice(allgather_step(r, n, t, shift).recv_chunk, s, [&](size_t off, size_t bytes) {
    if (t < n - 2)
      left.recv_copy_send(out + off, bytes, right, done);
    else
      left.recv(out + off, bytes, done);
  });
}

}  // namespace ringreduce::algorithms
