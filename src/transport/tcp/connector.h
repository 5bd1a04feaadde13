// Data connections made on first use. A rank listens from before it joins (its address and, with
// a token, its nonce travel in its join record: transport::Listeners) and for as long as its
// communicator lives; a link is connected when a message first has to cross it, by the side that
// sends: a ring at 1,024 ranks needs two connections per rank, not a thousand, and start-up reads
// no store key per peer.
//
// Each connection is a small state machine on the kind's epoll set, never blocking the engine:
//
//   outgoing:  connecting --(writable, no error)--> hello sent --(answer checked)--> attached
//   incoming:  accepted --(hello checked, handshake.h)--> answered and attached
//
// Both ends of a pair may start a connection for the same channel at once (each sends first, as
// in recursive doubling). The one started by the lower rank wins, and both ends decide alike from
// what they hold: an incoming connection from a lower rank replaces this rank's own attempt; one
// from a higher rank is closed while this rank's own attempt is under way, and that higher rank,
// seeing its attempt closed by a lower rank before an answer, waits for the lower rank's instead
// ("crossed") when the lower rank says so: it answers with a hello on channel -2 before closing.
// Any other close of an attempt before its answer is the peer's failure (a wrong token, a peer
// gone), named at once. A connection for a channel already attached is a duplicate and is closed.
#pragma once

#include <sys/epoll.h>

#include <array>
#include <cstdint>
#include <exception>
#include <functional>
#include <list>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/auth.h"
#include "core/deadline.h"
#include "core/fd.h"
#include "core/tls_keys.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/secure_channel.h"
#include "transport/tcp/socket.h"

namespace ringreduce::transport::tcp {

// Where a peer listens, from its join record.
struct PeerAddress {
  SockAddr addr;
  core::auth::Nonce nonce{};  // with a token: the challenge for connections to it
  bool valid = false;
};

class Connector {
 public:
  // Hands an attached connection to its link: (peer, connection index, fd, and its record layer
  // when encrypted, else null).
  using Attach =
      std::function<void(int peer, int index, core::Fd fd, std::unique_ptr<SecureChannel>)>;

  // expect: this rank's identity (comm id, rank, size, connections per peer, token, nonce).
  // wanted[q]: connections with q are this kind's. The listener is registered on epoll_fd.
  // tls: the certificates (RINGREDUCE_ENCRYPT=tls), loaded once; null otherwise.
  Connector(const HelloExpect& expect, core::Fd listener, std::vector<PeerAddress> peers,
            std::vector<bool> wanted, int epoll_fd, Attach attach,
            std::shared_ptr<const core::tls::Context> tls = nullptr);
  ~Connector();

  // Starts the connection (peer, index) unless it is attached, under way, or the peer's own
  // attempt is awaited. Throws PeerError when the peer cannot be reached at all.
  void connect(int peer, int index);
  // Whether an epoll event belongs to the connector (its data.u64 is odd); on_event handles it.
  static bool owns(uint64_t data) { return (data & 1) != 0; }
  void on_event(uint64_t data, uint32_t events);
  // Drops accepted connections that have not sent their hello within the grace.
  void expire();
  // The last connection dropped and why (for a timeout's message), or "".
  const std::string& last_drop() const { return last_drop_; }
  // Whether connection (peer, index) is attached, or awaited from the peer.
  bool attached(int peer, int index) const { return state(peer, index) == State::attached; }
  // Closes the listener and every connection under way (abort, destruction).
  void close_all();

 private:
  enum class State : uint8_t { none, connecting, crossed, attached };
  // RINGREDUCE_ENCRYPT=tls: a connection's TLS handshake, after its hellos, on a thread of its own
  // (it waits on the peer, which the engine's thread must not: a stranger could stall it), which
  // signals `done` (on the connector's epoll set) when it has finished.
  struct TlsRun {
    bool outgoing = false;
    core::Fd done;  // eventfd
    core::tls::Secret secret;
    std::exception_ptr error;
    std::jthread thread;  // last: joined first, while the rest is still there
  };
  struct Pending {
    enum class Phase : uint8_t { connecting, awaiting_answer, reading_hello, tls } phase;
    core::Fd fd;
    int peer = -1, index = -1;  // outgoing: from the start; incoming: from the hello
    Hello sent;                 // outgoing
    core::auth::Nonce nonce{};  // outgoing: this rank's nonce
    uint8_t answer[sizeof(Hello) + kAcceptorAuthBytes] = {};
    size_t got = 0;
    HelloReader reader;  // incoming
    core::Clock::time_point since;
    // Its epoll tag, (id << 1) | 1: an id is never reused, so an event that an earlier batch
    // reported for a connection closed since cannot reach a new one at the same address.
    uint64_t id = 0;
    // Last: destroyed first, so that its thread is joined before the descriptor closes.
    std::unique_ptr<TlsRun> tls;
    explicit Pending(const HelloExpect* e) : reader(e) {}
  };
  using Iter = std::list<Pending>::iterator;

  State state(int peer, int index) const {
    return states_[static_cast<size_t>(peer) * static_cast<size_t>(expect_.channels) +
                   static_cast<size_t>(index)];
  }
  State& state(int peer, int index) {
    return states_[static_cast<size_t>(peer) * static_cast<size_t>(expect_.channels) +
                   static_cast<size_t>(index)];
  }
  void watch(Pending& p, uint32_t events, bool add);
  void accept_all();
  void on_outgoing(Iter it, uint32_t events);
  void on_incoming(Iter it);
  // The hello of an incoming connection checked: attach it, or close it (crossed, duplicate).
  void settle_incoming(Iter it);
  // A connection whose hellos are done: to its link (through `secure` when encrypted).
  void hand_over(Iter it, int peer, int index, std::unique_ptr<SecureChannel> secure = nullptr);
  // After the hellos: psk's record layer and hand_over, or tls's handshake first (start_tls;
  // finish_tls once its thread is done).
  void hellos_done(Iter it, int peer, int index);
  void start_tls(Iter it, int peer, int index);
  void finish_tls(Iter it);
  // What binds a connection's keys: the communicator, the connector's and the acceptor's ranks,
  // the channel.
  std::array<uint8_t, 20> key_context(bool outgoing, int peer, int index) const;
  // The cipher both hellos agree on (connection_cipher).
  core::aead::Cipher cipher_of(const Pending& p, bool outgoing) const;
  void drop(Iter it, const std::string& why, bool quiet);
  // Takes a pending connection out of the epoll set and closes it.
  void forget(Iter it);
  Iter outgoing_of(int peer, int index);
  Hello hello_for(int index) const;

  HelloExpect expect_;
  std::shared_ptr<const core::tls::Context> tls_;
  core::Fd listener_;
  std::vector<PeerAddress> peers_;
  std::vector<bool> wanted_;
  int epoll_fd_;
  Attach attach_;
  std::vector<State> states_;  // [peer * channels + index]
  std::list<Pending> pending_;
  uint64_t next_id_ = 1;  // 0 is the listener
  std::string last_drop_;
};

}  // namespace ringreduce::transport::tcp
