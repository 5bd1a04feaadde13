// The TCP kind of link: connections to the peers the transport table routes here (every peer on
// another host, and every peer with RINGREDUCE_SHM=0), one per peer per channel (times
// RINGREDUCE_NSOCKS) and one point-to-point lane, each made when a message first crosses it
// (connector.h) to the address the peer published when it joined. Its links and connections under
// way are driven through its epoll set, which the engine (engine.h) polls and sleeps on.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/config.h"
#include "core/fd.h"
#include "transport/kind.h"
#include "transport/link.h"
#include "transport/tcp/connector.h"
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
  std::string store_host;  // to pick the data interface (alone: to check the setting)
  // This rank's listener, opened before the join (transport::Listeners), with its nonce (a
  // token's challenge); what every rank published for it ("<host>|<port>|<nonce or ->", by rank).
  core::Fd listener;
  core::auth::Nonce nonce{};
  std::vector<std::string> published;
  // The ranks to connect with (the others are linked by other kinds); empty: all.
  std::vector<int> peers;
  // other_host[q]: rank q runs on another host (a loopback address cannot reach it). Empty:
  // unknown.
  std::vector<bool> other_host;
  // transport::ConnectArgs::check_failed.
  std::function<void()> check_failed;
};

class TcpKind final : public LinkKind {
 public:
  // Reads the peers' addresses and checks them (a token on some ranks only, a loopback address
  // between hosts); connects nothing yet.
  TcpKind(TcpOptions opts, const core::Config& config);
  ~TcpKind() override;

  // What TCP offers, before anything is measured.
  static KindTraits static_traits();
  const KindTraits& traits() const override { return traits_; }
  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  Link& link(int peer, int channel) override;
  Link& lane(int peer) override;
  void begin_op(const OpTag& tag, bool /*stream_output*/) override { tag_ = tag; }
  // For error messages: turns a peer's tag into words ("allreduce #3 (float x 100, sum)").
  void set_describer(std::function<std::string(const OpTag&)> f) override {
    describe_ = std::move(f);
  }
  std::string describe(const OpTag& t) const { return describe_ ? describe_(t) : "an op"; }
  const OpTag& tag() const { return tag_; }

  // One epoll_wait that does not wait, and the work its events allow.
  bool poll(bool /*stage*/) override { return poll_events(0); }
  void throw_if_notice() override;
  // Drops strangers past their hello's grace; while a receive waits for a peer that has not
  // connected, looks at the job's failure mark (such a peer may have died before connecting).
  void check_idle() override;
  int event_fd() const override { return epoll_.get(); }
  void handle_events() override { poll_events(0); }
  // The peer a timed-out wait is pinned on (a pending receive first), or -1.
  int stuck_peer(bool* sending) const override;
  // "timed out waiting for rank Q: its host has acknowledged nothing for S s (...)", or empty.
  std::string unreachable_text() const override;
  void abort(int code, int blamed_rank, const std::string& reason) override;
  std::exception_ptr find_cause(int blamed) override;

  // Called by a link that has read its peer's abort notice.
  void note_notice() { notices_ = true; }
  // Called by links when the events they want change.
  void update_interest(TcpLink& link);
  bool lanes_on_demand() const override { return true; }
  std::vector<int> take_opened_lanes() override { return std::exchange(opened_lanes_, {}); }
  uint64_t lane_events() const override { return lane_events_; }
  // Called by a lane that completed a receive.
  void note_lane_event() { ++lane_events_; }
  // Called by a link without a connection that has something to send.
  void want_connection(TcpLink& link) { connector_->connect(link.peer(), link.channel()); }
  // The peer whose host has left our bytes unacknowledged longest, for at least a second, or -1;
  // *ms: for how long. Such a peer is unreachable, and is the one to name: the other peers this
  // rank waits for may only be waiting on it in turn.
  int unreachable_peer(int64_t* ms) const;

 private:
  // The peers' published addresses, checked.
  std::vector<PeerAddress> read_addresses(const core::Config& config) const;
  // The connection (peer, index), made on first use; throws for a peer not routed here.
  TcpLink& wire(int peer, int index);
  // A connection the connector made: into its link, and into the epoll set.
  void attach(int peer, int index, core::Fd fd, std::unique_ptr<SecureChannel> secure);
  // One epoll_wait of up to timeout_ms (0: just look) and the work its events allow; returns
  // whether any link had an event.
  bool poll_events(int timeout_ms);

  TcpOptions opts_;
  KindTraits traits_ = static_traits();
  core::Fd epoll_;
  std::unique_ptr<Connector> connector_;  // after epoll_: it leaves the set before the set closes
  // Connections ("wires"): channels x nsocks per peer.
  int wires() const { return opts_.channels * opts_.nsocks; }
  // Connections per peer: the wires, then the point-to-point lane (at index wires()).
  int stride() const { return wires() + 1; }
  // [peer * stride() + channel * nsocks + socket], the lane at [peer * stride() + wires()], null
  // for self.
  std::vector<std::unique_ptr<TcpLink>> links_;
  std::vector<std::unique_ptr<StripedLink>> striped_;  // [peer * channels + channel], nsocks > 1
  OpTag tag_;
  std::function<std::string(const OpTag&)> describe_;
  bool aborted_ = false;
  bool notices_ = false;       // some link holds a peer's abort notice
  std::vector<bool> connect_;  // by rank: whether there is a link to it
  bool congestion_warned_ = false;
  uint64_t lane_events_ = 0;
  std::vector<int> opened_lanes_;  // take_opened_lanes()
  core::Clock::time_point last_failure_check_{};
};

}  // namespace ringreduce::transport::tcp
