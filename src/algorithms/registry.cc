#include "algorithms/algorithm.h"
#include "algorithms/flat_window.h"

namespace ringreduce::algorithms {

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::allreduce:
      return "allreduce";
    case Collective::reduce_scatter:
      return "reduce_scatter";
    case Collective::allgather:
      return "allgather";
    case Collective::broadcast:
      return "broadcast";
    case Collective::reduce:
      return "reduce";
    case Collective::alltoall:
      return "alltoall";
    case Collective::barrier:
      return "barrier";
  }
  return "?";
}

const std::vector<Algorithm>& all_algorithms() {
  // Ids are part of the wire tag; never renumber one, only add.
  static const std::vector<Algorithm> kAll = {
      {"ring", Collective::allreduce, 1, ring_allreduce},
      {"ring", Collective::reduce_scatter, 2, ring_reduce_scatter},
      {"ring", Collective::allgather, 3, ring_allgather},
      {"chain", Collective::broadcast, 4, chain_broadcast},
      {"chain", Collective::reduce, 5, chain_reduce},
      {"pairwise", Collective::alltoall, 6, pairwise_alltoall},
      {"dissemination", Collective::barrier, 7, dissemination_barrier},
      {"rd", Collective::allreduce, 8, recursive_doubling_allreduce},
      {"flat", Collective::allreduce, 9, flat_allreduce, true, flat::kMaxBytes},
      {"flat", Collective::barrier, 10, flat_barrier, true},
      {"direct", Collective::allreduce, 11, direct_allreduce, /*needs_window=*/true},
      {"hierarchical", Collective::allreduce, 12, hierarchical_allreduce},
      {"star", Collective::allreduce, 13, star_allreduce},
      {"rabenseifner", Collective::allreduce, 14, rabenseifner_allreduce},
      {"tree", Collective::allreduce, 15, tree_allreduce},
      {"binomial", Collective::broadcast, 16, binomial_broadcast},
      {"binomial", Collective::reduce, 17, binomial_reduce},
  };
  return kAll;
}

const Algorithm* find_algorithm(Collective kind, const std::string& name) {
  for (const auto& a : all_algorithms())
    if (a.kind == kind && name == a.name) return &a;
  return nullptr;
}

}  // namespace ringreduce::algorithms
