// What an algorithm is: a schedule of Link primitives for one collective call. Algorithms see
// ranks, links and buffers; they never see sockets or shared pages (docs/ARCHITECTURE.md, Layers),
// and they never choose themselves: the tuner does.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "algorithms/collectives.h"
#include "algorithms/cost.h"
#include "core/deadline.h"
#include "core/timeline.h"
#include "ringreduce/types.h"
#include "transport/link.h"

namespace ringreduce::algorithms {

// One call's arguments. `count` means, per collective:
//   allreduce, broadcast, reduce: elements in the buffer;
//   reduce_scatter, scatter: elements each rank receives (send holds size * count);
//   allgather, gather: elements each rank contributes (recv holds size * count);
//   alltoall: elements sent to each rank (send and recv hold size * count);
//   allgatherv, reduce_scatterv, alltoallv: the total of `counts` (the blocks are in counts).
struct Args {
  Collective kind = Collective::allreduce;
  const void* send = nullptr;
  void* recv = nullptr;
  size_t count = 0;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  int root = 0;
  // Blocks of their own sizes, one per rank, laid out one after another: allgatherv's and
  // reduce_scatterv's (the same on every rank), alltoallv's sends (block j to rank j). Empty for
  // the others.
  std::vector<size_t> counts;
  // alltoallv: the receives (block j from rank j).
  std::vector<size_t> recv_counts;
  // A narrow wire format (the tuner's resolution of CallOptions::wire): the call runs the coded
  // algorithm of its collective (wire_phases.h). Never Wire::automatic here.
  Wire wire = Wire::none;
};

// Everything an algorithm may use while it runs.
struct Context {
  transport::Transport& transport;
  int rank;
  int size;
  core::Deadline deadline;
  size_t segment_bytes;  // pipeline granularity, > 0
  int channels;          // 1 <= channels <= transport.channels()
  bool sliced;           // post ring schedules slice by slice (ring_phases.h post_ring_steps)
  uint64_t seq;          // the op's sequence number (the same on every rank)
  // A scratch buffer of at least `bytes`, owned by the communicator and reused across calls.
  struct Scratch {
    void* (*fn)(void* owner, size_t bytes);
    void* owner;
    void* operator()(size_t bytes) const { return fn(owner, bytes); }
  } scratch;
  // The ring that the ring and chain algorithms run over: ring[p] is the rank at position p,
  // ring_pos[r] the position of rank r. The communicator orders it by host (docs/ARCHITECTURE.md,
  // "Shared memory, and communicators that span hosts": hosts in the order of their lowest rank, a
  // host's ranks in rank order), so each host has one inbound and one outbound network link. Null:
  // rank order.
  const int* ring = nullptr;
  const int* ring_pos = nullptr;
  // Ranks per host when every host has as many (the ring then holds host h at positions
  // h*host_size ..), else 0.
  int host_size = 0;
  // RINGREDUCE_TIMELINE's recorder (null: off).
  core::Timeline* timeline = nullptr;
  // What the registered allreduce runs instead when some rank's buffers are not registered (the
  // tuner's choice without it); null: the ring.
  void (*fallback)(Context&, const Args&) = nullptr;

  transport::Link& link(int peer, int channel = 0) { return transport.link(peer, channel); }
  void wait(transport::Completion& c) { transport.wait(c, deadline); }
  // Marks the start of a part of the algorithm (it lasts until the next mark or the op's end)
  // for the timeline: "reduce-scatter", "allgather". A string literal; costs a test when off.
  void phase(const char* name) {
    if (timeline) timeline->phase(name);
  }
  // This rank's position in the ring, the position of rank r, and the rank at position p.
  int pos() const { return pos_of(rank); }
  int pos_of(int r) const { return ring_pos ? ring_pos[r] : r; }
  int at(int p) const { return ring ? ring[p] : p; }
  int right() const { return at((pos() + 1) % size); }
  int left() const { return at((pos() + size - 1) % size); }
};

using RunFn = void (*)(Context&, const Args&);

// An algorithm and what the tuner needs to know of it (registry.cc lists them all).
struct Algorithm {
  const char* name;  // as RINGREDUCE_ALGO and `ringreduce-perf -a` spell it
  Collective kind;
  uint8_t id;  // carried in every message's tag: ranks must agree on it
  RunFn run;
  // Reads peers' memory through Transport::window(): only for ranks that share one host.
  bool needs_window = false;
  // The largest buffer (bytes of the per-rank count) it takes; larger calls go to the tuner's
  // usual choice even when this one is forced.
  size_t max_bytes = SIZE_MAX;
  // Its predicted time (cost.h); null: the model does not compare it (the tuner runs it only
  // when forced, by its rule, or as its collective's default).
  CostFn cost = nullptr;
  // The kinds of link (KindTraits::name) the tuner considers it on, space-separated: those where
  // it has come within 10% of the best when every algorithm was forced (docs/TUNING.md).
  const char* suits = "";
  // The segment it pipelines with; null: the links' preferred message size.
  SegmentFn segment = nullptr;
  // Takes a call outright when true (an algorithm the model does not describe).
  RuleFn rule = nullptr;

  bool suited_to(const std::string& link_kind) const;
};

// Every algorithm there is, in the order the tuner breaks ties in (the earlier wins).
const std::vector<Algorithm>& all_algorithms();
const Algorithm* find_algorithm(Collective kind, const std::string& name);

// A reduction (allreduce, reduce) on one rank or of no elements: the output is the input, copied
// when out of place. Returns whether the call was one; the algorithms start with it.
inline bool trivial_reduction(const Context& ctx, const Args& a) {
  if (ctx.size != 1 && a.count != 0) return false;
  const size_t bytes = a.count * dtype_size(a.dtype);
  if (a.recv != a.send && bytes > 0) std::memmove(a.recv, a.send, bytes);
  return true;
}

// Calls fn(offset_elems, count_elems) for each segment of `range`, in order. Segments hold whole
// elements, at most max(1, segment_bytes / elem) of them.
template <typename Fn>
void for_each_segment(size_t offset, size_t count, size_t elem, size_t segment_bytes, Fn&& fn) {
  const size_t per = segment_bytes / elem > 0 ? segment_bytes / elem : 1;
  for (size_t done = 0; done < count; done += per)
    fn(offset + done, count - done < per ? count - done : per);
}

// The algorithms (one file each), and the costs they state at their tops.
void ring_allreduce(Context& ctx, const Args& a);
void recursive_doubling_allreduce(Context& ctx, const Args& a);
void ring_reduce_scatter(Context& ctx, const Args& a);
void ring_allgather(Context& ctx, const Args& a);
void chain_broadcast(Context& ctx, const Args& a);
void chain_reduce(Context& ctx, const Args& a);
void pairwise_alltoall(Context& ctx, const Args& a);
void dissemination_barrier(Context& ctx, const Args& a);
void flat_allreduce(Context& ctx, const Args& a);
void flat_barrier(Context& ctx, const Args& a);
void direct_allreduce(Context& ctx, const Args& a);
void registered_allreduce(Context& ctx, const Args& a);
void hierarchical_allreduce(Context& ctx, const Args& a);
void star_allreduce(Context& ctx, const Args& a);  // for the scaling comparison only
void rabenseifner_allreduce(Context& ctx, const Args& a);
void tree_allreduce(Context& ctx, const Args& a);
void binomial_broadcast(Context& ctx, const Args& a);
void binomial_reduce(Context& ctx, const Args& a);
void linear_gather(Context& ctx, const Args& a);
void linear_scatter(Context& ctx, const Args& a);
// The coded collectives (wire_phases.h): float32 with Args::wire set.
void wire_allreduce(Context& ctx, const Args& a);
void wire_reduce_scatter(Context& ctx, const Args& a);
void wire_allgather(Context& ctx, const Args& a);

double ring_allreduce_cost(const CostInputs& in, double k, double segment);
double rd_allreduce_cost(const CostInputs& in, double k, double segment);
double rabenseifner_allreduce_cost(const CostInputs& in, double k, double segment);
double tree_allreduce_cost(const CostInputs& in, double k, double segment);
size_t tree_allreduce_segment(const CostInputs& in, size_t bytes);
double flat_allreduce_cost(const CostInputs& in, double k, double segment);
double direct_allreduce_cost(const CostInputs& in, double k, double segment);
// The registered allreduce takes a call by its rule (from its size; the tuner asks it only while
// the communicator has registered memory): registered memory is not a cost the model compares,
// and Context::fallback serves a call whose buffers turn out not to be registered.
bool registered_allreduce_applies(const CostInputs& in, size_t bytes);
double chain_broadcast_cost(const CostInputs& in, double k, double segment);
double binomial_broadcast_cost(const CostInputs& in, double k, double segment);
double chain_reduce_cost(const CostInputs& in, double k, double segment);
double binomial_reduce_cost(const CostInputs& in, double k, double segment);
// The chains and binomial trees pipeline a quarter of the buffer, 64-512 KiB: their latency grows
// with the segment.
size_t quarter_segment(const CostInputs& in, size_t bytes);
// hierarchical_allreduce: several hosts with L >= 2 ranks each, from 1 MiB.
bool hierarchical_allreduce_applies(const CostInputs& in, size_t bytes);
// A rule that always takes the call (wherever the algorithm suits the links).
inline bool always(const CostInputs&, size_t) {
  return true;
}

}  // namespace ringreduce::algorithms
