// The control plane: small messages between the ranks of a communicator over connections of
// their own, apart from the data links. A failure aborts the data links (their queues dropped,
// their write sides shut, their state unknown), and the store may have died with its host; the
// survivors still have to talk to agree on who is left and to build a communicator of their own
// (comm/agree.h, comm/shrink.cc). So every rank listens on a second TCP socket from before it
// joins, publishes it in its join record beside the data listener ("ctl=<host>|<port>|<nonce>"),
// and keeps it for the communicator's life; nothing else uses it.
//
// A connection carries one direction: the rank that has something to say connects (on first use)
// and only writes; the acceptor only reads. So a send never waits for the peer's process (the
// kernel accepts for a stopped one, and its buffer takes the bytes), and there is no crossing to
// settle. With a token, the connector's hello proves it (handshake.h, as data connections do,
// against the acceptor's published nonce); the acceptor sends nothing, so it has nothing to prove.
// A frame is a 32-bit length and that many bytes.
//
// A peer is lost when it can no longer be heard: its connection to this rank ended (after every
// message it carried, which next() delivers first), or this rank could not reach it (refused,
// reset) and no connection from it has arrived. Not "could not reach it" alone: a peer that has
// said all it had to say may close its listener, and its last words may still be on their way in.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/auth.h"
#include "core/deadline.h"
#include "core/fd.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace ringreduce::transport {

class ControlPlane {
 public:
  static constexpr size_t kMaxMessage = 16u << 20;
  struct Options {
    int rank = 0;
    int size = 1;
    uint64_t comm_id = 0;  // the communicator's: connections of another one are strangers
    std::string token;
    core::Fd listener;          // this rank's, listening
    core::auth::Nonce nonce{};  // its challenge, with a token
    // Every rank's published control address ("<host>|<port>|<nonce or ->"), by rank.
    std::vector<std::string> published;
  };
  struct Event {
    enum class Kind { message, lost } kind = Kind::message;
    int peer = -1;
    std::string bytes;  // a message
    std::string why;    // a loss: "refused the connection", "closed its control connection"
  };

  explicit ControlPlane(Options options);
  ~ControlPlane();
  ControlPlane(const ControlPlane&) = delete;
  ControlPlane& operator=(const ControlPlane&) = delete;

  int rank() const { return opts_.rank; }
  int size() const { return opts_.size; }
  // Queues a message for peer, connecting on first use; never blocks. Messages to a peer that
  // cannot be reached are dropped: next() reports the loss.
  void send(int peer, std::string message);
  // Moves what is queued and returns the next event, waiting until the deadline (nullopt then).
  std::optional<Event> next(const core::Deadline& deadline);
  // Drives the connections until every queued message has been written to its socket (or its
  // peer is lost), or the deadline; what arrives meanwhile waits for next().
  void flush_all(const core::Deadline& deadline);
  // What this rank knows of its connections with `peer`, for the message of a peer that stays
  // silent: "sent 3 messages (0 bytes unwritten) on an open connection; received 2, the last
  // 1.2 s ago; 1 connection with its hello pending".
  std::string state_text(int peer) const;
  // Closes everything of `peer` and never reports it again (a peer given up on).
  void forget(int peer);
  // The descriptors a poll may watch to learn that next() has something (the epoll set).
  int fd() const { return epoll_.get(); }

 private:
  struct Outgoing {
    enum class State : uint8_t { none, connecting, open, failed } state = State::none;
    core::Fd fd;
    std::string pending;  // framed bytes not yet written (the hello first)
    bool want_write = false;
  };
  struct Incoming {
    core::Fd fd;
    std::unique_ptr<tcp::HelloReader> hello;  // until the hello is done
    int peer = -1;
    std::string buf;
    core::Clock::time_point accepted;
  };
  void accept_all();
  void start_connect(int peer);
  void on_outgoing(int peer, uint32_t events);
  void flush(int peer);
  void fail_outgoing(int peer, const std::string& why);
  void on_incoming(uint64_t id, uint32_t events);
  void close_incoming(uint64_t id, const std::string& why);
  void watch(int fd, uint64_t tag, bool write);
  void rewatch(int fd, uint64_t tag, bool write);
  // Reports lost peers whose outgoing failed and from whom nothing can still come.
  void settle_losses();
  // One epoll_wait of at most timeout_ms and what it reports.
  void poll_once(int timeout_ms);

  Options opts_;
  tcp::HelloExpect expect_;
  std::vector<tcp::SockAddr> addr_;
  std::vector<core::auth::Nonce> nonce_;
  std::vector<bool> addr_ok_;
  core::Fd epoll_;
  std::vector<Outgoing> out_;
  std::map<uint64_t, Incoming> in_;
  uint64_t next_in_ = 1;
  std::vector<uint64_t> in_of_;       // by peer: its identified incoming connection (0: none)
  std::vector<std::string> out_why_;  // by peer: why its outgoing failed ("": it did not)
  std::vector<bool> reported_;        // by peer: lost and reported, or forgotten
  // By peer, for state_text(): messages queued to it, messages received and when the last came.
  std::vector<uint64_t> sent_, received_;
  std::vector<core::Clock::time_point> last_heard_;
  std::deque<Event> events_;
};

}  // namespace ringreduce::transport
