// The TCP store's protocol and data without sockets (StoreEngine): the per-connection state
// machine (hello -> [auth or tls ->] ready <-> parked, or closing after a refused hello or proof),
// the key-value data, parked gets and waits, and the defences against broken or hostile clients.
// TcpStoreServer (tcp_store_server.cc) feeds it what recv() returns and sends what it queues;
// TcpStoreProtocol feeds it bytes directly and moves its clock by hand, so that the fuzzer drives
// the very same code thousands of times a second.
//
// Defences against broken or hostile clients, each of which drops only that client (with a log
// line naming its address): bad magic or version, a token on one side only, a wrong proof of the
// token, an unknown op, a length over the wire limits, a malformed payload, more pipelined input
// than one maximal request (before authentication: more than one hello and one proof), a
// connection that has not finished its hello (and proof) within kHandshakeLimit of being accepted
// whatever trickles in, and a stall (no byte moved for RINGREDUCE_TIMEOUT) while a request or a
// response is half-transferred. A client idle between requests is left alone: rank 0's
// connection may rightly sit idle for the whole job.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/auth.h"
#include "core/deadline.h"
#include "core/fd.h"
#include "core/log.h"
#include "core/security.h"
#include "core/tls_keys.h"
#include "rendezvous/store_records.h"
#include "rendezvous/tcp_store_wire.h"

namespace ringreduce::rendezvous::store_server {

using core::Clock;
using std::chrono::milliseconds;

// Requests are not processed while this much response is waiting for the client to read it.
constexpr size_t kOutputHighWater = size_t{4} << 20;
// A connection must finish its hello (and proof) this long after it was accepted, however its
// bytes trickle in (a stall alone is judged against RINGREDUCE_TIMEOUT, which may be long, and a
// stranger sending one byte a second would never stall). A shorter RINGREDUCE_TIMEOUT wins.
constexpr milliseconds kHandshakeLimit(10000);

struct Conn {
  // tls: the socket is a handshake thread's (TcpStoreServer) until tls_done().
  enum class State { hello, auth, tls, ready, parked, closing };

  uint64_t id = 0;
  core::Fd fd;  // invalid for a TcpStoreProtocol connection
  std::string peer;
  State state = State::hello;
  std::vector<uint8_t> in;  // received bytes; in[in_off..] are not yet consumed
  size_t in_off = 0;
  std::vector<uint8_t> out;  // bytes to send; out[out_off..] are not yet sent
  size_t out_off = 0;
  Clock::time_point last_progress;
  Clock::time_point handshake_deadline;
  size_t bytes_in = 0;  // received in all, for the log line of a dropped stranger
  uint32_t events = 0;  // current epoll interest
  bool dead = false;

  // In state auth: the proof the client must send.
  core::auth::Proof expected_proof{};

  // Encrypted connections (RINGREDUCE_ENCRYPT): the cipher agreed at the hello and what the keys
  // are bound to; psk's keys, made at the hello, in use once the proof is accepted; the records
  // once in use (every byte both ways sealed), and the sealed bytes received but not yet opened.
  core::aead::Cipher cipher = core::aead::Cipher::aes_256_gcm;
  std::array<uint8_t, wire::kKeyContextBytes> key_context{};
  std::unique_ptr<core::aead::SessionKeys> pending_keys;
  std::unique_ptr<StoreRecords> records;
  std::vector<uint8_t> sealed_in;
  size_t sealed_off = 0;
  // tls: whether the handshake thread has the socket (it gets it once the client's first TLS
  // bytes arrive, so that a silent stranger holds no thread).
  bool tls_started = false;

  // While parked: the request's op, the keys it still waits for, and its deadline.
  wire::Op parked_op = wire::Op::get;
  std::string parked_get_key;
  std::string parked_unless;  // get_unless: the other key that ends the wait
  std::vector<std::string> parked_missing;
  Clock::time_point parked_deadline;

  size_t in_avail() const { return in.size() - in_off; }
  size_t sealed_avail() const { return sealed_in.size() - sealed_off; }
  bool out_pending() const { return out_off < out.size(); }
  bool handshaking() const {
    return state == State::hello || state == State::auth || state == State::tls ||
           state == State::closing;
  }
  // True while the connection waits on the client in the middle of something.
  bool mid_transfer() const {
    return state == State::hello || state == State::auth || state == State::tls || out_pending() ||
           (state == State::ready && (in_avail() > 0 || sealed_avail() > 0));
  }
};

// The protocol and the data, without sockets. Subclasses say how output leaves (flush), how
// interest in a connection's readiness is registered, and what time it is.
class StoreEngine {
 public:
  StoreEngine(core::Security security, milliseconds stall_timeout, bool log_drops,
              uint64_t first_id)
      : security_(std::move(security)),
        stall_timeout_(stall_timeout),
        handshake_limit_(std::min(kHandshakeLimit, stall_timeout)),
        log_drops_(log_drops),
        next_id_(first_id) {}
  virtual ~StoreEngine() = default;
  StoreEngine(const StoreEngine&) = delete;
  StoreEngine& operator=(const StoreEngine&) = delete;

  Conn& add_conn(core::Fd fd, std::string peer);
  // Bytes the client sent; may drop the connection (input limits). process() parses them.
  void on_input(Conn& c, const uint8_t* data, size_t len);
  // The client closed its side.
  void on_eof(Conn& c);
  // Consumes every complete hello, proof or request in c.in and queues the answers.
  void process(Conn& c);
  // n bytes of c.out were delivered.
  void sent(Conn& c, size_t n);
  void check_timers();
  void run_runnable();
  void sweep();
  void drop(Conn& c, const std::string& why);
  // The TLS handshake start_tls() began has ended: with the secret it exported, or (null) with
  // `error` saying why not.
  void tls_done(Conn& c, const core::tls::Secret* secret, const std::string& error);

  std::unordered_map<uint64_t, Conn> conns;
  // What it has served, for TcpStoreServer::stats() (read from other threads).
  std::atomic<uint64_t> requests_served{0};
  std::atomic<uint64_t> connections_accepted{0};
  // Set by the owner when it ends the job itself (ringrun killing its ranks): the clients dropped
  // then are expected, not news.
  std::atomic<bool> quiet{false};
  Clock::time_point next_timer_check = Clock::time_point::max();
  std::string where = "TCP store";

 protected:
  virtual Clock::time_point now() const = 0;
  virtual void flush(Conn& c) = 0;
  virtual void update_interest(Conn& c) = 0;
  // Runs the TLS handshake on c's socket (c.state is tls, the server's hello sent) and calls
  // tls_done() when it ends. Without sockets there is nothing to run it on.
  virtual void start_tls(Conn& c) { drop(c, "asks for TLS, which is served only over sockets"); }

 private:
  bool handle_hello(Conn& c);
  bool handle_proof(Conn& c);
  bool handle_request(Conn& c);
  void execute(Conn& c, wire::Op op, wire::Reader& r);
  void refuse(Conn& c, wire::HelloStatus status, const std::string& why,
              std::span<const uint8_t> challenge = {});
  void park(Conn& c, wire::Op op, const std::string& get_key, std::vector<std::string> missing,
            milliseconds timeout);
  void unpark(Conn& c);
  void key_set(const std::string& key);
  void respond(Conn& c, wire::Status status, const std::vector<uint8_t>& payload);
  // get_unless's answer: which key is set (key first), then its value.
  std::vector<uint8_t> either_value(const std::string& key, const std::string& unless);
  void arm(Clock::time_point t) { next_timer_check = std::min(next_timer_check, t); }
  void warn(const std::string& what) const {
    if (log_drops_) RR_LOG(warn, store, -1, where, ": ", what);
  }

  const core::Security security_;
  const milliseconds stall_timeout_;
  const milliseconds handshake_limit_;
  const bool log_drops_;
  uint64_t next_id_;
  std::unordered_map<std::string, std::vector<uint8_t>> data_;
  // Key -> connections parked until it is set.
  std::unordered_map<std::string, std::vector<uint64_t>> watchers_;
  // Connections a set() un-parked; processed after the current event so that one connection's
  // request never runs nested inside another's.
  std::vector<uint64_t> runnable_;
};

}  // namespace ringreduce::rendezvous::store_server
