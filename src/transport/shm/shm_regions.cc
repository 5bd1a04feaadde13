#include "transport/shm/shm_regions.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14
#endif

namespace ringreduce::transport::shm {
namespace {

size_t page_round(size_t bytes) {
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes == 0 ? page : (bytes + page - 1) / page * page;
}

// Maps `bytes` of fd shared and makes every page present and writable now, not at its first
// touch: MADV_POPULATE_WRITE fills the page tables, and a write to every page (an atomic add of
// 0: the region is new and nobody uses it until alloc() returns on every rank, but peers attach
// at once) fills the hypervisor's, which on this project's VM cost 15 us a page at the first
// access through each new mapping even when populated (a 64 MiB allreduce's first call took
// 0.25 s at N = 2 without it).
Mapping map_populated(int fd, size_t bytes, std::string* why) {
  const size_t n = page_round(bytes);
  void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) {
    *why = std::string("mmap: ") + std::strerror(errno);
    return {};
  }
  madvise(p, n, MADV_POPULATE_WRITE);
  const auto page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (size_t at = 0; at < n; at += page)
    __atomic_fetch_add(reinterpret_cast<int*>(static_cast<char*>(p) + at), 0, __ATOMIC_RELAXED);
  return Mapping(p, n);
}

}  // namespace

char* Regions::create(uint32_t id, size_t bytes, uint64_t* offer, std::string* why) {
  if (bytes > (size_t{1} << 62)) {
    *why = "more than 2^62 bytes";
    return nullptr;
  }
  auto r = std::make_unique<Region>();
  r->id = id;
  r->bytes = bytes;
  r->fd.reset(static_cast<int>(
      syscall(SYS_memfd_create, "ringreduce-alloc", MFD_CLOEXEC | MFD_ALLOW_SEALING)));
  if (!r->fd.valid()) {
    *why = std::string("memfd_create: ") + std::strerror(errno);
    return nullptr;
  }
  const auto n = static_cast<off_t>(page_round(bytes));
  // fallocate reserves the pages now, so that memory too short is this error and not, at the
  // first touch below, the OOM killer (or a SIGBUS when tmpfs is full). The seals keep a peer,
  // which may write the memfd, from shrinking it under our mapping.
  if (ftruncate(r->fd.get(), n) != 0 || fallocate(r->fd.get(), 0, 0, n) != 0 ||
      fcntl(r->fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW) != 0) {
    *why = "reserving " + std::to_string(n) + " bytes of shared memory: " + std::strerror(errno);
    return nullptr;
  }
  r->mine = map_populated(r->fd.get(), bytes, why);
  if (!r->mine.get()) return nullptr;
  r->peers.resize(static_cast<size_t>(size_));
  // The descriptor's number, and its inode's low bits: a peer that finds another file behind the
  // number (this rank gone, the number reused) refuses it.
  struct stat st {};
  fstat(r->fd.get(), &st);
  *offer = static_cast<uint64_t>(r->fd.get()) | (static_cast<uint64_t>(st.st_ino) << 32);
  char* p = static_cast<char*>(r->mine.get());
  std::lock_guard<std::mutex> lk(mu_);
  regions_.push_back(std::move(r));
  return p;
}

bool Regions::attach(uint32_t id, int rank, int pid, int pidfd, uint64_t offer, size_t bytes,
                     std::string* why) {
  std::unique_lock<std::mutex> lk(mu_);
  Region* r = lookup(id);
  lk.unlock();  // only this thread changes the region until commit()
  if (!r) {
    *why = "no region " + std::to_string(id);
    return false;
  }
  const auto their_fd = static_cast<int>(offer & 0xffffffffu);
  core::Fd fd;
  std::string tried;
  if (pid > 0) {
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(their_fd);
    fd.reset(open(path.c_str(), O_RDWR | O_CLOEXEC));
    if (!fd.valid()) tried = "open " + path + ": " + std::strerror(errno);
  } else {
    tried = "its pid is not known here";
  }
  if (!fd.valid() && pidfd >= 0) {
    fd.reset(static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, their_fd, 0)));
    if (!fd.valid()) tried += std::string("; pidfd_getfd: ") + std::strerror(errno);
  }
  if (!fd.valid()) {
    *why = tried;
    return false;
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0 || static_cast<size_t>(st.st_size) < bytes ||
      (static_cast<uint64_t>(st.st_ino) & 0xffffffffu) != offer >> 32) {
    *why = "its descriptor " + std::to_string(their_fd) + " is not a region of " +
           std::to_string(bytes) + " bytes";
    return false;
  }
  Mapping m = map_populated(fd.get(), bytes, why);
  if (!m.get()) return false;
  r->peers[static_cast<size_t>(rank)] = std::move(m);
  return true;
}

void Regions::commit(uint32_t id, bool shared) {
  std::vector<Mapping> unused;  // unmapped outside the lock
  std::lock_guard<std::mutex> lk(mu_);
  if (Region* r = lookup(id)) {
    r->shared = shared;
    if (!shared) unused.swap(r->peers);  // never read
    // Every peer has attached (or given up): the mappings keep the memory.
    r->fd.reset();
  }
}

void Regions::release(uint32_t id) {
  std::unique_ptr<Region> gone;  // unmapped outside the lock
  std::lock_guard<std::mutex> lk(mu_);
  for (auto& r : regions_)
    if (r->id == id) {
      gone = std::move(r);
      r = std::move(regions_.back());
      regions_.pop_back();
      break;
    }
}

Window::Region Regions::find(const void* p, size_t bytes) const {
  const auto at = reinterpret_cast<uintptr_t>(p);
  std::lock_guard<std::mutex> lk(mu_);
  for (const auto& r : regions_) {
    const auto base = reinterpret_cast<uintptr_t>(r->mine.get());
    if (r->shared && at >= base && at - base <= r->bytes && bytes <= r->bytes - (at - base))
      return Window::Region{r->id, at - base};
  }
  return {};
}

char* Regions::of(int rank, Window::Region where) const {
  std::lock_guard<std::mutex> lk(mu_);
  const Region* r = lookup(where.id);
  if (!r) return nullptr;
  const Mapping& m = rank == rank_ ? r->mine : r->peers[static_cast<size_t>(rank)];
  return static_cast<char*>(m.get()) + where.offset;
}

Regions::Region* Regions::lookup(uint32_t id) const {
  for (const auto& r : regions_)
    if (r->id == id) return r.get();
  return nullptr;
}

}  // namespace ringreduce::transport::shm
