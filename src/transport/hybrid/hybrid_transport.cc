#include "transport/hybrid/hybrid_transport.h"

#include <sched.h>

#include <chrono>

#include "ringreduce/error.h"
#include "transport/idle_policy.h"

namespace ringreduce::transport::hybrid {

HybridTransport::HybridTransport(std::unique_ptr<shm::ShmTransport> shm,
                                 std::unique_ptr<tcp::TcpTransport> tcp,
                                 std::vector<int> local_ranks, bool oversubscribed,
                                 int max_idle_yields, int spin_us)
    : shm_(std::move(shm)),
      tcp_(std::move(tcp)),
      oversubscribed_(oversubscribed),
      max_idle_yields_(max_idle_yields),
      spin_us_(spin_us) {
  local_.assign(static_cast<size_t>(tcp_->size()), false);
  for (int q : local_ranks) local_.at(static_cast<size_t>(q)) = true;
  // Sleeping in the TCP engine's epoll_wait must also end on a shared-memory event.
  tcp_->watch(shm_->event_fd());
}

Link& HybridTransport::link(int peer, int channel) {
  return local_.at(static_cast<size_t>(peer)) ? shm_->link(peer, channel)
                                              : tcp_->link(peer, channel);
}

void HybridTransport::begin_op(const OpTag& tag, bool stream_output) {
  shm_->begin_op(tag, stream_output);
  tcp_->begin_op(tag);
}

void HybridTransport::set_describer(std::function<std::string(const OpTag&)> f) {
  shm_->set_describer(f);
  tcp_->set_describer(std::move(f));
}

void HybridTransport::wait(Completion& c, const core::Deadline& deadline) {
  IdlePolicy idle(oversubscribed_, max_idle_yields_, spin_us_);
  // Primitives posted since the last pass may owe shared-memory peers a wake-up.
  shm_->poll(false);
  while (!c.done()) {
    if (interrupted_.load(std::memory_order_acquire)) {
      std::lock_guard<std::mutex> lock(interrupt_mu_);
      throw_interrupt(interrupt_reason_, interrupt_code_);
    }
    // Both engines: what moved on one (a forward staged by a TCP receive) may move the other.
    bool any = shm_->poll(false);
    any |= tcp_->poll_events(0);
    if (c.done()) return;
    shm_->throw_if_notice();
    tcp_->throw_if_notice();
    if (deadline.expired()) throw_timeout();
    if (!idle.should_sleep(any)) continue;
    shm_->check_calls();
    // Sleep: with the flag up, one more pass finds what a peer published before it saw it.
    const int cap_ms = shm_->begin_sleep();
    if (shm_->poll(/*stage=*/true) || tcp_->poll_events(0) || c.done()) {
      shm_->end_sleep();
      continue;
    }
    bool shm_event = false;
    tcp_->poll_events(deadline.remaining_ms(cap_ms), &shm_event);
    shm_->end_sleep();
    if (shm_event) shm_->handle_events();
  }
}

void HybridTransport::throw_timeout() {
  // A host that acknowledges nothing explains the wait better than the peer waited on.
  if (std::string text = tcp_->unreachable_text(); !text.empty()) throw TimeoutError(text);
  bool sending = false;
  int q = shm_->stuck_peer(&sending);
  if (q < 0 || sending) {
    bool tcp_sending = false;
    const int t = tcp_->stuck_peer(&tcp_sending);
    if (t >= 0 && (q < 0 || !tcp_sending)) q = t, sending = tcp_sending;
  }
  if (q < 0) throw TimeoutError("timed out");
  throw TimeoutError("timed out waiting for rank " + std::to_string(q) +
                     (sending ? " to take our data" : ""));
}

void HybridTransport::abort(int code, int blamed_rank, const std::string& reason) {
  shm_->abort(code, blamed_rank, reason);
  tcp_->abort(code, blamed_rank, reason);
}

std::exception_ptr HybridTransport::find_cause(std::chrono::milliseconds grace, int blamed) {
  // Half the grace each would wait for nothing on a quiet side: look at shared memory at once
  // (its notices are already in place), then give TCP the whole grace.
  if (auto e = shm_->find_cause(std::chrono::milliseconds(0), blamed)) return e;
  return tcp_->find_cause(grace, blamed);
}

void HybridTransport::interrupt(const std::string& reason, int code) {
  {
    std::lock_guard<std::mutex> lock(interrupt_mu_);
    if (interrupted_.load()) return;
    interrupt_reason_ = reason;
    interrupt_code_ = code;
  }
  interrupted_.store(true, std::memory_order_release);
  // Wakes a sleeping wait: it sleeps in the TCP engine's epoll_wait.
  tcp_->interrupt(reason, code);
}

}  // namespace ringreduce::transport::hybrid
