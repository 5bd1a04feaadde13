// Communicator::split: MPI_Comm_split's and ncclCommSplit's semantics. Every rank of the parent
// calls it; one allgather of (color, key) tells each rank its group, ordered by key then by rank;
// each group then starts a communicator of its own through the parent's store, under a prefix no
// other split uses (the number of splits so far, the same on every rank, and the color), so no
// new rendezvous server is needed and groups made at one split never meet.
#include <algorithm>

#include "comm/comm_impl.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {

std::unique_ptr<CommImpl> CommImpl::split(int color, int key) {
  if (!store_)
    throw InvalidArgument("rank " + std::to_string(rank_) +
                          ": split: this communicator has no store (it was made from handles): "
                          "make the groups from handles too");
  if (color < -1)
    throw InvalidArgument("rank " + std::to_string(rank_) + ": split: color " +
                          std::to_string(color) + " is neither >= 0 nor kNoColor (-1)");
  // Every rank's (color, key), through this communicator: a collective like any other, so a rank
  // that does not call split() is a mismatch or a timeout, named as usual.
  const int64_t mine[2] = {color, key};
  const std::vector<int64_t> all = gather_i64(mine, 2);
  const uint64_t id = ++splits_;
  if (color < 0) return nullptr;
  std::vector<int> members;
  for (int q = 0; q < size_; ++q)
    if (all[2 * static_cast<size_t>(q)] == color) members.push_back(q);
  std::stable_sort(members.begin(), members.end(), [&](int x, int y) {
    return all[2 * static_cast<size_t>(x) + 1] < all[2 * static_cast<size_t>(y) + 1];
  });
  const auto me = std::find(members.begin(), members.end(), rank_);
  Options o;
  o.rank = static_cast<int>(me - members.begin());
  o.world_size = static_cast<int>(members.size());
  o.timeout = timeout_.load();
  o.settings = overrides_;
  o.store_prefix = "split" + std::to_string(id) + ".color" + std::to_string(color);
  const SplitFrom from{store_,        stall_store_, store_host_, local_size_,
                       store_server_, nullptr,      job_store_};
  return std::make_unique<CommImpl>(o, &from);
}

}  // namespace ringreduce::detail
