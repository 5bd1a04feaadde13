// The TCP transport: a full mesh of connections (one per peer per channel), established at
// start-up through the rendezvous store, driven by an epoll progress engine in the thread that
// waits.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/fd.h"
#include "ringreduce/store.h"
#include "transport/link.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/striped_link.h"
#include "transport/tcp/tcp_link.h"

namespace ringreduce::transport::tcp {

struct TcpOptions {
  int rank = 0;
  int size = 1;
  int channels = 1;
  // Connections per link (RINGREDUCE_NSOCKS): > 1 stripes each message over that many
  // (striped_link.h); messages below 2 x min_stripe bytes use one.
  int nsocks = 1;
  size_t min_stripe = 64 * 1024;
  uint64_t comm_id = 0;
  int socket_buffer = 0;   // 0: the kernel autotunes the buffers
  std::string congestion;  // TCP congestion control of data sockets; empty: the system's
  // Poll this long before sleeping in epoll_wait: a sleeping thread costs tens of µs to wake.
  int spin_us = 50;
  // Yield the core while polling: ranks outnumber cores.
  bool yield_while_spinning = false;
  std::string store_host;  // to pick the data interface
  // The ranks to connect with (a HybridTransport leaves out the ones on this host); empty: all.
  std::vector<int> peers;
  // other_host[q]: rank q runs on another host (a loopback address cannot reach it). Empty:
  // unknown.
  std::vector<bool> other_host;
};

class TcpTransport final : public Transport {
 public:
  // Listens, publishes "addr/<rank>" in the store, connects to every peer (lower ranks connect,
  // higher ranks accept), and checks every hello. Bounded by deadline.
  TcpTransport(const TcpOptions& opts, const core::Config& config, Store& store,
               const core::Deadline& deadline);
  ~TcpTransport() override;

  int rank() const override { return opts_.rank; }
  int size() const override { return opts_.size; }
  int channels() const override { return opts_.channels; }
  Link& link(int peer, int channel) override;
  void begin_op(const OpTag& tag, bool /*stream_output*/ = false) override { tag_ = tag; }
  void wait(Completion& c, const core::Deadline& deadline) override;
  void abort(int code, int blamed_rank, const std::string& reason) override;
  void interrupt(const std::string& reason, int code) override;
  std::exception_ptr find_cause(std::chrono::milliseconds grace, int blamed) override;

  // For error messages: turns a peer's tag into words ("allreduce #3 (float x 100, sum)").
  void set_describer(std::function<std::string(const OpTag&)> f) override {
    describe_ = std::move(f);
  }
  std::string describe(const OpTag& t) const { return describe_ ? describe_(t) : "an op"; }
  const OpTag& tag() const { return tag_; }
  // Called by a link that has read its peer's abort notice.
  void note_notice() { notices_ = true; }
  // Called by links when the events they want change.
  void update_interest(TcpLink& link);

  // The engine's parts, for a transport that drives TCP and shared-memory links together
  // (HybridTransport). poll_events: one epoll_wait of up to timeout_ms (0: just look) and the
  // work its events allow; returns whether any link had an event, and sets *watched when an fd
  // added with watch() is readable.
  bool poll_events(int timeout_ms, bool* watched = nullptr);
  void watch(int fd);
  void throw_if_notice();
  // The peer a timed-out wait is pinned on (a pending receive first), or -1.
  int stuck_peer(bool* sending) const;
  // The peer whose host has left our bytes unacknowledged longest, for at least a second, or -1;
  // *ms: for how long. Such a peer is unreachable, and is the one to name: the other peers this
  // rank waits for may only be waiting on it in turn.
  int unreachable_peer(int64_t* ms) const;
  // "timed out waiting for rank Q: its host has acknowledged nothing for S s (...)", or empty.
  std::string unreachable_text() const;

 private:
  void connect_mesh(const core::Config& config, Store& store, const core::Deadline& deadline);
  [[noreturn]] void throw_timeout(const core::Deadline& deadline);

  TcpOptions opts_;
  core::Fd listener_;
  SockAddr listen_addr_;
  core::Fd epoll_;
  core::Fd wake_;  // eventfd: interrupt() wakes a blocked epoll_wait through it
  // Connections ("wires"): channels x nsocks per peer.
  int wires() const { return opts_.channels * opts_.nsocks; }
  // [peer * wires() + channel * nsocks + socket], null for self.
  std::vector<std::unique_ptr<TcpLink>> links_;
  std::vector<std::unique_ptr<StripedLink>> striped_;  // [peer * channels + channel], nsocks > 1
  OpTag tag_;
  std::function<std::string(const OpTag&)> describe_;
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mu_;
  std::string interrupt_reason_;
  int interrupt_code_ = 0;
  bool aborted_ = false;
  bool notices_ = false;       // some link holds a peer's abort notice
  std::vector<bool> connect_;  // by rank: whether there is a link to it
};

}  // namespace ringreduce::transport::tcp
