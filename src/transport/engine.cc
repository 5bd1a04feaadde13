#include "transport/engine.h"

#include <errno.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "ringreduce/error.h"
#include "transport/idle_policy.h"

namespace ringreduce::transport {

Engine::Engine(const EngineOptions& options, std::vector<std::unique_ptr<LinkKind>> kinds,
               std::vector<int> route, std::vector<int> device_route)
    : opts_(options), kinds_(std::move(kinds)) {
  if (kinds_.empty()) throw Error("transport: no kind of link");
  epoll_.reset(epoll_create1(EPOLL_CLOEXEC));
  wake_.reset(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!epoll_.valid() || !wake_.valid())
    throw Error(std::string("epoll/eventfd creation failed: ") + strerror(errno));
  auto add = [&](int fd, uint64_t marker) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = marker;
    if (epoll_ctl(epoll_.get(), EPOLL_CTL_ADD, fd, &ev) != 0)
      throw Error(std::string("epoll_ctl failed: ") + strerror(errno));
  };
  add(wake_.get(), kinds_.size());
  for (size_t i = 0; i < kinds_.size(); ++i) {
    add(kinds_[i]->event_fd(), i);
    kinds_[i]->set_driver(this);
    if (!window_) window_ = kinds_[i]->window();
  }
  route_.assign(static_cast<size_t>(opts_.size), nullptr);
  for (size_t r = 0; r < route.size() && r < route_.size(); ++r)
    if (route[r] >= 0) route_[r] = kinds_.at(static_cast<size_t>(route[r])).get();
  device_route_.assign(static_cast<size_t>(opts_.size), nullptr);
  for (size_t r = 0; r < device_route.size() && r < device_route_.size(); ++r)
    if (device_route[r] >= 0)
      device_route_[r] = kinds_.at(static_cast<size_t>(device_route[r])).get();
  // The kinds serving host memory: every kind but one that links peers only for device memory
  // (with one rank, the one kind stands in).
  for (auto& k : kinds_)
    if (std::find(route_.begin(), route_.end(), k.get()) != route_.end() ||
        std::find(device_route_.begin(), device_route_.end(), k.get()) == device_route_.end())
      host_kinds_.push_back(k.get());
  std::vector<int> open;
  for (int q = 0; q < opts_.size; ++q)
    if (route_[static_cast<size_t>(q)] && !route_[static_cast<size_t>(q)]->lanes_on_demand())
      open.push_back(q);
  p2p_ = std::make_unique<P2p>(
      opts_.rank, opts_.size,
      [this](int q) {
        return route_[static_cast<size_t>(q)] ? &route_[static_cast<size_t>(q)]->lane(q) : nullptr;
      },
      open, opts_.p2p_eager_bytes, [](void* e) { static_cast<Engine*>(e)->wake(); }, this);
}

Engine::~Engine() = default;

bool Engine::takes(MemorySpace space) const {
  if (space != MemorySpace::device)
    return std::all_of(host_kinds_.begin(), host_kinds_.end(),
                       [space](const LinkKind* k) { return k->traits().takes(space); });
  for (int q = 0; q < opts_.size; ++q)
    if (q != opts_.rank && !device_route_[static_cast<size_t>(q)]) return false;
  return opts_.size > 1;
}

const KindTraits& Engine::device_traits() const {
  for (const LinkKind* k : device_route_)
    if (k) return k->traits();
  throw Error("rank " + std::to_string(opts_.rank) + ": no device links");
}

Link& Engine::link(int peer, int channel) {
  LinkKind* k = nullptr;
  if (peer >= 0 && peer < opts_.size)
    k = (device_op_ ? device_route_ : route_)[static_cast<size_t>(peer)];
  if (!k)
    throw Error("no " + std::string(device_op_ ? "device " : "") + "link from rank " +
                std::to_string(opts_.rank) + " to rank " + std::to_string(peer));
  return k->link(peer, channel);
}

void Engine::begin_op(const OpTag& tag, bool stream_output) {
  for (auto& k : kinds_) k->begin_op(tag, stream_output);
}

void Engine::set_describer(std::function<std::string(const OpTag&)> f) {
  for (auto& k : kinds_) k->set_describer(f);
}

std::string Engine::kinds_text() const {
  std::string s;
  for (const auto& k : kinds_) s += (s.empty() ? "" : "+") + k->traits().name;
  return s;
}

bool Engine::poll_all(bool stage) {
  bool any = false;
  uint64_t lane_events = 0;
  for (auto& k : kinds_) {
    any |= k->poll(stage);
    lane_events += k->lane_events();
  }
  // After the kinds: what their links moved in this pass may complete requests now.
  if (lane_events != lane_events_seen_)
    for (auto& k : kinds_)
      if (k->lanes_on_demand())
        for (int q : k->take_opened_lanes()) p2p_->open_lane(q);
  any |= p2p_->poll(lane_events != lane_events_seen_);
  lane_events_seen_ = lane_events;
  return any;
}

void Engine::wake() {
  // Pairs with sleep(): the sleeper raises sleeping_ before its last look, the waker publishes its
  // work before this load (both sequentially consistent), so one of them sees the other's store.
  if (!sleeping_.load(std::memory_order_seq_cst)) return;
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
  (void)ignored;
}

void Engine::check_interrupt() {
  if (interrupted_.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    throw_interrupt(interrupt_reason_, interrupt_code_);
  }
}

void Engine::throw_if_notice() {
  // A peer is failing the job: fail this op now with its reason rather than at the deadline,
  // even if this op does not wait on that peer.
  for (auto& k : kinds_) k->throw_if_notice();
}

void Engine::wait(Completion& c, const core::Deadline& deadline) {
  bool moved = false;
  auto poll = [&] {
    if (c.done()) return true;
    moved = poll_all(false);
    return c.done();
  };
  auto was_moved = [&] { return moved; };
  auto timeout = [&] { throw_timeout(); };
  drive(poll, was_moved, timeout, deadline);
}

void Engine::wait_until(FnRef<bool> done, const core::Deadline& deadline) {
  bool moved = false;
  auto poll = [&] {
    if (done()) return true;
    moved = poll_all(false);
    return done();
  };
  auto was_moved = [&] { return moved; };
  auto timeout = [&] { throw TimeoutError("timed out"); };
  drive(poll, was_moved, timeout, deadline);
}

void Engine::drive(FnRef<bool> poll, FnRef<bool> moved, FnRef<void> on_timeout,
                   const core::Deadline& deadline) {
  if (timeline_)
    drive_loop<true>(poll, moved, on_timeout, deadline);
  else
    drive_loop<false>(poll, moved, on_timeout, deadline);
}

template <bool kTraced>
void Engine::drive_loop(FnRef<bool> poll, FnRef<bool> moved, FnRef<void> on_timeout,
                        const core::Deadline& deadline) {
  // Primitives posted since the last pass may have moved eagerly and owe their peers a wake-up,
  // even when the wait is over already.
  for (auto& k : kinds_) k->flush();
  IdlePolicy idle(opts_.oversubscribed, opts_.max_idle_yields, opts_.spin_us);
  // The timeline's wait: from the first pass that moved nothing to the pass that moves or ends
  // the wait. Stretches shorter than kMinWaitUs are the ordinary gaps between a ring's messages
  // and would bury the trace; the peer is asked once, when the stretch reaches that length.
  constexpr double kMinWaitUs = 5;
  double idle_since = 0;
  int peer = -1;
  bool slept = false, asked = false;
  auto end_wait = [&] {
    if constexpr (kTraced) {
      if (idle_since > 0) {
        const double now = core::Timeline::now_us();
        if (now - idle_since >= kMinWaitUs) timeline_->wait(idle_since, now, peer, slept);
        idle_since = 0;
        peer = -1;
        slept = asked = false;
      }
    }
  };
  for (;;) {
    check_interrupt();
    if (poll()) {
      end_wait();
      return;
    }
    const bool any = moved();
    if constexpr (kTraced) {
      if (any) {
        end_wait();
      } else if (idle_since == 0) {
        idle_since = core::Timeline::now_us();
      } else if (!asked && core::Timeline::now_us() - idle_since >= kMinWaitUs) {
        peer = waited_peer();
        asked = true;
      }
    }
    throw_if_notice();
    // Checked on every pass, not only after a sleep: a link that keeps reporting events without
    // progress must not extend the wait past its deadline.
    if (deadline.expired()) {
      end_wait();
      on_timeout();
    }
    if (!idle.should_sleep(any)) continue;
    // Nothing moves: if a peer is in another call (whatever algorithm it runs), say so now.
    for (auto& k : kinds_) k->check_idle();
    // Before sleeping, forwards that wait for room stage their data instead, which is what
    // guarantees progress whatever order the algorithm posted in (ShmLink).
    auto recheck = [&] { return poll_all(/*stage=*/true) || poll(); };
    if constexpr (kTraced) {
      if (!asked) peer = waited_peer(), asked = true;
      slept = true;
    }
    sleep(deadline, recheck);
  }
}

int Engine::waited_peer(bool* sending_out) {
  // A pending receive names the rank that did not send; only without one, a send not taken.
  int q = -1;
  bool sending = false;
  for (auto& k : kinds_) {
    bool s = false;
    const int t = k->stuck_peer(&s);
    if (t >= 0 && (q < 0 || (sending && !s))) q = t, sending = s;
  }
  if (sending_out != nullptr) *sending_out = sending;
  return q;
}

void Engine::sleep(const core::Deadline& deadline, FnRef<bool> recheck) {
  int cap_ms = 1000;
  for (auto& k : kinds_) cap_ms = std::min(cap_ms, k->prepare_sleep());
  sleeping_.store(true, std::memory_order_seq_cst);
  // Whatever a peer published before it could see the flags is found by this pass.
  if (recheck()) {
    sleeping_.store(false, std::memory_order_relaxed);
    for (auto& k : kinds_) k->end_sleep();
    return;
  }
  epoll_event events[8];
  const int n = epoll_wait(epoll_.get(), events, 8, deadline.remaining_ms(cap_ms));
  sleeping_.store(false, std::memory_order_relaxed);
  for (auto& k : kinds_) k->end_sleep();
  for (int i = 0; i < n; ++i) {
    const uint64_t who = events[i].data.u64;
    if (who < kinds_.size()) {
      kinds_[who]->handle_events();
    } else {
      uint64_t v;
      ssize_t ignored = ::read(wake_.get(), &v, sizeof v);
      (void)ignored;
    }
  }
}

void Engine::throw_timeout() {
  // A host that acknowledges nothing explains the wait better than the peer waited on.
  for (auto& k : kinds_)
    if (std::string text = k->unreachable_text(); !text.empty()) throw TimeoutError(text);
  bool sending = false;
  const int q = waited_peer(&sending);
  if (q < 0) throw TimeoutError("timed out");
  throw TimeoutError("timed out waiting for rank " + std::to_string(q) +
                     (sending ? " to take our data" : ""));
}

void Engine::abort(int code, int blamed_rank, const std::string& reason) {
  for (auto& k : kinds_) k->abort(code, blamed_rank, reason);
}

std::exception_ptr Engine::find_cause(std::chrono::milliseconds grace, int blamed) {
  const auto until = core::Clock::now() + grace;
  for (;;) {
    for (auto& k : kinds_)
      if (auto e = k->find_cause(blamed)) return e;
    if (core::Clock::now() >= until) return nullptr;
    usleep(1000);
  }
}

void Engine::interrupt(const std::string& reason, int code) {
  {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    if (interrupted_.load()) return;
    interrupt_reason_ = reason;
    interrupt_code_ = code;
  }
  interrupted_.store(true, std::memory_order_release);
  uint64_t one = 1;
  ssize_t ignored = ::write(wake_.get(), &one, sizeof one);
  (void)ignored;
}

}  // namespace ringreduce::transport
