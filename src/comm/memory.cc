// Communicator::alloc and free: memory registered with this host's ranks (the transport's
// window regions, transport/link.h), so that the registered allreduce reads and writes the
// peers' buffers in place. Both are collectives: every rank's outcome goes through an allgather,
// so a rank that fails (out of memory, a pointer alloc() did not return) makes every rank raise
// the error, naming it, instead of leaving its peers waiting; nothing between the allgathers may
// leave a rank early. Registration is all or nothing: the region is registered only if every
// rank mapped every peer's (the tuner then takes large allreduces to the registered algorithm on
// every rank alike).
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "comm/comm_impl.h"
#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {
namespace {

// Largest allocation: far beyond any machine, and below the sizes whose page rounding or
// int64_t exchange would wrap.
constexpr size_t kMaxBytes = size_t{1} << 62;

size_t page_round(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes == 0 ? page : (bytes + page - 1) / page * page;
}

}  // namespace

std::vector<int64_t> CommImpl::gather_i64(const int64_t* mine, size_t k) {
  std::vector<int64_t> all(k * static_cast<size_t>(size_));
  algorithms::Args g;
  g.kind = algorithms::Collective::allgather;
  g.send = mine;
  g.recv = all.data();
  g.count = k;
  g.dtype = DataType::i64;
  call(g, CallOptions{});
  return all;
}

void* CommImpl::alloc(size_t bytes) {
  const std::string me = "rank " + std::to_string(rank_) + ": alloc: ";
  transport::Window* w = size_ > 1 ? transport_->window() : nullptr;
  Allocation a;
  a.bytes = bytes;
  a.region = next_region_++;  // counted whatever happens: every rank counts alike
  a.in_window = w != nullptr;
  std::string why;
  uint64_t offer = 0;
  if (bytes > kMaxBytes) {
    why = "more than 2^62 bytes";
  } else if (w) {
    a.p = w->create_region(a.region, bytes, &offer, &why);
  } else {
    void* p = mmap(nullptr, page_round(bytes), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                   -1, 0);
    if (p == MAP_FAILED) {
      why = std::string("mmap: ") + std::strerror(errno);
    } else {
      a.p = p;
      a.mapping = core::Mapping(p, page_round(bytes));
    }
  }
  // The communicator has failed in an allgather: a region not yet committed is used by nobody.
  auto unwind = [&] {
    if (a.p && a.in_window) w->release_region(a.region);
  };
  allocations_.reserve(allocations_.size() + 1);  // no throw between the allgathers
  // Every rank's (created, offer, bytes).
  const int64_t mine[3] = {a.p != nullptr, static_cast<int64_t>(offer),
                           static_cast<int64_t>(std::min(bytes, kMaxBytes))};
  std::vector<int64_t> all;
  try {
    all = gather_i64(mine, 3);
  } catch (...) {
    unwind();
    throw;
  }
  for (int q = 0; q < size_; ++q) {
    const auto i = 3 * static_cast<size_t>(q);
    if (all[i] != 0) continue;
    unwind();
    throw Error(me + (q == rank_ ? "could not allocate " + std::to_string(bytes) + " bytes: " + why
                                 : "rank " + std::to_string(q) + " could not allocate " +
                                       std::to_string(all[i + 2]) + " bytes (its error says why)"),
                ErrorCode::internal);
  }
  if (w) {
    int64_t ok = 1;
    for (int q = 0; q < size_ && ok; ++q) {
      if (q == rank_) continue;
      const auto i = 3 * static_cast<size_t>(q);
      try {
        if (!w->attach_region(a.region, q, static_cast<uint64_t>(all[i + 1]),
                              static_cast<size_t>(all[i + 2]), &why))
          ok = 0;
      } catch (const std::exception& e) {  // out of memory for the strings: the peers still wait
        why = e.what();
        ok = 0;
      }
      if (!ok)
        RR_LOG(warn, shm, rank_, "alloc: could not map rank ", q, "'s memory (", why,
               "): the memory works, but calls on it are staged as on any other");
    }
    std::vector<int64_t> oks;
    try {
      oks = gather_i64(&ok, 1);
    } catch (...) {
      unwind();
      throw;
    }
    a.shared = std::all_of(oks.begin(), oks.end(), [](int64_t x) { return x != 0; });
    w->commit_region(a.region, a.shared);
    if (!a.shared && ok && rank_ == 0)
      RR_LOG(warn, shm, rank_, "alloc: a rank could not map its peers' memory (its log says why)",
             ": calls on this memory are staged as on any other");
  }
  void* p = a.p;
  allocations_.push_back(std::move(a));
  set_registered();
  return p;
}

void CommImpl::free(void* p) {
  auto it = std::find_if(allocations_.begin(), allocations_.end(),
                         [&](const Allocation& x) { return x.p == p; });
  // The region's id; -1: not from alloc(); -2: null (a no-op when every rank passes null).
  const int64_t mine = p == nullptr               ? -2
                       : it == allocations_.end() ? -1
                                                  : static_cast<int64_t>(it->region);
  // Should it fail, the communicator has failed too, while an op of another thread may still be
  // writing this memory: it is released with the communicator, not here.
  const std::vector<int64_t> all = gather_i64(&mine, 1);
  const std::string me = "rank " + std::to_string(rank_) + ": free: ";
  for (int q = 0; q < size_; ++q) {
    const int64_t id = all[static_cast<size_t>(q)];
    if (id == -1)
      throw InvalidArgument(me + (q == rank_ ? "this pointer was not returned by alloc()"
                                             : "rank " + std::to_string(q) +
                                                   " passed a pointer alloc() did not return"));
    if (id != all[0]) {
      auto name = [](int64_t x) {
        return x == -2 ? std::string("null") : "#" + std::to_string(x + 1);
      };
      throw InvalidArgument(me + "ranks passed memory of different alloc() calls (rank 0: " +
                            name(all[0]) + ", rank " + std::to_string(q) + ": " + name(id) + ")");
    }
  }
  if (mine == -2) return;
  if (it->in_window) transport_->window()->release_region(it->region);
  allocations_.erase(it);  // a private mapping unmaps itself
  set_registered();
}

void CommImpl::set_registered() {
  tuner_->set_registered(std::any_of(allocations_.begin(), allocations_.end(),
                                     [](const Allocation& x) { return x.shared; }));
}

}  // namespace ringreduce::detail
