// Registered memory on one host (transport::Window's regions; Communicator::alloc): each rank's
// allocation is a memfd of its own, mapped by every same-host peer, so that an algorithm reads
// and writes a peer's buffer in place. A peer's memfd is opened through /proc/<pid>/fd/<n> (the
// owner keeps it open until every rank has attached; the same user's processes may), or, where
// that is refused, taken with pidfd_getfd: no descriptor passing, nothing named in /dev/shm, so a
// crash leaves nothing behind. Every mapping is populated when it is made: a page's first touch
// costs 10-20 us on some VMs, which would fall on the first call that uses the region (0.3 s for
// 64 MiB).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/fd.h"
#include "core/mapping.h"
#include "transport/link.h"

namespace ringreduce::transport::shm {

using core::Mapping;  // the shared-memory transport's segments and regions

class Regions {
 public:
  explicit Regions(int rank, int size) : rank_(rank), size_(size) {}
  char* create(uint32_t id, size_t bytes, uint64_t* offer, std::string* why);
  // pid: the peer's process (as this process sees it, 0 if unknown); pidfd: a pidfd of it or -1.
  bool attach(uint32_t id, int rank, int pid, int pidfd, uint64_t offer, size_t bytes,
              std::string* why);
  void commit(uint32_t id, bool shared);
  void release(uint32_t id);
  Window::Region find(const void* p, size_t bytes) const;
  char* of(int rank, Window::Region r) const;

 private:
  struct Region {
    uint32_t id = 0;
    size_t bytes = 0;
    Mapping mine;
    core::Fd fd;                 // open for the peers' /proc/<pid>/fd/<n> until committed
    std::vector<Mapping> peers;  // by rank
    bool shared = false;
  };
  Region* lookup(uint32_t id) const;  // mu_ held

  int rank_, size_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Region>> regions_;
};

}  // namespace ringreduce::transport::shm
