#include <sstream>

#include "algorithms/algorithm.h"
#include "algorithms/flat_window.h"

namespace ringreduce::algorithms {

bool Algorithm::suited_to(const std::string& link_kind) const {
  std::istringstream words(suits);
  std::string w;
  while (words >> w)
    if (w == link_kind) return true;
  return false;
}

const std::vector<Algorithm>& all_algorithms() {
  // Ids are part of the wire tag; never renumber one, only add. The order is the tuner's
  // tie-break: on shared memory a window step (a stamp and a cache line) beats a message step
  // (also a FIFO slot); over TCP recursive doubling's lg N steps beat the ring's 2(N-1).
  // Which kinds of link each suits: every algorithm forced at N = 2, 4, 8, 4 B - 256 MiB
  // (docs/algorithms_shm.md, docs/algorithms_tcp.md); recursive doubling, Rabenseifner and the
  // tree never came within 10% of the best on shared memory, where from a few MiB their
  // whole-half steps write every intermediate result to memory and read it back while the ring's
  // fused forwards stay in the caches (the model's one beta cannot see that).
  // clang-format off
  static const std::vector<Algorithm> kAll = {
      // name            kind                       id  run                            window max bytes        cost                         suits      segment                 rule
      {"registered",    Collective::allreduce,     23, registered_allreduce,          true,  SIZE_MAX,        nullptr,                     "shm",     nullptr,                registered_allreduce_applies},
      {"flat",          Collective::allreduce,      9, flat_allreduce,                true,  flat::kMaxBytes, flat_allreduce_cost,         "shm",     nullptr,                nullptr},
      {"direct",        Collective::allreduce,     11, direct_allreduce,              true,  SIZE_MAX,        direct_allreduce_cost,       "shm",     nullptr,                nullptr},
      {"rd",            Collective::allreduce,      8, recursive_doubling_allreduce,  false, SIZE_MAX,        rd_allreduce_cost,           "tcp",     nullptr,                nullptr},
      {"ring",          Collective::allreduce,      1, ring_allreduce,                false, SIZE_MAX,        ring_allreduce_cost,         "shm tcp", nullptr,                nullptr},
      {"rabenseifner",  Collective::allreduce,     14, rabenseifner_allreduce,        false, SIZE_MAX,        rabenseifner_allreduce_cost, "tcp",     nullptr,                nullptr},
      {"tree",          Collective::allreduce,     15, tree_allreduce,                false, SIZE_MAX,        tree_allreduce_cost,         "tcp",     tree_allreduce_segment, nullptr},
      {"hierarchical",  Collective::allreduce,     12, hierarchical_allreduce,        false, SIZE_MAX,        nullptr,                     "tcp",     nullptr,                hierarchical_allreduce_applies},
      // For the ring-against-star scaling comparison only (bench/drivers/scaling.sh,
      // docs/scaling.md): never picked.
      {"star",          Collective::allreduce,     13, star_allreduce,                false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"ring",          Collective::reduce_scatter, 2, ring_reduce_scatter,           false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"ring",          Collective::allgather,      3, ring_allgather,                false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"chain",         Collective::broadcast,      4, chain_broadcast,               false, SIZE_MAX,        chain_broadcast_cost,        "shm tcp", quarter_segment,        nullptr},
      {"binomial",      Collective::broadcast,     16, binomial_broadcast,            false, SIZE_MAX,        binomial_broadcast_cost,     "shm tcp", quarter_segment,        nullptr},
      {"chain",         Collective::reduce,         5, chain_reduce,                  false, SIZE_MAX,        chain_reduce_cost,           "shm tcp", quarter_segment,        nullptr},
      {"binomial",      Collective::reduce,        17, binomial_reduce,               false, SIZE_MAX,        binomial_reduce_cost,        "shm tcp", quarter_segment,        nullptr},
      {"pairwise",      Collective::alltoall,       6, pairwise_alltoall,             false, SIZE_MAX,        nullptr,                     "",        quarter_segment,        nullptr},
      // The barrier is not modelled: on one host the window's is one cache line per rank.
      {"flat",          Collective::barrier,       10, flat_barrier,                  true,  SIZE_MAX,        nullptr,                     "shm",     quarter_segment,        always},
      {"dissemination", Collective::barrier,        7, dissemination_barrier,         false, SIZE_MAX,        nullptr,                     "",        quarter_segment,        nullptr},
      {"linear",        Collective::gather,        18, linear_gather,                 false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"linear",        Collective::scatter,       19, linear_scatter,                false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"ring",          Collective::allgatherv,    20, ring_allgather,                false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"ring",          Collective::reduce_scatterv, 21, ring_reduce_scatter,         false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"pairwise",      Collective::alltoallv,     22, pairwise_alltoall,             false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      // The coded collectives run a call with Args::wire set, and only those (Tuner::choose).
      {"wire",          Collective::allreduce,     24, wire_allreduce,                false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"wire",          Collective::reduce_scatter, 25, wire_reduce_scatter,          false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
      {"wire",          Collective::allgather,     26, wire_allgather,                false, SIZE_MAX,        nullptr,                     "",        nullptr,                nullptr},
  };
  // clang-format on
  return kAll;
}

const Algorithm* find_algorithm(Collective kind, const std::string& name) {
  for (const auto& a : all_algorithms())
    if (a.kind == kind && name == a.name) return &a;
  return nullptr;
}

}  // namespace ringreduce::algorithms
