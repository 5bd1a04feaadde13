#include "transport/p2p.h"

#include <cstring>
#include <set>

#include "reduce/reduce.h"
#include "ringreduce/error.h"

namespace ringreduce::transport {
namespace {

constexpr uint32_t kP2pMagic = 0x50325252;  // "RR2P"
enum : uint32_t {
  kEager = 1,  // payload follows
  kRts = 2,    // request to send `bytes`; the payload waits for clear-to-send
  kCts = 3,    // clear to send message `id` (receiver -> sender)
  kData = 4,   // the payload of message `id`, which was cleared, follows
};
// How often requests are checked against their deadlines and their peers' liveness.
constexpr auto kCheckEvery = std::chrono::milliseconds(5);

}  // namespace

std::string P2pRequest::describe(int rank) const {
  std::string s = "rank " + std::to_string(rank) + ": ";
  if (is_send)
    s += "send to rank " + std::to_string(peer);
  else if (peer == kAnySource)
    s += "recv from any rank";
  else
    s += "recv from rank " + std::to_string(peer);
  return s + " (tag " + std::to_string(tag) + ", " + std::to_string(bytes) + " bytes)";
}

struct P2p::Lane {
  int peer = -1;
  Link* link = nullptr;
  P2pHeader in;  // the standing header receive's destination
  Completion in_c;
  bool in_posted = false;
  uint64_t next_id = 1;
  bool gone = false;
};

// A message that arrived before a receive took it: an eager payload (arriving or arrived) or a
// request to send.
struct P2p::Arrived {
  int src = -1;
  uint64_t tag = 0;
  uint64_t bytes = 0;
  uint64_t id = 0;
  bool rts = false;
  std::unique_ptr<char[]> data;
  Completion c;
  P2pRequest* taker = nullptr;  // matched while its payload was still arriving
};

// Bytes on their way: headers (and a payload) being sent, or a payload being received straight
// into a request's buffer. r, if any, is done when they are.
struct P2p::Moving {
  P2pRequest* r = nullptr;
  int peer = -1;
  P2pHeader header;
  Completion c;
};

P2p::P2p(int rank, int size, std::function<Link*(int)> lane, const std::vector<int>& open,
         size_t eager_bytes, void (*wake)(void*), void* wake_arg)
    : rank_(rank),
      size_(size),
      eager_bytes_(eager_bytes),
      wake_(wake),
      wake_arg_(wake_arg),
      make_lane_(std::move(lane)) {
  lanes_.resize(static_cast<size_t>(size_));
  // Whatever a peer sends on these is taken off its lane from now on, even before anyone receives.
  for (int q : open) lane_of(q);
}

P2p::~P2p() = default;

P2p::Lane& P2p::lane_of(int peer) {
  if (peer >= 0 && peer < size_ && lanes_[static_cast<size_t>(peer)])
    return *lanes_[static_cast<size_t>(peer)];
  Link* link = peer >= 0 && peer < size_ && peer != rank_ ? make_lane_(peer) : nullptr;
  if (!link)
    throw InvalidArgument("rank " + std::to_string(rank_) + ": no point-to-point lane to rank " +
                          std::to_string(peer));
  auto l = std::make_unique<Lane>();
  l->peer = peer;
  l->link = link;
  Lane& lane = *l;
  lanes_[static_cast<size_t>(peer)] = std::move(l);
  open_.push_back(&lane);
  post_header_recv(lane);
  return lane;
}

bool P2p::submit(P2pRequest* r) {
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (failed_.load(std::memory_order_relaxed)) return false;
    outstanding_.fetch_add(1, std::memory_order_acq_rel);
    submitted_.push_back(r);
  }
  // Sequentially consistent with the engine's sleep flag: either the driver sees this request in
  // its last look before sleeping, or wake() sees it sleeping and rouses it.
  has_submitted_.store(true, std::memory_order_seq_cst);
  if (wake_) wake_(wake_arg_);
  return true;
}

void P2p::post_header_recv(Lane& lane) {
  look_lanes_ = true;
  lane.link->recv(&lane.in, sizeof lane.in, &lane.in_c);
  lane.in_posted = true;  // only once posted: a receive that threw left nothing to look at
}

void P2p::send_header(Lane& lane, uint32_t type, uint64_t tag, uint64_t bytes, uint64_t id,
                      P2pRequest* completes, const void* payload) {
  look_lanes_ = true;  // posting on a lane may move its header receive too
  auto m = std::make_unique<Moving>();
  m->r = completes;
  m->peer = lane.peer;
  m->header.magic = kP2pMagic;
  m->header.type = type;
  m->header.tag = tag;
  m->header.bytes = bytes;
  m->header.id = id;
  Moving& placed = *m;
  moving_.push_back(std::move(m));
  lane.link->send(&placed.header, sizeof placed.header, &placed.c);
  if (payload != nullptr && bytes > 0) lane.link->send(payload, bytes, &placed.c);
}

void P2p::receive_payload(Lane& lane, P2pRequest* r, uint64_t bytes) {
  look_lanes_ = true;
  auto m = std::make_unique<Moving>();
  m->r = r;
  m->peer = lane.peer;
  Moving& placed = *m;
  moving_.push_back(std::move(m));
  lane.link->recv(r->buf, bytes, &placed.c);
}

void P2p::size_mismatch(const P2pRequest& r, int src, uint64_t bytes) {
  throw MismatchError(r.describe(rank_) + ": rank " + std::to_string(src) + " sent " +
                      std::to_string(bytes) + " bytes with this tag (sends and receives must " +
                      "agree in size)");
}

P2pRequest* P2p::take_posted(int src, uint64_t tag, uint64_t bytes) {
  for (auto it = posted_.begin(); it != posted_.end(); ++it) {
    P2pRequest* r = *it;
    if ((r->peer == kAnySource || r->peer == src) && r->tag == tag) {
      // Checked before it leaves the list, so that fail_all() still finds it.
      if (r->bytes != bytes) size_mismatch(*r, src, bytes);
      posted_.erase(it);
      return r;
    }
  }
  return nullptr;
}

void P2p::on_header(Lane& lane) {
  const P2pHeader h = lane.in;
  const int src = lane.peer;
  if (h.magic != kP2pMagic || h.type < kEager || h.type > kData)
    throw PeerError("rank " + std::to_string(rank_) + ": rank " + std::to_string(src) +
                        " sent a malformed point-to-point header",
                    src);
  switch (h.type) {
    case kEager:
      if (P2pRequest* r = take_posted(src, h.tag, h.bytes)) {
        r->source = src;
        if (h.bytes == 0) {
          finish(r);
        } else {
          receive_payload(lane, r, h.bytes);
        }
      } else {
        auto a = std::make_unique<Arrived>();
        a->src = src;
        a->tag = h.tag;
        a->bytes = h.bytes;
        a->id = h.id;
        if (h.bytes > 0) {
          a->data = std::make_unique_for_overwrite<char[]>(h.bytes);
          lane.link->recv(a->data.get(), h.bytes, &a->c);
        }
        arrived_.push_back(std::move(a));
      }
      break;
    case kRts:
      if (P2pRequest* r = take_posted(src, h.tag, h.bytes)) {
        r->source = src;
        await_data_[{src, h.id}] = r;
        send_header(lane, kCts, h.tag, h.bytes, h.id, nullptr, nullptr);
      } else {
        auto a = std::make_unique<Arrived>();
        a->src = src;
        a->tag = h.tag;
        a->bytes = h.bytes;
        a->id = h.id;
        a->rts = true;
        arrived_.push_back(std::move(a));
      }
      break;
    case kCts: {
      auto it = await_cts_.find({src, h.id});
      if (it == await_cts_.end())
        throw PeerError("rank " + std::to_string(rank_) + ": rank " + std::to_string(src) +
                            " cleared a point-to-point message that was never requested",
                        src);
      P2pRequest* s = it->second;
      await_cts_.erase(it);
      // From here on the Moving entry holds it.
      send_header(lane, kData, s->tag, s->bytes, h.id, s, s->buf);
      break;
    }
    case kData: {
      auto it = await_data_.find({src, h.id});
      if (it == await_data_.end() || it->second->bytes != h.bytes)
        throw PeerError("rank " + std::to_string(rank_) + ": rank " + std::to_string(src) +
                            " sent a point-to-point payload that was never cleared",
                        src);
      P2pRequest* r = it->second;
      await_data_.erase(it);
      receive_payload(lane, r, h.bytes);
      break;
    }
  }
  // After the payload's receive: the lane's messages are taken in order.
  post_header_recv(lane);
}

void P2p::match_recv(P2pRequest* r, Arrived& a) {
  if (a.bytes != r->bytes) size_mismatch(*r, a.src, a.bytes);
  r->source = a.src;
  if (a.rts) {
    await_data_[{a.src, a.id}] = r;
    send_header(lane_of(a.src), kCts, a.tag, a.bytes, a.id, nullptr, nullptr);
  } else if (a.c.done()) {
    reduce::copy(r->buf, a.data.get(), a.bytes, /*stream=*/false);
    finish(r);
  } else {
    a.taker = r;
    return;  // stays until its payload has arrived
  }
  arrived_.remove_if([&](const std::unique_ptr<Arrived>& p) { return p.get() == &a; });
}

void P2p::post_request(P2pRequest* r) {
  if (r->is_send) {
    Lane& lane = lane_of(r->peer);
    if (lane.gone || lane.link->closed())
      throw PeerError(r->describe(rank_) + ": peer rank " + std::to_string(r->peer) + " exited",
                      r->peer);
    const uint64_t id = lane.next_id++;
    if (r->bytes <= eager_bytes_) {
      send_header(lane, kEager, r->tag, r->bytes, id, r, r->buf);
    } else {
      await_cts_[{r->peer, id}] = r;
      send_header(lane, kRts, r->tag, r->bytes, id, nullptr, nullptr);
    }
    return;
  }
  for (auto& a : arrived_) {
    if (a->taker || a->tag != r->tag || (r->peer != kAnySource && r->peer != a->src)) continue;
    match_recv(r, *a);
    return;
  }
  posted_.push_back(r);
}

void P2p::finish(P2pRequest* r) {
  done_.push_back(r);
}

bool P2p::poll(bool lanes_moved) {
  if (failed_.load(std::memory_order_relaxed)) return false;
  bool any = false;
  if (has_submitted_.load(std::memory_order_seq_cst)) {
    {
      std::lock_guard<std::mutex> lock(submit_mu_);
      posting_.insert(posting_.end(), submitted_.begin(), submitted_.end());
      submitted_.clear();
      has_submitted_.store(false, std::memory_order_relaxed);
    }
    // Each leaves posting_ only once it is held elsewhere: a throw leaves it where fail_all()
    // finds it.
    while (!posting_.empty()) {
      post_request(posting_.front());
      posting_.pop_front();
    }
    any = true;
  }
  if (lanes_moved || look_lanes_ || outstanding_.load(std::memory_order_relaxed) > 0) {
    look_lanes_ = false;
    // By index: a header's handling may open another lane.
    for (size_t i = 0; i < open_.size(); ++i) {
      Lane* l = open_[i];
      if (!l->in_posted || !l->in_c.done()) continue;
      l->in_posted = false;
      on_header(*l);
      any = true;
    }
  }
  for (auto it = moving_.begin(); it != moving_.end();) {
    if (!(*it)->c.done()) {
      ++it;
      continue;
    }
    if ((*it)->r) finish((*it)->r);
    it = moving_.erase(it);
    any = true;
  }
  for (auto it = arrived_.begin(); it != arrived_.end();) {
    Arrived& a = **it;
    if (!a.taker || !a.c.done()) {
      ++it;
      continue;
    }
    reduce::copy(a.taker->buf, a.data.get(), a.bytes, /*stream=*/false);
    finish(a.taker);
    it = arrived_.erase(it);
    any = true;
  }
  if (outstanding_.load(std::memory_order_relaxed) > done_.size()) check_lanes_and_deadlines();
  if (!done_.empty()) {
    std::vector<P2pRequest*> done;
    done.swap(done_);
    outstanding_.fetch_sub(done.size(), std::memory_order_acq_rel);
    for (P2pRequest* r : done) r->on_done(r, nullptr);
  }
  return any;
}

void P2p::check_lanes_and_deadlines() {
  const auto now = core::Clock::now();
  if (now < next_check_) return;
  next_check_ = now + kCheckEvery;
  for (Lane* l : open_)
    if (!l->gone && l->link->closed()) l->gone = true;
  auto gone = [&](int peer) {
    return peer >= 0 && peer < size_ && lanes_[static_cast<size_t>(peer)] &&
           lanes_[static_cast<size_t>(peer)]->gone;
  };
  // A request fails when the peer it needs has exited, or when its deadline has passed.
  auto check = [&](const P2pRequest* r, int peer, const char* waiting) {
    if (gone(peer))
      throw PeerError(r->describe(rank_) + ": peer rank " + std::to_string(peer) + " exited", peer);
    if (now >= r->deadline.at()) throw TimeoutError(r->describe(rank_) + ": timed out " + waiting);
  };
  for (const P2pRequest* r : posted_)
    check(r, r->peer,
          r->peer == kAnySource
              ? "waiting for a matching send"
              : ("waiting for rank " + std::to_string(r->peer) + " to send").c_str());
  for (const auto& [key, r] : await_cts_)
    check(
        r, key.first,
        ("waiting for rank " + std::to_string(key.first) + " to post a matching receive").c_str());
  for (const auto& [key, r] : await_data_)
    check(r, key.first, ("waiting for rank " + std::to_string(key.first) + "'s payload").c_str());
  for (const auto& m : moving_)
    if (m->r)
      check(m->r, m->peer,
            ("waiting for rank " + std::to_string(m->peer) +
             (m->r->is_send ? " to take the rest of the message" : " to send the rest of it"))
                .c_str());
  for (const auto& a : arrived_)
    if (a->taker)
      check(a->taker, a->src,
            ("waiting for rank " + std::to_string(a->src) + " to send the rest of it").c_str());
}

void P2p::fail_all(std::exception_ptr error) {
  // Requests whose bytes had all moved (done_) succeed; the others fail with `error`. A request
  // may sit in two places at once for a moment (a rendezvous send that was cleared is in
  // await_cts_ until its payload's Moving entry holds it): each is failed once.
  std::vector<P2pRequest*> completed;
  completed.swap(done_);
  std::vector<P2pRequest*> failed;
  {
    std::lock_guard<std::mutex> lock(submit_mu_);
    if (failed_.load(std::memory_order_relaxed)) return;
    failed_.store(true, std::memory_order_relaxed);
    failed.insert(failed.end(), submitted_.begin(), submitted_.end());
    submitted_.clear();
  }
  failed.insert(failed.end(), posting_.begin(), posting_.end());
  for (P2pRequest* r : posted_) failed.push_back(r);
  for (auto& [k, r] : await_cts_) failed.push_back(r);
  for (auto& [k, r] : await_data_) failed.push_back(r);
  for (auto& m : moving_)
    if (m->r) failed.push_back(m->r);
  for (auto& a : arrived_)
    if (a->taker) failed.push_back(a->taker);
  posting_.clear();
  posted_.clear();
  await_cts_.clear();
  await_data_.clear();
  // The links have dropped what was queued on them (Transport::abort): nothing refers to these.
  moving_.clear();
  arrived_.clear();
  std::set<P2pRequest*> once(completed.begin(), completed.end());
  std::vector<P2pRequest*> unique_failed;
  for (P2pRequest* r : failed)
    if (once.insert(r).second) unique_failed.push_back(r);
  outstanding_.fetch_sub(completed.size() + unique_failed.size(), std::memory_order_acq_rel);
  for (P2pRequest* r : completed) r->on_done(r, nullptr);
  for (P2pRequest* r : unique_failed) r->on_done(r, error);
}

}  // namespace ringreduce::transport
