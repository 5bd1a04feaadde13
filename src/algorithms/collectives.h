// What each collective is, in one table: its name, whether it has a root and a reduce op, how
// many blocks each buffer holds and on which ranks, how it may run in place, and the algorithm
// that runs it when nothing else is chosen. The communicator validates and describes calls from
// it and the tuner parses RINGREDUCE_ALGO with it, so a new collective is one row here plus its
// algorithm file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ringreduce::algorithms {

// Values travel in every message's tag: never renumber one, only add.
enum class Collective : uint8_t {
  allreduce = 1,
  reduce_scatter = 2,
  allgather = 3,
  broadcast = 4,
  reduce = 5,
  alltoall = 6,
  barrier = 7,
  gather = 8,
  scatter = 9,
  allgatherv = 10,
  reduce_scatterv = 11,
  alltoallv = 12,
};
inline constexpr int kMaxCollective = 12;

// How many blocks of `count` elements a buffer holds.
enum class Blocks : uint8_t {
  none,      // no buffer (barrier)
  one,       // count elements
  per_rank,  // size x count elements, block r for (or from) rank r
  // Blocks of their own sizes (Args::counts; alltoallv's receives: Args::recv_counts).
  own,         // counts[rank] elements: this rank's block
  all_blocks,  // sum(counts) elements, block r for (or from) rank r, one after another
};

// Which ranks pass a buffer.
enum class Holder : uint8_t { all, root, non_root };

// How the call may run in place (send and receive in one buffer).
enum class InPlace : uint8_t {
  same,    // recv == send
  offset,  // the one-block buffer is block `rank` of the per-rank one (NCCL's convention)
  any,     // either
  never,   // send and receive must not overlap
};

struct CollectiveFacts {
  Collective kind;
  const char* name;  // as the API, RINGREDUCE_ALGO and error messages spell it
  bool has_root;
  bool has_op;
  Blocks send_blocks;
  Holder send_on;
  Blocks recv_blocks;
  Holder recv_on;
  InPlace in_place;
  const char* default_algorithm;  // runs when nothing else is chosen (one rank, unmodelled)
};

// The row of a collective; null for a value that is none.
const CollectiveFacts* find_facts(Collective c);
const CollectiveFacts& facts(Collective c);
// Every row, in Collective order.
std::span<const CollectiveFacts> all_facts();
// By name; null if none.
const CollectiveFacts* facts_by_name(const std::string& name);
struct Args;
// Elements of the send buffer a rank passes (0 on a rank that passes none).
size_t send_elements(const Args& a, int rank, int size);
// Elements of the receive buffer a rank passes (0 on a rank that passes none).
size_t recv_elements(const Args& a, int rank, int size);

inline const char* collective_name(Collective c) {
  const CollectiveFacts* f = find_facts(c);
  return f ? f->name : "?";
}

}  // namespace ringreduce::algorithms
