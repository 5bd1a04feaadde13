// Device links (device_kind.h): the control blocks, the inboxes, and the stream's work retired in
// order and published.
#include "transport/device/device_kind.h"

#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/pidfd.h"
#include "ringreduce/error.h"

namespace ringreduce::transport::device {
namespace {

template <typename T>
T load(const T& word) {
  return std::atomic_ref<T>(const_cast<T&>(word)).load(std::memory_order_acquire);
}
template <typename T>
void store(T& word, T value) {
  std::atomic_ref<T>(word).store(value, std::memory_order_release);
}

std::string rank_text(int r) {
  return "rank " + std::to_string(r);
}

core::Mapping map_block(int fd, size_t bytes, const std::string& what) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED) throw Error("device links: mapping " + what + ": " + std::strerror(errno));
  return core::Mapping(p, bytes);
}

// Rank q's published part: "<pid>|<block fd>|<bell fd>|<pid namespace>".
struct Published {
  pid_t pid = 0;
  int block = -1, bell = -1;
};
bool parse(const std::string& v, Published* out) {
  unsigned long pid = 0;
  int block = -1, bell = -1;
  if (std::sscanf(v.c_str(), "%lu|%d|%d|", &pid, &block, &bell) != 3) return false;
  out->pid = static_cast<pid_t>(pid);
  out->block = block;
  out->bell = bell;
  return true;
}

}  // namespace

// ---- the listener ------------------------------------------------------------------------------

DeviceListener::DeviceListener()
    : block(memfd_create("ringreduce-device-links", MFD_CLOEXEC)),
      bell(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      pidns_(core::pidfd_namespace()) {
  if (!block.valid() || !bell.valid())
    throw Error(std::string("device links: memfd/eventfd: ") + std::strerror(errno));
}

std::string DeviceListener::published() const {
  return std::to_string(getpid()) + "|" + std::to_string(block.get()) + "|" +
         std::to_string(bell.get()) + "|" + pidns_;
}

// ---- the kind ----------------------------------------------------------------------------------

DeviceKind::DeviceKind(const DeviceOptions& options, const core::Deadline& deadline)
    : opts_(options), runtime_(reduce::device_runtime()) {
  traits_.name = "device";
  traits_.segment_bytes = opts_.slot_bytes;
  traits_.memory = memory_mask(MemorySpace::device);
  // Until the device check measures them: a step's launch and host round trip, and a copy rate.
  traits_.costs.alpha = 20e-6;
  traits_.costs.beta = 1.0 / 1e12;
  block_fd_ = std::move(opts_.listener->block);
  bell_ = std::move(opts_.listener->bell);
  const size_t bytes = block_bytes(opts_.size);
  if (ftruncate(block_fd_.get(), static_cast<off_t>(bytes)) != 0)
    throw Error(std::string("device links: sizing the control block: ") + std::strerror(errno));
  block_ = map_block(block_fd_.get(), bytes, "this rank's control block");
  device_ = runtime_.current_device();
  peers_.resize(static_cast<size_t>(opts_.size));
  for (int q : opts_.peers) {
    Published pub;
    if (!parse(opts_.published[static_cast<size_t>(q)], &pub))
      throw Error("device links: " + rank_text(q) + " published no device link");
    auto p = std::make_unique<Peer>();
    p->pid = pub.pid;
    p->pidfd.reset(core::pidfd_open(pub.pid));
    std::string why;
    core::Fd block = core::take_peer_fd(pub.pid, p->pidfd.get(), pub.block, &why);
    if (block.valid()) p->bell = core::take_peer_fd(pub.pid, p->pidfd.get(), pub.bell, &why);
    if (!block.valid() || !p->bell.valid())
      throw Error("device links: " + rank_text(opts_.rank) + " cannot reach " + rank_text(q) +
                  "'s descriptors (" + why + ")");
    // The peer sizes its block in its own connect: wait for it, as for any start-up step.
    for (;;) {
      struct stat st {};
      if (fstat(block.get(), &st) == 0 && static_cast<size_t>(st.st_size) >= bytes) break;
      if (deadline.expired())
        throw TimeoutError("device links: " + rank_text(q) + " did not set up its control block");
      if (opts_.check_failed) opts_.check_failed();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    p->block = map_block(block.get(), bytes, rank_text(q) + "'s control block");
    p->link = std::make_unique<DeviceLink>(*this, q);
    links_.push_back(p->link.get());
    peers_[static_cast<size_t>(q)] = std::move(p);
  }
  // Last: a constructor that throws above leaves no stream behind (the destructor would not run).
  stream_ = runtime_.create_stream();
}

DeviceKind::~DeviceKind() {
  drain();
  // The links' inboxes and mappings go before the stream.
  links_.clear();
  peers_.clear();
  spare_events_.clear();
  runtime_.destroy_stream(stream_);
}

DeviceKind::Peer& DeviceKind::peer(int q) const {
  const Peer* p = q >= 0 && q < opts_.size ? peers_[static_cast<size_t>(q)].get() : nullptr;
  if (!p)
    throw Error("device links: no device link from " + rank_text(opts_.rank) + " to " +
                rank_text(q));
  return const_cast<Peer&>(*p);
}

Entry& DeviceKind::my_entry(int sender) const {
  auto* base = static_cast<char*>(block_.get()) + sizeof(Header);
  return reinterpret_cast<Entry*>(base)[sender];
}

Entry& DeviceKind::entry_of(int owner) const {
  auto* base = static_cast<char*>(peer(owner).block.get()) + sizeof(Header);
  return reinterpret_cast<Entry*>(base)[opts_.rank];
}

Link& DeviceKind::link(int q, int) {
  return *peer(q).link;
}

Link& DeviceKind::lane(int q) {
  throw Error("device links carry no point-to-point messages (" + rank_text(q) +
              "): they are staged through host memory");
}

std::unique_ptr<reduce::DeviceRuntime::Event> DeviceKind::take_event() {
  if (spare_events_.empty()) return runtime_.event();
  auto e = std::move(spare_events_.back());
  spare_events_.pop_back();
  return e;
}

void DeviceKind::enqueued(std::shared_ptr<Item> item, DeviceLink* freed_on, DeviceLink* filled_on,
                          uint64_t filled_bytes) {
  InFlight f;
  f.event = take_event();
  f.event->record(stream_);
  ++item->pending;
  f.item = std::move(item);
  f.freed_on = freed_on;
  f.filled_on = filled_on;
  f.filled_bytes = filled_bytes;
  f.filled_tag = f.item->tag;
  in_flight_.push_back(std::move(f));
}

void DeviceKind::ring(int q) {
  Peer& p = peer(q);
  const auto& h = *p.block.as<Header>();
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (load(h.sleeping) != 0) {
    const uint64_t one = 1;
    (void)!write(p.bell.get(), &one, sizeof one);
  }
}

bool DeviceKind::retire() {
  bool moved = false;
  while (!in_flight_.empty() && in_flight_.front().event->done()) {
    InFlight f = std::move(in_flight_.front());
    in_flight_.pop_front();
    moved = true;
    if (DeviceLink* l = f.freed_on) {
      store(l->in_->freed, load(l->in_->freed) + 1);
      ring(l->peer_);
    }
    if (DeviceLink* l = f.filled_on) {
      Entry& e = *l->out_;
      const uint64_t n = load(e.filled);
      SlotMeta& m = e.meta[n % kSlots];
      m.bytes = f.filled_bytes;
      m.tag = f.filled_tag;
      store(e.filled, n + 1);
      ring(l->peer_);
    }
    Item& it = *f.item;
    if (--it.pending == 0 && it.enqueued == it.bytes) --it.c->outstanding;
    spare_events_.push_back(std::move(f.event));
  }
  return moved;
}

bool DeviceKind::poll(bool) {
  if (aborted_) return false;
  bool moved = retire();
  for (DeviceLink* l : links_) {
    if (l->sends_.empty() && l->recvs_.empty()) continue;
    if (!device_set_) {
      runtime_.set_current_device(device_);
      device_set_ = true;
    }
    moved |= l->advance();
  }
  return moved;
}

void DeviceKind::check_idle() {
  for (size_t q = 0; q < peers_.size(); ++q) {
    const Peer* p = peers_[q].get();
    if (!p || (p->link->sends_.empty() && p->link->recvs_.empty())) continue;
    const int r = static_cast<int>(q);
    if (p->pidfd.valid() && core::pidfd_exited(p->pidfd.get()))
      throw PeerError("device links: " + rank_text(r) + "'s process exited", r);
    if (load(entry_of(r).owner_aborted) != 0 || load(my_entry(r).sender_aborted) != 0)
      throw PeerError("device links: " + rank_text(r) + " failed its device links", r);
  }
}

int DeviceKind::prepare_sleep() {
  // Nothing wakes the host when the stream passes an event: while work is on it, look again soon.
  if (!in_flight_.empty()) return 1;
  auto& h = *block_.as<Header>();
  std::atomic_ref<uint32_t>(h.sleeping).store(1, std::memory_order_seq_cst);
  return 1000;
}

void DeviceKind::end_sleep() {
  store(block_.as<Header>()->sleeping, 0u);
}

void DeviceKind::handle_events() {
  uint64_t n = 0;
  while (read(bell_.get(), &n, sizeof n) == static_cast<ssize_t>(sizeof n)) {
  }
}

int DeviceKind::stuck_peer(bool* sending) const {
  for (size_t q = 0; q < peers_.size(); ++q)
    if (peers_[q] && !peers_[q]->link->recvs_.empty()) {
      *sending = false;
      return static_cast<int>(q);
    }
  for (size_t q = 0; q < peers_.size(); ++q)
    if (peers_[q] && !peers_[q]->link->sends_.empty()) {
      *sending = true;
      return static_cast<int>(q);
    }
  return -1;
}

void DeviceKind::drain() {
  // The stream holds copies and kernels only (never a wait on a peer): it finishes on its own.
  // Until it has, user buffers may still be written, so the op may not end before.
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!in_flight_.empty() && std::chrono::steady_clock::now() < until) {
    try {
      if (!in_flight_.back().event->done()) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
        continue;
      }
    } catch (...) {
      // A failed stream has stopped.
    }
    break;
  }
  in_flight_.clear();
}

void DeviceKind::abort(int, int, const std::string&) {
  if (aborted_) return;
  aborted_ = true;
  drain();
  for (size_t q = 0; q < peers_.size(); ++q) {
    Peer* p = peers_[q].get();
    if (!p) continue;
    p->link->sends_.clear();
    p->link->recvs_.clear();
    const int r = static_cast<int>(q);
    store(my_entry(r).owner_aborted, uint64_t{1});
    store(entry_of(r).sender_aborted, uint64_t{1});
    ring(r);
  }
}

// ---- the links ---------------------------------------------------------------------------------

std::shared_ptr<Item> DeviceLink::post(Item item, Completion* c) {
  if (kind_.aborted_) throw Error("device links: posted after the communicator failed");
  auto it = std::make_shared<Item>(item);
  it->tag = kind_.tag_;
  it->c = c;
  ++c->outstanding;
  if (it->bytes == 0) {
    // Nothing travels: the peer's matching primitive is empty too.
    --c->outstanding;
    return nullptr;
  }
  return it;
}

void DeviceLink::send(const void* src, size_t bytes, Completion* c) {
  Item i;
  i.type = Item::Type::send;
  i.src = static_cast<const char*>(src);
  i.bytes = bytes;
  if (auto it = post(i, c)) sends_.push_back(std::move(it));
}

void DeviceLink::recv(void* dst, size_t bytes, Completion* c) {
  Item i;
  i.type = Item::Type::recv;
  i.dst = static_cast<char*>(dst);
  i.bytes = bytes;
  if (auto it = post(i, c)) recvs_.push_back(std::move(it));
}

void DeviceLink::recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                             Completion* c) {
  Item i;
  i.type = Item::Type::recv_reduce;
  i.dst = static_cast<char*>(dst);
  i.local = static_cast<const char*>(local);
  i.bytes = bytes;
  i.red = r;
  if (auto it = post(i, c)) recvs_.push_back(std::move(it));
}

void DeviceLink::recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r,
                                  Link& next, bool keep, Completion* c) {
  Item i;
  i.type = Item::Type::reduce_send;
  i.dst = static_cast<char*>(dst);
  i.local = static_cast<const char*>(local);
  i.bytes = bytes;
  i.red = r;
  i.keep = keep;
  i.next = &dynamic_cast<DeviceLink&>(next);
  if (auto it = post(i, c)) {
    // Its place on next is taken now, as on every link (link.h).
    i.next->sends_.push_back(it);
    recvs_.push_back(std::move(it));
  }
}

void DeviceLink::recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) {
  Item i;
  i.type = Item::Type::copy_send;
  i.dst = static_cast<char*>(dst);
  i.bytes = bytes;
  i.next = &dynamic_cast<DeviceLink&>(next);
  if (auto it = post(i, c)) {
    i.next->sends_.push_back(it);
    recvs_.push_back(std::move(it));
  }
}

void DeviceLink::send_coded(const float*, size_t, Wire, Completion*) {
  throw Error("device links carry no coded messages (staged through host memory instead)");
}
void DeviceLink::recv_coded(float*, const float*, size_t, Wire, Completion*) {
  throw Error("device links carry no coded messages (staged through host memory instead)");
}
void* DeviceLink::reserve_forward(const void*, size_t, Completion*) {
  throw Error("device links forward only to device links");
}
void DeviceLink::forward_ready(void*, size_t) {
  throw Error("device links forward only to device links");
}

bool DeviceLink::remote_ready() {
  if (remote_) return true;
  if (!out_) out_ = &kind_.entry_of(peer_);
  if (load(out_->ready) == 0) return false;  // the peer makes its inbox at its first receive
  auto& p = kind_.peer(peer_);
  std::string why;
  core::Fd fd = core::take_peer_fd(p.pid, p.pidfd.get(), out_->fd, &why);
  if (!fd.valid())
    throw PeerError("device links: cannot take " + rank_text(peer_) + "'s inbox (" + why + ")",
                    peer_);
  remote_ = kind_.runtime_.import_memory(fd.get(), out_->inbox_bytes);
  return true;
}

bool DeviceLink::room() const {
  return posted_ - load(out_->freed) < kSlots;
}

char* DeviceLink::remote_slot(uint64_t n) const {
  return remote_->data() + (n % kSlots) * kind_.opts_.slot_bytes;
}

void DeviceLink::ensure_inbox() {
  if (inbox_) return;
  in_ = &kind_.my_entry(peer_);
  inbox_ = kind_.runtime_.shared_memory(kSlots * kind_.opts_.slot_bytes);
  inbox_fd_ = inbox_->export_fd();
  in_->fd = inbox_fd_.get();
  in_->inbox_bytes = inbox_->size();
  in_->slot_bytes = kind_.opts_.slot_bytes;
  store(in_->ready, 1u);
  kind_.ring(peer_);
}

bool DeviceLink::available() const {
  return load(in_->filled) > consumed_;
}

char* DeviceLink::inbox_slot(uint64_t n) const {
  return inbox_->data() + (n % kSlots) * kind_.opts_.slot_bytes;
}

void DeviceLink::check_slot(const Item& it, size_t chunk) const {
  const SlotMeta& m = in_->meta[consumed_ % kSlots];
  if (!(m.tag == it.tag))
    throw MismatchError("mismatched call: " + rank_text(peer_) + " issued " +
                        kind_.describe(m.tag) + " where " + rank_text(kind_.opts_.rank) +
                        " issued " + kind_.describe(it.tag));
  if (m.bytes != chunk)
    throw PeerError("device links: " + rank_text(peer_) + " sent " + std::to_string(m.bytes) +
                        " bytes where " + std::to_string(chunk) + " were expected",
                    peer_);
}

bool DeviceLink::advance() {
  bool moved = false;
  if (!recvs_.empty()) ensure_inbox();
  // Sends of our own at the head of the queue (a forward at the head moves with its receive).
  while (!sends_.empty() && sends_.front()->type == Item::Type::send) {
    Item& it = *sends_.front();
    moved |= advance_send(it);
    if (it.enqueued < it.bytes) break;
    sends_.pop_front();
  }
  while (!recvs_.empty()) {
    Item& it = *recvs_.front();
    moved |= advance_recv(it);
    if (it.enqueued < it.bytes) break;
    if (it.next) it.next->sends_.pop_front();
    recvs_.pop_front();
  }
  return moved;
}

bool DeviceLink::advance_send(Item& it) {
  bool moved = false;
  const size_t slot = kind_.opts_.slot_bytes;
  auto& rt = kind_.runtime_;
  while (it.enqueued < it.bytes && remote_ready() && room()) {
    const size_t n = std::min(slot, it.bytes - it.enqueued);
    rt.copy(remote_slot(posted_), it.src + it.enqueued, n, kind_.stream_);
    ++posted_;
    it.enqueued += n;
    kind_.enqueued(sends_.front(), nullptr, this, n);
    moved = true;
  }
  return moved;
}

bool DeviceLink::advance_recv(Item& it) {
  bool moved = false;
  const size_t slot = kind_.opts_.slot_bytes;
  auto& rt = kind_.runtime_;
  void* s = kind_.stream_;
  DeviceLink* next = it.next;
  const size_t elem = dtype_size(it.red.dtype);
  while (it.enqueued < it.bytes && available()) {
    // A forward goes out in its turn on next: behind what was posted there before it.
    if (next && (next->sends_.front().get() != &it || !next->remote_ready() || !next->room()))
      break;
    const size_t n = std::min(slot, it.bytes - it.enqueued);
    check_slot(it, n);
    const char* in = inbox_slot(consumed_);
    char* dst = it.dst ? it.dst + it.enqueued : nullptr;
    const char* local = it.local ? it.local + it.enqueued : nullptr;
    const size_t count = n / elem;
    switch (it.type) {
      case Item::Type::send:
        break;
      case Item::Type::recv:
        rt.copy(dst, in, n, s);
        break;
      case Item::Type::recv_reduce:
        rt.combine(dst, local, in, count, it.red.dtype, it.red.op, s);
        if (it.red.divide_by > 1) rt.divide(dst, dst, count, it.red.dtype, it.red.divide_by, s);
        break;
      case Item::Type::reduce_send: {
        char* out = next->remote_slot(next->posted_);
        if (it.keep)
          rt.combine2(out, dst, local, in, count, it.red.dtype, it.red.op, s);
        else
          rt.combine(out, local, in, count, it.red.dtype, it.red.op, s);
        if (it.red.divide_by > 1) {
          rt.divide(out, out, count, it.red.dtype, it.red.divide_by, s);
          if (it.keep) rt.divide(dst, dst, count, it.red.dtype, it.red.divide_by, s);
        }
        break;
      }
      case Item::Type::copy_send:
        rt.copy(next->remote_slot(next->posted_), in, n, s);
        rt.copy(dst, in, n, s);
        break;
    }
    ++consumed_;
    if (next) ++next->posted_;
    it.enqueued += n;
    kind_.enqueued(recvs_.front(), this, next, n);
    moved = true;
  }
  return moved;
}

}  // namespace ringreduce::transport::device
