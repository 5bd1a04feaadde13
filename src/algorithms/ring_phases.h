// Pieces the ring collectives share: how a channel's part of a chunk is cut into segments, and
// the allgather half of the ring, which ring_allreduce and ring_allgather post identically.
#pragma once

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"

namespace ringreduce::algorithms {

// For buffers of equal blocks (reduce_scatter, allgather): calls fn(byte_offset, bytes) for each
// segment of channel part `part` (elements within a block) of block `chunk`.
template <typename Fn>
void for_each_block_segment(const Context& ctx, size_t block, const Range& part, int chunk,
                            size_t elem, Fn&& fn) {
  for_each_segment(static_cast<size_t>(chunk) * block + part.offset, part.count, elem,
                   ctx.segment_bytes, [&](size_t off, size_t cnt) { fn(off * elem, cnt * elem); });
}

// The allgather steps: receive each finished chunk into out and pass it on, except at the last
// step, after which it has visited every rank. segments(chunk, fn) enumerates a chunk's segments.
template <typename Segments>
void post_ring_allgather_receives(transport::Link& left, transport::Link& right, int r, int n,
                                  int shift, char* out, Segments&& segments,
                                  transport::Completion* done) {
  for (int t = 0; t < n - 1; ++t) {
    segments(allgather_step(r, n, t, shift).recv_chunk, [&](size_t off, size_t bytes) {
      if (t < n - 2)
        left.recv_copy_send(out + off, bytes, right, done);
      else
        left.recv(out + off, bytes, done);
    });
  }
}

}  // namespace ringreduce::algorithms
