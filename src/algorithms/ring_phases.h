// Pieces the ring collectives share: how a channel's part of the buffer is cut into chunks and
// slices, the order a schedule is posted in, and the allgather step, which ring_allreduce and
// ring_allgather post identically.
#pragma once

#include <algorithm>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {

// A channel's part of the buffer cut into n chunks, and every chunk into the same number of
// slices of at most segment_bytes. Equal slice counts let a schedule be posted slice by slice:
// slice s of a step on one rank is slice s of the matching step on its neighbour, even where
// chunks differ in length by an element.
class RingCuts {
 public:
  // allreduce: chunk j is split(part.count, n, j), near-equal chunks (ring_schedule.h).
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
  // The same with blocks of their own sizes (allgatherv, reduce_scatterv): block r holds
  // blocks[r] elements at element offset `offsets[r]`; this channel's part of each is
  // split(blocks[r], channels, channel).
  static RingCuts uneven_blocks(const std::vector<size_t>& blocks,
                                const std::vector<size_t>& offsets, int channels, int channel,
                                int n, size_t elem, size_t segment_bytes, const int* ring) {
    RingCuts c;
    c.n_ = static_cast<size_t>(n);
    c.elem_ = elem;
    c.ring_ = ring;
    c.uneven_ = &blocks;
    c.offsets_ = &offsets;
    c.channels_ = static_cast<size_t>(channels);
    c.channel_ = static_cast<size_t>(channel);
    size_t longest = 0;
    for (int j = 0; j < n; ++j) longest = std::max(longest, c.chunk_range(j).count);
    c.set_slices(longest, segment_bytes);
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
  RingCuts() = default;
  RingCuts(const Range& part, size_t block, int n, size_t elem, size_t segment_bytes)
      : part_(part), block_(block), n_(static_cast<size_t>(n)), elem_(elem) {
    // The first chunk is the longest (split gives the remainder to the first chunks).
    set_slices(chunk_range(0).count, segment_bytes);
  }
  void set_slices(size_t longest, size_t segment_bytes) {
    const size_t per = segment_bytes / elem_ > 0 ? segment_bytes / elem_ : 1;
    slices_ = (longest + per - 1) / per;
  }
  Range chunk_range(int chunk) const {
    const auto j = static_cast<size_t>(chunk);
    if (uneven_) {
      const size_t b = ring_ ? static_cast<size_t>(ring_[chunk]) : j;
      const Range p = split((*uneven_)[b], channels_, channel_);
      return {(*offsets_)[b] + p.offset, p.count};
    }
    if (block_ > 0) {
      const size_t b = ring_ ? static_cast<size_t>(ring_[chunk]) : j;
      return {b * block_ + part_.offset, part_.count};
    }
    const Range c = split(part_.count, n_, j);
    return {part_.offset + c.offset, c.count};
  }

  Range part_;
  size_t block_ = 0;  // 0: chunks are split from part_
  size_t n_ = 0;
  size_t elem_ = 1;
  size_t slices_ = 0;
  const int* ring_ = nullptr;
  // Uneven blocks (uneven_blocks()): sizes and element offsets by rank, and this channel.
  const std::vector<size_t>* uneven_ = nullptr;
  const std::vector<size_t>* offsets_ = nullptr;
  size_t channels_ = 1;
  size_t channel_ = 0;
};

// Element offsets of blocks laid out one after another.
inline std::vector<size_t> offsets_of(const std::vector<size_t>& blocks) {
  std::vector<size_t> off(blocks.size(), 0);
  for (size_t i = 1; i < blocks.size(); ++i) off[i] = off[i - 1] + blocks[i - 1];
  return off;
}

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

// A ring of n ranks (the whole communicator, or a group of it) as one rank sees it.
struct RingView {
  int n;    // members
  int pos;  // this rank's position
  transport::Link* left;
  transport::Link* right;
};

enum class RingPhases { reduce_scatter, allgather, both };

// Posts a ring allreduce of the `part` elements (offset and count into in and out, chunked
// split(part, n, j), ring_schedule.h) over ring v, or one half of it:
//   reduce_scatter: the rank at position p ends with chunk owned_chunk(p, n) fully reduced in out
//     (other chunks of out hold partial sums or nothing);
//   allgather: every rank sends its owned chunk from out and receives the others into out;
//   both: the allreduce, its halves fused (the completed chunk leaves at once).
// `last` is the reduction of the step that completes a chunk (it divides for avg). With `both`,
// `gathered` (when given) counts the allgather's primitives instead of `done`: waiting for `done`
// and then for `gathered` tells the two halves apart on the timeline, the schedule unchanged.
inline void post_ring_allreduce(const RingView& v, const char* in, char* out, const Range& part,
                                size_t elem, size_t segment_bytes, bool sliced,
                                const transport::Reduction& step, const transport::Reduction& last,
                                RingPhases phases, transport::Completion* done,
                                transport::Completion* gathered = nullptr) {
  const int n = v.n, r = v.pos;
  transport::Link& right = *v.right;
  transport::Link& left = *v.left;
  const RingCuts cuts = RingCuts::split_chunks(part, n, elem, segment_bytes);
  if (phases == RingPhases::allgather) {
    // Step 0 sends the chunk we own; steps 1..n-1 are the allgather steps 0..n-2.
    post_ring_steps(sliced, n, cuts.slices(), [&](int step_index, size_t s) {
      if (step_index == 0)
        cuts.slice(allgather_step(r, n, 0).send_chunk, s,
                   [&](size_t off, size_t bytes) { right.send(out + off, bytes, done); });
      else
        post_ring_gather_step(left, right, cuts, r, n, 0, step_index - 1, s, out, done);
    });
    return;
  }
  const bool gather = phases == RingPhases::both;
  // Steps: 0 sends our own contribution to the first chunk; 1..n-1 are reduce-scatter steps
  // 0..n-2 (receive a chunk, reduce our contribution into it, pass it on); n..2n-2 are the
  // allgather steps. At reduce-scatter step n-2 the chunk is complete ((r + 1) mod n, the one
  // we own) and, in the fused allreduce, passing it on is the first step of the allgather.
  post_ring_steps(sliced, gather ? 2 * n - 1 : n, cuts.slices(), [&](int step_index, size_t s) {
    if (step_index == 0) {
      cuts.slice(reduce_scatter_step(r, n, 0).send_chunk, s,
                 [&](size_t off, size_t bytes) { right.send(in + off, bytes, done); });
    } else if (step_index < n) {
      const int t = step_index - 1;
      const bool final = t == n - 2;
      const transport::Reduction& red = final ? last : step;
      cuts.slice(reduce_scatter_step(r, n, t).recv_chunk, s, [&](size_t off, size_t bytes) {
        if (final && !gather) {
          left.recv_reduce(out + off, in + off, bytes, red, done);
        } else {
          // Only the chunk completed at the last step stays in out; the others are overwritten
          // by the allgather, so their partial sums need not touch it.
          left.recv_reduce_send(out + off, in + off, bytes, red, right, final, done);
        }
      });
    } else {
      post_ring_gather_step(left, right, cuts, r, n, 0, step_index - n, s, out,
                            gathered ? gathered : done);
    }
  });
}

}  // namespace ringreduce::algorithms
