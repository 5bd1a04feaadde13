// What the coded collectives share (CallOptions::wire, docs/WIRE.md): exchanges in which every
// rank sends each peer one block of floats coded narrow and receives one from each, decoded as
// it arrives (added to a float32 sum, or copied). Unlike a ring, no value is coded twice on its
// way: an input is rounded once, on its way to the rank that owns its block, which sums in
// float32; a result is rounded once, by its owner, for the allgather. So an element's error is
// one rounding of each input plus one of the result, however many ranks there are, where a
// ring carrying narrow partial sums rounds at every hop (NCCL's and gloo's f16 and bf16 sums,
// torch's fp16_compress_hook).
//
// Each rank sends the same bytes as a ring would ((N-1)/N of the buffer, coded, per phase), to
// every peer instead of to one; the links code a piece as it goes out and decode one as it comes
// in, so nothing makes a pass over the whole buffer first.
#pragma once

#include "algorithms/algorithm.h"
#include "algorithms/ring_schedule.h"
#include "reduce/wire.h"

namespace ringreduce::algorithms {

// The peer this rank sends to at distance d (1 <= d < n) and the one it receives from: each rank
// starts with its right neighbour, so that no rank is every rank's first destination.
inline int wire_to(const Context& ctx, int d) {
  return (ctx.rank + d) % ctx.size;
}
inline int wire_from(const Context& ctx, int d) {
  return (ctx.rank + ctx.size - d) % ctx.size;
}

// Calls fn(link, offset, count) for every peer p (in the order wire_to, or wire_from when not
// `sending`) and channel: block(p) is p's Range of elements, cut further between the channels.
template <class Block, class Fn>
void for_each_peer_part(Context& ctx, bool sending, Block&& block, Fn&& fn) {
  for (int d = 1; d < ctx.size; ++d) {
    const int peer = sending ? wire_to(ctx, d) : wire_from(ctx, d);
    const Range b = block(peer);
    for (int ch = 0; ch < ctx.channels; ++ch) {
      const Range p = split(b.count, static_cast<size_t>(ctx.channels), static_cast<size_t>(ch));
      fn(ctx.link(peer, ch), b.offset + p.offset, p.count);
    }
  }
}

// Posts, for every peer p, a send of block(p) of `src`, coded.
template <class Block>
void post_coded_sends(Context& ctx, const float* src, Wire wire, Block&& block,
                      transport::Completion* done) {
  for_each_peer_part(ctx, true, block, [&](transport::Link& l, size_t at, size_t n) {
    l.send_coded(src + at, n, wire, done);
  });
}

// Posts, for every peer p, a receive of p's coded block into dst at block(p): added to what is
// there when `add`, else written.
template <class Block>
void post_coded_recvs(Context& ctx, float* dst, bool add, Wire wire, Block&& block,
                      transport::Completion* done) {
  for_each_peer_part(ctx, false, block, [&](transport::Link& l, size_t at, size_t n) {
    l.recv_coded(dst + at, add ? dst + at : nullptr, n, wire, done);
  });
}

}  // namespace ringreduce::algorithms
