// The shared-memory kind's segment (shm_layout.h): made and filled in at creation, its pages
// and the peers' touched before the first op, a peer's checked and mapped when first used. Apart
// from shm_connect.cc, which is how the host's ranks come to hold each other's segments.
#include <errno.h>
#include <linux/membarrier.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <string>

#include "ringreduce/error.h"
#include "transport/shm/shm_kind.h"

namespace ringreduce::transport::shm {
namespace {

// Touches one byte per page: written (the same value, before any peer can see the memory) or
// read. The first access to a page costs 10-20 us on the VMs this was measured on, against
// ~0.02 us after; an op's first use of a page would otherwise pay it.
void touch_pages(const char* p, size_t bytes, bool write) {
  constexpr size_t kPage = 4096;
  volatile char sink = 0;
  for (size_t off = 0; off < bytes; off += kPage) {
    if (write)
      const_cast<volatile char*>(p)[off] = p[off];
    else
      sink = sink + p[off];
  }
}

std::string errstr(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

}  // namespace

ShmKind::ShmKind(const ShmOptions& opts, const core::Deadline& deadline) : opts_(opts) {
  local_ranks_ = opts_.local_ranks;
  if (local_ranks_.empty())
    for (int q = 0; q < opts_.size; ++q) local_ranks_.push_back(q);
  local_index_.assign(static_cast<size_t>(opts_.size), -1);
  for (size_t i = 0; i < local_ranks_.size(); ++i)
    local_index_.at(static_cast<size_t>(local_ranks_[i])) = static_cast<int>(i);
  if (local_index_.at(static_cast<size_t>(opts_.rank)) < 0)
    throw Error("shared-memory transport: this rank is not among the local ranks");
  // One FIFO per local sender and channel, and one for its point-to-point lane, at the sender's
  // local index.
  const size_t nfifos = local_ranks_.size() * stride();
  fifo_count_ = nfifos;
  const size_t total = segment_bytes(nfifos);
  memfd_.reset(memfd_create("ringreduce-shm", MFD_CLOEXEC));
  if (!memfd_.valid()) throw Error(errstr("memfd_create failed"));
  if (ftruncate(memfd_.get(), static_cast<off_t>(total)) != 0)
    throw Error(errstr("sizing the shared-memory segment failed"));
  void* p = mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, memfd_.get(), 0);
  if (p == MAP_FAILED) throw Error(errstr("mapping the shared-memory segment failed"));
  mine_ = Mapping(p, total);
  SegmentHeader* h = mine_.as<SegmentHeader>();
  h->magic = kSegmentMagic;
  h->version = kShmVersion;
  h->owner_rank = opts_.rank;
  h->comm_id = opts_.comm_id;
  h->fifo_count = nfifos;
  h->fifo_stride = kFifoStride;
  h->total_bytes = total;
  h->membarrier_ok =
      syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED, 0, 0) == 0 ? 1 : 0;
  mine_window_ = static_cast<char*>(p) + window_offset(nfifos);
  if (local_ranks_[0] == opts_.rank) board_ = board_at(p, nfifos);
  if (prefault()) touch_own_pages();

  doorbell_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  if (!doorbell_.valid() || !epoll_.valid()) throw Error(errstr("eventfd/epoll creation failed"));
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kDoorbellEvent;
  epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, doorbell_.get(), &ev);

  peers_.resize(static_cast<size_t>(opts_.size));
  ring_.assign(static_cast<size_t>(opts_.size), 0);
  ringing_.reserve(static_cast<size_t>(opts_.size));
  links_.resize(static_cast<size_t>(opts_.size) * stride());
  if (local_ranks_.size() > 1) connect_peers(deadline);
  // The peers have mapped it; nobody needs the fd any more.
  memfd_.reset();
  if (prefault()) touch_peer_pages();
}

// Written with the values they hold: nobody else has mapped the segment yet.
void ShmKind::touch_own_pages() {
  touch_pages(mine_window_, prefault_window_bytes(), /*write=*/true);
  if (!prefault_fifos()) return;
  for (int q : local_ranks_)
    if (q != opts_.rank)
      touch_pages(fifo_at(mine_.get(), fifo_index(q, 0)).data(0), kSlots * kSlotBytes,
                  /*write=*/true);
}

// The peers' windows are only read here. Our FIFO to q (its channel 0, which the ring and the
// rooted collectives use) has its slots written by nobody but us: written with their values.
void ShmKind::touch_peer_pages() {
  for (int q : local_ranks_) {
    if (q == opts_.rank) continue;
    touch_pages(window_of(q), prefault_window_bytes(), /*write=*/false);
    if (prefault_fifos())
      touch_pages(fifo_at(segment(q).get(), fifo_index(opts_.rank, 0)).data(0), kSlots * kSlotBytes,
                  /*write=*/true);
  }
}

ShmKind::~ShmKind() {
  // The peers learn that this communicator is gone even where its process lives on (where its
  // process ends, their pidfds or sockets tell them too): the flag, the board's count (so that a
  // woken peer looks at the flags only when one was raised), their doorbells.
  if (!board_.head) return;
  sleep_line(opts_.rank).closed.store(1, std::memory_order_release);
  board_.head->closed_count.fetch_add(1, std::memory_order_acq_rel);
  for (Peer& p : peers_) {
    if (!p.doorbell.valid()) continue;
    uint64_t one = 1;
    ssize_t ignored = ::write(p.doorbell.get(), &one, sizeof one);
    (void)ignored;
  }
}

bool ShmKind::check_segment(int q, int fd, std::string* why, uint32_t* membarrier_ok) const {
  // Read, not mapped: a mapping costs page tables, and most peers' segments are never used.
  struct stat st {};
  alignas(SegmentHeader) char buf[sizeof(SegmentHeader)];
  if (fstat(fd, &st) != 0 || st.st_size < static_cast<off_t>(kHeaderBytes) ||
      pread(fd, buf, sizeof buf, 0) != static_cast<ssize_t>(sizeof buf)) {
    *why = "unusable segment";
    return false;
  }
  const size_t n = static_cast<size_t>(st.st_size);
  const auto* sh = reinterpret_cast<const SegmentHeader*>(buf);
  if (sh->magic != kSegmentMagic || sh->version != kShmVersion || sh->comm_id != opts_.comm_id ||
      sh->owner_rank != q || sh->total_bytes != n || n != segment_bytes(fifo_count_) ||
      sh->fifo_count != fifo_count_ || sh->fifo_stride != kFifoStride) {
    *why = "segment does not match its hello";
    return false;
  }
  if (membarrier_ok) *membarrier_ok = sh->membarrier_ok;
  return true;
}

const Mapping& ShmKind::segment(int q) {
  Peer& p = peers_[static_cast<size_t>(q)];
  if (p.segment.get()) return p.segment;
  const std::string whose = "rank " + std::to_string(opts_.rank) +
                            ": the shared-memory segment of same-host rank " + std::to_string(q);
  std::string why = "not received";
  if (!p.memfd.valid() || !check_segment(q, p.memfd.get(), &why, nullptr))
    throw Error(whose + ": " + why);
  const size_t n = segment_bytes(fifo_count_);
  void* m = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_SHARED, p.memfd.get(), 0);
  if (m == MAP_FAILED) throw Error(errstr(whose + " could not be mapped"));
  p.segment = Mapping(m, n);
  p.memfd.reset();
  return p.segment;
}

}  // namespace ringreduce::transport::shm
