#include "algorithms/collectives.h"

#include "algorithms/algorithm.h"

#include <iterator>

#include "ringreduce/error.h"

namespace ringreduce::algorithms {
namespace {

using B = Blocks;
using H = Holder;
using I = InPlace;

// clang-format off
constexpr CollectiveFacts kFacts[] = {
    // kind                     name              root   op     send         send on    recv         recv on    in place   default
    {Collective::allreduce,      "allreduce",      false, true,  B::one,      H::all,    B::one,      H::all,    I::same,   "ring"},
    // In place: recv is block `rank` of send (recv == send would overwrite block 0 while it may
    // still be on its way to the next rank).
    {Collective::reduce_scatter, "reduce_scatter", false, true,  B::per_rank, H::all,    B::one,      H::all,    I::offset, "ring"},
    // The own block is copied into place before anything arrives: send may be recv or block `rank`.
    {Collective::allgather,      "allgather",      false, false, B::one,      H::all,    B::per_rank, H::all,    I::any,    "ring"},
    // Out of place, the root sends from send and copies it to its recv.
    {Collective::broadcast,      "broadcast",      true,  false, B::one,      H::root,   B::one,      H::all,    I::same,   "chain"},
    {Collective::reduce,         "reduce",         true,  true,  B::one,      H::all,    B::one,      H::root,   I::same,   "chain"},
    {Collective::alltoall,       "alltoall",       false, false, B::per_rank, H::all,    B::per_rank, H::all,    I::never,  "pairwise"},
    {Collective::barrier,        "barrier",        false, false, B::none,     H::all,    B::none,     H::all,    I::same,   "dissemination"},
    // In place at the root: its block of the per-rank buffer is the one-block one.
    {Collective::gather,         "gather",         true,  false, B::one,      H::all,    B::per_rank, H::root,   I::offset, "linear"},
    {Collective::scatter,        "scatter",        true,  false, B::per_rank, H::root,   B::one,      H::all,    I::offset, "linear"},
    // Blocks of their own sizes (Args::counts), the same on every rank.
    {Collective::allgatherv,     "allgatherv",     false, false, B::own,      H::all,    B::all_blocks, H::all,  I::any,    "ring"},
    {Collective::reduce_scatterv, "reduce_scatterv", false, true, B::all_blocks, H::all, B::own,      H::all,    I::offset, "ring"},
    // Sends Args::counts, receives Args::recv_counts: each rank its own.
    {Collective::alltoallv,      "alltoallv",      false, false, B::all_blocks, H::all,  B::all_blocks, H::all,  I::never,  "pairwise"},
};
// clang-format on

}  // namespace

std::span<const CollectiveFacts> all_facts() {
  return kFacts;
}

const CollectiveFacts* find_facts(Collective c) {
  // Rows are in Collective order from 1: a call's lookup is an index, not a search.
  const size_t i = static_cast<size_t>(c) - 1;
  if (i < std::size(kFacts) && kFacts[i].kind == c) return &kFacts[i];
  for (const auto& f : kFacts)
    if (f.kind == c) return &f;
  return nullptr;
}

const CollectiveFacts& facts(Collective c) {
  const CollectiveFacts* f = find_facts(c);
  if (!f) throw InvalidArgument("unknown collective " + std::to_string(static_cast<int>(c)));
  return *f;
}

namespace {
size_t buffer_elements(const Args& a, Blocks blocks, Holder on, int rank, int size, bool receive) {
  const bool here = on == Holder::all || (on == Holder::root) == (rank == a.root);
  if (!here) return 0;
  // alltoallv receives Args::recv_counts; every other collective's blocks are Args::counts.
  const std::vector<size_t>& counts =
      receive && a.kind == Collective::alltoallv ? a.recv_counts : a.counts;
  switch (blocks) {
    case Blocks::none:
      return 0;
    case Blocks::one:
      return a.count;
    case Blocks::per_rank:
      return a.count * static_cast<size_t>(size);
    case Blocks::own:
      return counts.at(static_cast<size_t>(rank));
    case Blocks::all_blocks: {
      size_t n = 0;
      for (size_t c : counts) n += c;
      return n;
    }
  }
  return 0;
}
}  // namespace

size_t send_elements(const Args& a, int rank, int size) {
  const CollectiveFacts& f = facts(a.kind);
  return buffer_elements(a, f.send_blocks, f.send_on, rank, size, false);
}

size_t recv_elements(const Args& a, int rank, int size) {
  const CollectiveFacts& f = facts(a.kind);
  return buffer_elements(a, f.recv_blocks, f.recv_on, rank, size, true);
}

const CollectiveFacts* facts_by_name(const std::string& name) {
  for (const auto& f : kFacts)
    if (name == f.name) return &f;
  return nullptr;
}

}  // namespace ringreduce::algorithms
