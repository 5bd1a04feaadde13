// The TCP store server: one background thread, an epoll set, and a non-blocking state machine
// per connection (hello -> [auth ->] ready <-> parked, or closing after a refused hello or
// proof). Nothing a client does can block the thread: reads and writes never wait, a request is
// parsed only once all of it has arrived, and a get/wait on a missing key parks the connection
// until a set (or its timeout) instead of having the client poll.
//
// The state machine and the key-value data live in StoreEngine, which knows nothing of sockets:
// TcpStoreServer feeds it what recv() returns and sends what it queues; TcpStoreProtocol feeds it
// bytes directly and moves its clock by hand, so that the fuzzer drives the very same code
// thousands of times a second.
//
// Defences against broken or hostile clients, each of which drops only that client (with a log
// line naming its address): bad magic or version, a token on one side only, a wrong proof of the
// token, an unknown op, a length over the wire limits, a malformed payload, more pipelined input
// than one maximal request (before authentication: more than one hello and one proof), a
// connection that has not finished its hello (and proof) within kHandshakeLimit of being accepted
// whatever trickles in, and a stall (no byte moved for RINGREDUCE_TIMEOUT) while a request or a
// response is half-transferred. A client idle between requests is left alone: rank 0's
// connection may rightly sit idle for the whole job.
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>
#include <unordered_map>

#include "core/auth.h"
#include "core/config.h"
#include "core/fd.h"
#include "core/log.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using core::Clock;
using std::chrono::milliseconds;

constexpr uint64_t kListenerId = 0;
constexpr uint64_t kWakeId = 1;
constexpr uint64_t kFirstConnId = 2;

// Per wake-up limits, so that one busy client cannot starve the others.
constexpr size_t kReadBudget = size_t{4} << 20;
constexpr int kAcceptBudget = 256;
// Requests are not processed while this much response is waiting for the client to read it.
constexpr size_t kOutputHighWater = size_t{4} << 20;
// Unprocessed input beyond one maximal request means the client pipelines without reading.
constexpr size_t kMaxBufferedInput =
    wire::kFrameHeaderBytes + wire::max_request_payload(wire::Op::set) + 4096;
// Before its proof is accepted, a client of a store with a token has nothing more to say than
// one hello and one proof: anything beyond is a stranger filling memory.
constexpr size_t kMaxPreAuthInput =
    wire::kHelloBytes + wire::kMaxAuthBytes + core::auth::kProofBytes;
// A connection must finish its hello (and proof) this long after it was accepted, however its
// bytes trickle in (a stall alone is judged against RINGREDUCE_TIMEOUT, which may be long, and a
// stranger sending one byte a second would never stall). A shorter RINGREDUCE_TIMEOUT wins.
constexpr milliseconds kHandshakeLimit(10000);
// How long accept() stays paused after running out of file descriptors.
constexpr milliseconds kAcceptPause(100);
// An upper bound on how long the loop sleeps, as insurance against a missed timer update.
constexpr int kMaxSleepMs = 1000;
// Prefix of the messages in bad_request responses; the client puts its own name before it.
constexpr const char* kRejected = "the server rejected the request";

using core::errno_text;

struct Conn {
  enum class State { hello, auth, ready, parked, closing };

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

  // While parked: the request's op, the keys it still waits for, and its deadline.
  wire::Op parked_op = wire::Op::get;
  std::string parked_get_key;
  std::string parked_unless;  // get_unless: the other key that ends the wait
  std::vector<std::string> parked_missing;
  Clock::time_point parked_deadline;

  size_t in_avail() const { return in.size() - in_off; }
  bool out_pending() const { return out_off < out.size(); }
  bool handshaking() const {
    return state == State::hello || state == State::auth || state == State::closing;
  }
  // True while the connection waits on the client in the middle of something.
  bool mid_transfer() const {
    return state == State::hello || state == State::auth || out_pending() ||
           (state == State::ready && in_avail() > 0);
  }
};

// The protocol and the data, without sockets. Subclasses say how output leaves (flush), how
// interest in a connection's readiness is registered, and what time it is.
class StoreEngine {
 public:
  StoreEngine(std::string token, milliseconds stall_timeout, bool log_drops, uint64_t first_id)
      : token_(std::move(token)),
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

 private:
  bool handle_hello(Conn& c);
  bool handle_proof(Conn& c);
  bool handle_request(Conn& c);
  void execute(Conn& c, wire::Op op, wire::Reader& r);
  void refuse(Conn& c, wire::HelloStatus status, const std::string& why);
  void park(Conn& c, wire::Op op, const std::string& get_key, std::vector<std::string> missing,
            milliseconds timeout);
  void unpark(Conn& c);
  void key_set(const std::string& key);
  void respond(Conn& c, wire::Status status, const std::vector<uint8_t>& payload);
  // get_unless's answer: which key is set (key first), then its value.
  std::vector<uint8_t> either_value(const std::string& key, const std::string& unless);
  void arm(Clock::time_point t) { next_timer_check = std::min(next_timer_check, t); }
  void warn(const std::string& what) const {
    if (log_drops_) RR_LOG(warn, -1, where, ": ", what);
  }

  const std::string token_;
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

Conn& StoreEngine::add_conn(core::Fd fd, std::string peer) {
  uint64_t id = next_id_++;
  connections_accepted.fetch_add(1, std::memory_order_relaxed);
  Conn& c = conns[id];
  c.id = id;
  c.fd = std::move(fd);
  c.peer = std::move(peer);
  c.last_progress = now();
  c.handshake_deadline = c.last_progress + handshake_limit_;
  arm(c.handshake_deadline);
  return c;
}

void StoreEngine::on_input(Conn& c, const uint8_t* data, size_t len) {
  if (c.dead || len == 0) return;
  c.bytes_in += len;
  c.last_progress = now();
  arm(c.last_progress + stall_timeout_);
  // A refused client has nothing left to say; what it sends is not kept.
  if (c.state == Conn::State::closing) return;
  if (c.in_off > 0 && c.in_off == c.in.size()) {
    c.in.clear();
    c.in_off = 0;
  }
  c.in.insert(c.in.end(), data, data + len);
  if (!token_.empty() && (c.state == Conn::State::hello || c.state == Conn::State::auth) &&
      c.in_avail() > kMaxPreAuthInput) {
    drop(c, "sent " + std::to_string(c.in_avail()) +
                " bytes before proving it knows RINGREDUCE_TOKEN (at most " +
                std::to_string(kMaxPreAuthInput) + " make sense)");
    return;
  }
  if (c.in_avail() > kMaxBufferedInput)
    drop(c, "sent more than one maximal request without reading the responses");
}

void StoreEngine::on_eof(Conn& c) {
  if (c.dead) return;
  if (c.state == Conn::State::auth) {
    // Our own client leaves here when the store's proof is wrong, i.e. when its token differs.
    drop(c,
         "closed the connection without proving it knows RINGREDUCE_TOKEN (a client whose token "
         "differs leaves when the store's proof fails)");
  } else if (c.state != Conn::State::closing && c.mid_transfer() &&
             !(c.state == Conn::State::hello && c.in_avail() == 0)) {
    drop(c, "closed the connection in the middle of a message");
  } else {
    RR_LOG(trace, -1, where, ": client ", c.peer, " disconnected");
    c.dead = true;
  }
}

void StoreEngine::process(Conn& c) {
  // Bounded: every pass consumes a complete hello, proof or request from c.in, or returns.
  while (!c.dead) {
    if (c.state == Conn::State::parked || c.state == Conn::State::closing) return;
    if (c.out.size() - c.out_off > kOutputHighWater) return;
    bool progressed = false;
    try {
      switch (c.state) {
        case Conn::State::hello:
          progressed = handle_hello(c);
          break;
        case Conn::State::auth:
          progressed = handle_proof(c);
          break;
        default:
          progressed = handle_request(c);
          break;
      }
    } catch (const wire::ProtocolError& e) {
      drop(c, std::string("malformed request: ") + e.what());
      return;
    }
    if (!progressed) return;
  }
}

void StoreEngine::refuse(Conn& c, wire::HelloStatus status, const std::string& why) {
  // Answered before closing, so that the client can say what is wrong.
  warn("refusing client " + c.peer + ": " + why);
  wire::append_server_hello(&c.out, status);
  c.state = Conn::State::closing;
  c.in.clear();
  c.in_off = 0;
  flush(c);
}

bool StoreEngine::handle_hello(Conn& c) {
  if (c.in_avail() < wire::kHelloBytes) return false;
  const uint8_t* p = c.in.data() + c.in_off;
  uint32_t magic = wire::load32(p);
  uint16_t version = wire::load16(p + 4);
  uint16_t auth = wire::load16(p + 6);
  uint32_t auth_len = wire::load32(p + 8);
  if (magic != wire::kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x (not a ringreduce store client)", magic);
    drop(c, buf);
    return false;
  }
  if (auth_len > wire::kMaxAuthBytes) {
    drop(c, "hello announces " + std::to_string(auth_len) + " bytes of authentication data");
    return false;
  }
  if (c.in_avail() < wire::kHelloBytes + auth_len) return false;
  const uint8_t* auth_data = p + wire::kHelloBytes;
  c.in_off += wire::kHelloBytes + auth_len;
  if (version != wire::kVersion) {
    refuse(c, wire::HelloStatus::bad_version,
           "it speaks protocol version " + std::to_string(version) + ", this server " +
               std::to_string(wire::kVersion));
    return false;
  }
  const bool wants_hmac = auth == static_cast<uint16_t>(wire::Auth::hmac_sha256);
  if (auth != static_cast<uint16_t>(wire::Auth::none) && !wants_hmac) {
    refuse(c, wire::HelloStatus::auth_unsupported,
           "it asks for authentication method " + std::to_string(auth) +
               ", which this server does not offer");
    return false;
  }
  if (token_.empty()) {
    if (wants_hmac) {
      refuse(c, wire::HelloStatus::auth_unsupported,
             "it has a RINGREDUCE_TOKEN and asks to prove it, but this store was started without "
             "one");
      return false;
    }
    if (auth_len != 0) {
      drop(c, "hello without authentication carries " + std::to_string(auth_len) +
                  " bytes of authentication data");
      return false;
    }
    wire::append_server_hello(&c.out, wire::HelloStatus::ok);
    c.state = Conn::State::ready;
    RR_LOG(trace, -1, where, ": client ", c.peer, " said hello");
    flush(c);
    return !c.dead;
  }
  if (!wants_hmac) {
    refuse(c, wire::HelloStatus::auth_required,
           "it sent no proof of RINGREDUCE_TOKEN, which this store requires (the client has no "
           "token set)");
    return false;
  }
  if (auth_len != core::auth::kNonceBytes) {
    drop(c, "hello carries a nonce of " + std::to_string(auth_len) + " bytes, not " +
                std::to_string(core::auth::kNonceBytes));
    return false;
  }
  core::auth::Nonce client_nonce{};
  std::copy(auth_data, auth_data + client_nonce.size(), client_nonce.begin());
  const core::auth::Nonce server_nonce = core::auth::random_nonce();
  const auto ctx = wire::auth_context(version, wire::Auth::hmac_sha256);
  const core::auth::Proof server_proof =
      core::auth::make_proof(token_, wire::kServerProofLabel, ctx, client_nonce, server_nonce);
  c.expected_proof =
      core::auth::make_proof(token_, wire::kClientProofLabel, ctx, server_nonce, client_nonce);
  uint8_t challenge[wire::kChallengeBytes];
  std::copy(server_nonce.begin(), server_nonce.end(), challenge);
  std::copy(server_proof.begin(), server_proof.end(), challenge + server_nonce.size());
  wire::append_server_hello(&c.out, wire::HelloStatus::ok, challenge, sizeof(challenge));
  c.state = Conn::State::auth;
  RR_LOG(trace, -1, where, ": client ", c.peer, " said hello; challenge sent");
  flush(c);
  return !c.dead;
}

bool StoreEngine::handle_proof(Conn& c) {
  if (c.in_avail() < core::auth::kProofBytes) return false;
  std::span<const uint8_t> proof(c.in.data() + c.in_off, core::auth::kProofBytes);
  c.in_off += core::auth::kProofBytes;
  if (!core::auth::proofs_equal(c.expected_proof, proof)) {
    warn("dropping client " + c.peer +
         ": its proof of RINGREDUCE_TOKEN is wrong (another token, or a replayed proof)");
    c.out.push_back(static_cast<uint8_t>(wire::AuthStatus::denied));
    c.state = Conn::State::closing;
    c.in.clear();
    c.in_off = 0;
    flush(c);
    return false;
  }
  c.out.push_back(static_cast<uint8_t>(wire::AuthStatus::ok));
  c.state = Conn::State::ready;
  RR_LOG(trace, -1, where, ": client ", c.peer, " proved it holds the token");
  flush(c);
  return !c.dead;
}

bool StoreEngine::handle_request(Conn& c) {
  if (c.in_avail() < wire::kFrameHeaderBytes) return false;
  const uint8_t* p = c.in.data() + c.in_off;
  uint8_t op = p[0];
  uint32_t len = wire::load32(p + 1);
  if (!wire::valid_op(op)) {
    drop(c, "unknown op " + std::to_string(op));
    return false;
  }
  if (len > wire::max_request_payload(static_cast<wire::Op>(op))) {
    drop(c, std::string(wire::op_name(static_cast<wire::Op>(op))) + " request of " +
                std::to_string(len) + " bytes exceeds the limit of " +
                std::to_string(wire::max_request_payload(static_cast<wire::Op>(op))));
    return false;
  }
  if (c.in_avail() < wire::kFrameHeaderBytes + len) return false;
  wire::Reader r(p + wire::kFrameHeaderBytes, len);
  execute(c, static_cast<wire::Op>(op), r);
  c.in_off += wire::kFrameHeaderBytes + len;
  if (c.in_off == c.in.size()) {
    // Keep the buffer's capacity only while it is small: a 64 MiB set should not pin 64 MiB.
    if (c.in.capacity() > (size_t{1} << 20)) std::vector<uint8_t>().swap(c.in);
    c.in.clear();
    c.in_off = 0;
  }
  return !c.dead;
}

void StoreEngine::execute(Conn& c, wire::Op op, wire::Reader& r) {
  requests_served.fetch_add(1, std::memory_order_relaxed);
  std::vector<uint8_t> payload;
  wire::Writer w(&payload);
  switch (op) {
    case wire::Op::set: {
      std::string key = r.key();
      std::vector<uint8_t> value = r.value();
      r.expect_end();
      data_[key] = std::move(value);
      respond(c, wire::Status::ok, payload);
      key_set(key);
      return;
    }
    case wire::Op::get: {
      milliseconds timeout(static_cast<int64_t>(std::min<uint64_t>(r.u64(), INT64_MAX / 2)));
      std::string key = r.key();
      r.expect_end();
      auto it = data_.find(key);
      if (it != data_.end()) {
        w.bytes(it->second.data(), it->second.size());
        respond(c, wire::Status::ok, payload);
      } else {
        park(c, op, key, {key}, timeout);
      }
      return;
    }
    case wire::Op::add: {
      std::string key = r.key();
      int64_t delta = static_cast<int64_t>(r.u64());
      r.expect_end();
      int64_t result = 0;
      try {
        auto it = data_.find(key);
        int64_t current = it == data_.end() ? 0 : parse_counter(kRejected, key, it->second);
        result = add_counter(kRejected, key, current, delta);
      } catch (const InvalidArgument& e) {
        std::string msg = std::string(e.what()).substr(0, wire::kMaxMessageBytes);
        w.str(msg);
        respond(c, wire::Status::bad_request, payload);
        return;
      }
      data_[key] = format_counter(result);
      w.u64(static_cast<uint64_t>(result));
      respond(c, wire::Status::ok, payload);
      key_set(key);
      return;
    }
    case wire::Op::wait: {
      milliseconds timeout(static_cast<int64_t>(std::min<uint64_t>(r.u64(), INT64_MAX / 2)));
      std::vector<std::string> keys = r.keys();
      r.expect_end();
      std::vector<std::string> missing;
      for (auto& k : keys)
        if (data_.count(k) == 0) missing.push_back(std::move(k));
      if (missing.empty())
        respond(c, wire::Status::ok, payload);
      else
        park(c, op, "", std::move(missing), timeout);
      return;
    }
    case wire::Op::get_unless: {
      milliseconds timeout(static_cast<int64_t>(std::min<uint64_t>(r.u64(), INT64_MAX / 2)));
      std::string key = r.key();
      std::string unless = r.key();
      r.expect_end();
      if (data_.count(key) > 0 || data_.count(unless) > 0) {
        respond(c, wire::Status::ok, either_value(key, unless));
      } else {
        park(c, op, key, {key, unless}, timeout);
        if (c.state == Conn::State::parked) c.parked_unless = std::move(unless);
      }
      return;
    }
    case wire::Op::check: {
      std::vector<std::string> keys = r.keys();
      r.expect_end();
      bool all = std::all_of(keys.begin(), keys.end(),
                             [&](const std::string& k) { return data_.count(k) > 0; });
      w.u8(all ? 1 : 0);
      respond(c, wire::Status::ok, payload);
      return;
    }
  }
}

void StoreEngine::park(Conn& c, wire::Op op, const std::string& get_key,
                       std::vector<std::string> missing, milliseconds timeout) {
  // The deadline is kept here, on the server, so that the client's connection stays in step: it
  // always gets exactly one response, a value or a timeout naming the missing keys. Ten years at
  // most, as store_deadline(), so that the time_point arithmetic cannot overflow.
  constexpr milliseconds kCap = std::chrono::hours(24 * 365 * 10);
  auto t = now();
  auto deadline = t + std::clamp(timeout, milliseconds(0), kCap);
  if (t >= deadline) {
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(static_cast<uint32_t>(missing.size()));
    for (const auto& k : missing) w.str(k);
    respond(c, wire::Status::timeout, payload);
    return;
  }
  c.state = Conn::State::parked;
  c.parked_op = op;
  c.parked_get_key = get_key;
  c.parked_missing = std::move(missing);
  c.parked_deadline = deadline;
  for (const auto& k : c.parked_missing) watchers_[k].push_back(c.id);
  arm(deadline);
}

void StoreEngine::unpark(Conn& c) {
  for (const auto& k : c.parked_missing) {
    auto it = watchers_.find(k);
    if (it == watchers_.end()) continue;
    std::erase(it->second, c.id);
    if (it->second.empty()) watchers_.erase(it);
  }
  c.parked_missing.clear();
  c.parked_get_key.clear();
  c.parked_unless.clear();
  c.state = Conn::State::ready;
}

void StoreEngine::key_set(const std::string& key) {
  auto node = watchers_.extract(key);
  if (node.empty()) return;
  for (uint64_t id : node.mapped()) {
    auto it = conns.find(id);
    if (it == conns.end() || it->second.dead || it->second.state != Conn::State::parked) continue;
    Conn& w = it->second;
    if (w.parked_op == wire::Op::get_unless) {  // either key will do
      std::vector<uint8_t> payload = either_value(w.parked_get_key, w.parked_unless);
      unpark(w);
      respond(w, wire::Status::ok, payload);
      runnable_.push_back(w.id);
      continue;
    }
    std::erase_if(w.parked_missing, [&](const std::string& k) { return data_.count(k) > 0; });
    if (!w.parked_missing.empty()) continue;  // still registered under its other keys
    std::vector<uint8_t> payload;
    if (w.parked_op == wire::Op::get) {
      const auto& v = data_.at(w.parked_get_key);
      wire::Writer(&payload).bytes(v.data(), v.size());
    }
    unpark(w);
    respond(w, wire::Status::ok, payload);
    runnable_.push_back(w.id);
  }
}

std::vector<uint8_t> StoreEngine::either_value(const std::string& key, const std::string& unless) {
  const bool second = data_.count(key) == 0;
  const auto& v = data_.at(second ? unless : key);
  std::vector<uint8_t> payload;
  wire::Writer w(&payload);
  w.u8(second ? 1 : 0);
  w.bytes(v.data(), v.size());
  return payload;
}

void StoreEngine::respond(Conn& c, wire::Status status, const std::vector<uint8_t>& payload) {
  if (!c.out_pending()) {
    c.out.clear();
    c.out_off = 0;
    // The stall clock for a response starts when it is queued, not when the request arrived.
    c.last_progress = now();
    arm(c.last_progress + stall_timeout_);
  }
  wire::Writer w(&c.out);
  w.begin(static_cast<uint8_t>(status));
  w.raw(payload.data(), payload.size());
  w.end();
  // Most responses fit the socket buffer: sending now saves an epoll round trip.
  flush(c);
}

void StoreEngine::sent(Conn& c, size_t n) {
  c.out_off += std::min(n, c.out.size() - c.out_off);
  if (n > 0) c.last_progress = now();
  if (!c.out_pending()) {
    if (c.out.capacity() > (size_t{1} << 20)) std::vector<uint8_t>().swap(c.out);
    c.out.clear();
    c.out_off = 0;
    if (c.state == Conn::State::closing) c.dead = true;  // the refusal has been delivered
  }
}

void StoreEngine::drop(Conn& c, const std::string& why) {
  if (c.dead) return;
  if (!quiet.load(std::memory_order_relaxed)) warn("dropping client " + c.peer + ": " + why);
  c.dead = true;
}

void StoreEngine::check_timers() {
  auto t = now();
  if (t < next_timer_check) return;
  auto next = Clock::time_point::max();
  for (auto& [id, c] : conns) {
    if (c.dead) continue;
    if (c.handshaking()) {
      if (t >= c.handshake_deadline) {
        const std::string limit = std::to_string(handshake_limit_.count()) + " ms";
        if (c.state == Conn::State::closing)
          drop(c, "did not take the server's refusal within " + limit + " of connecting");
        else if (c.bytes_in == 0)
          drop(c, "sent nothing within " + limit + " of connecting (a half-open connection)");
        else
          drop(c, std::string("did not finish its hello") +
                      (token_.empty() ? "" : " and proof of RINGREDUCE_TOKEN") + " within " +
                      limit + " of connecting (" + std::to_string(c.bytes_in) +
                      " bytes received: a slow trickle or a stall)");
        continue;
      }
      next = std::min(next, c.handshake_deadline);
    }
    if (c.state == Conn::State::parked) {
      if (t >= c.parked_deadline) {
        std::vector<uint8_t> payload;
        wire::Writer w(&payload);
        w.u32(static_cast<uint32_t>(c.parked_missing.size()));
        for (const auto& k : c.parked_missing) w.str(k);
        unpark(c);
        respond(c, wire::Status::timeout, payload);
        runnable_.push_back(c.id);
      } else {
        next = std::min(next, c.parked_deadline);
      }
    }
    if (!c.dead && c.mid_transfer()) {
      if (t - c.last_progress >= stall_timeout_) {
        drop(c, "stalled for " + std::to_string(stall_timeout_.count()) +
                    " ms in the middle of a " +
                    (c.handshaking()   ? "hello"
                     : c.out_pending() ? "response"
                                       : "request"));
      } else {
        next = std::min(next, c.last_progress + stall_timeout_);
      }
    }
    if (!c.dead) update_interest(c);
  }
  next_timer_check = next;
}

void StoreEngine::run_runnable() {
  // Bounded: each pass takes the whole queue, and a connection is queued again only when
  // another connection's set() un-parks it, which consumes that set's input.
  while (!runnable_.empty()) {
    std::vector<uint64_t> batch;
    batch.swap(runnable_);
    for (uint64_t id : batch) {
      auto it = conns.find(id);
      if (it == conns.end() || it->second.dead) continue;
      Conn& c = it->second;
      try {
        process(c);
        update_interest(c);
      } catch (const std::exception& e) {
        drop(c, std::string("internal error: ") + e.what());
      }
    }
  }
}

void StoreEngine::sweep() {
  for (auto it = conns.begin(); it != conns.end();) {
    if (it->second.dead) {
      if (it->second.state == Conn::State::parked) unpark(it->second);
      it = conns.erase(it);  // closes the socket, which also removes it from the epoll set
    } else {
      ++it;
    }
  }
}

}  // namespace

struct TcpStoreServer::Impl final : StoreEngine {
  Impl(const std::string& host, int port, const std::string& token, milliseconds stall_timeout);
  ~Impl() override {
    // Wake the loop; it returns, and the jthread (declared last, destroyed first) joins it
    // before any descriptor it uses is closed.
    uint64_t one = 1;
    ssize_t ignored = ::write(wake_fd.get(), &one, sizeof(one));
    (void)ignored;
  }

  void run();
  void accept_all();
  void on_event(Conn& c, uint32_t events);
  void read_some(Conn& c);

  Clock::time_point now() const override { return Clock::now(); }
  void flush(Conn& c) override;
  void update_interest(Conn& c) override;

  core::Fd listen_fd;
  core::Fd epoll_fd;
  core::Fd wake_fd;
  int bound_port = -1;

  // Everything below, and the engine's state, is touched only by the server thread.
  bool listener_paused = false;
  Clock::time_point listener_resume;
  std::vector<uint8_t> scratch = std::vector<uint8_t>(256 * 1024);

  std::jthread thread;  // last: joined before the members above are destroyed
};

// The server takes no Options, so the stall bound comes from the RINGREDUCE_TIMEOUT setting.
milliseconds stall_timeout_setting() {
  double timeout_s = core::Config().number("RINGREDUCE_TIMEOUT");
  if (timeout_s > 0 && timeout_s < 1e7) return milliseconds(int64_t(timeout_s * 1000));
  return milliseconds(300000);
}

TcpStoreServer::Impl::Impl(const std::string& host, int port, const std::string& token,
                           milliseconds stall_timeout)
    : StoreEngine(token, stall_timeout, /*log_drops=*/true, kFirstConnId) {
  // Proofs are made in the serving thread, where a missing libcrypto would only drop clients.
  if (!token.empty()) core::auth::require_crypto();
  if (port < 0 || port > 65535)
    throw InvalidArgument("TCP store: port " + std::to_string(port) + " is not in 0..65535");

  std::string error;
  AddrInfoList addrs = resolve_tcp(host, port, /*passive=*/true, &error);
  if (!addrs)
    throw Error("TCP store: cannot listen on " + join_host_port(host, port) + ": " + error);
  std::string failures;
  for (addrinfo* ai = addrs.get(); ai != nullptr && !listen_fd.valid(); ai = ai->ai_next) {
    core::Fd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      failures += " socket: " + errno_text() + ";";
      continue;
    }
    int one = 1;
    // A restarted server must be able to bind while old connections linger in TIME_WAIT.
    ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (ai->ai_family == AF_INET6) {
      // "::" should also accept IPv4 clients, whatever the system default for v6only is.
      int zero = 0;
      ::setsockopt(fd.get(), IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof(zero));
    }
    std::string addr = describe_address(ai->ai_addr, ai->ai_addrlen);
    if (::bind(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
      failures += " bind " + addr + ": " + errno_text() + ";";
      continue;
    }
    // Every rank connects at start-up at about the same moment: ask for the longest backlog.
    if (::listen(fd.get(), SOMAXCONN) != 0) {
      failures += " listen " + addr + ": " + errno_text() + ";";
      continue;
    }
    listen_fd = std::move(fd);
  }
  if (!listen_fd.valid())
    throw Error("TCP store: cannot listen on " + join_host_port(host, port) + ":" + failures);

  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (::getsockname(listen_fd.get(), reinterpret_cast<sockaddr*>(&ss), &len) != 0)
    throw Error("TCP store: getsockname: " + errno_text());
  bound_port = ss.ss_family == AF_INET6 ? ntohs(reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port)
                                        : ntohs(reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  where = "TCP store on port " + std::to_string(bound_port);

  epoll_fd.reset(::epoll_create1(EPOLL_CLOEXEC));
  if (!epoll_fd.valid()) throw Error("TCP store: epoll_create1: " + errno_text());
  wake_fd.reset(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC));
  if (!wake_fd.valid()) throw Error("TCP store: eventfd: " + errno_text());
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.u64 = kListenerId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, listen_fd.get(), &ev) != 0)
    throw Error("TCP store: epoll_ctl: " + errno_text());
  ev.data.u64 = kWakeId;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, wake_fd.get(), &ev) != 0)
    throw Error("TCP store: epoll_ctl: " + errno_text());

  RR_LOG(info, -1, "TCP store listening on ", join_host_port(host.empty() ? "*" : host, bound_port),
         token.empty() ? " (no RINGREDUCE_TOKEN: connections are not authenticated)"
                       : " (clients must prove they hold RINGREDUCE_TOKEN)");
  thread = std::jthread([this] { run(); });
}

void TcpStoreServer::Impl::run() {
  constexpr int kMaxEvents = 256;
  epoll_event events[kMaxEvents];
  // Runs until the destructor signals wake_fd; each pass is bounded by epoll_wait's timeout.
  for (;;) {
    int timeout_ms = kMaxSleepMs;
    auto t = Clock::now();
    auto next = next_timer_check;
    if (listener_paused) next = std::min(next, listener_resume);
    if (next != Clock::time_point::max()) {
      auto ms = std::chrono::duration_cast<milliseconds>(next - t).count() + 1;
      timeout_ms = static_cast<int>(std::clamp<int64_t>(ms, 0, kMaxSleepMs));
    }
    int n = ::epoll_wait(epoll_fd.get(), events, kMaxEvents, timeout_ms);
    if (n < 0) {
      if (errno == EINTR) continue;
      RR_LOG(warn, -1, where, ": epoll_wait failed (", errno_text(), "); the store stops");
      return;
    }
    try {
      for (int i = 0; i < n; ++i) {
        uint64_t id = events[i].data.u64;
        if (id == kWakeId) return;
        if (id == kListenerId) {
          accept_all();
          continue;
        }
        auto it = conns.find(id);
        if (it == conns.end() || it->second.dead) continue;
        on_event(it->second, events[i].events);
      }
      run_runnable();
      if (listener_paused && Clock::now() >= listener_resume) {
        epoll_event ev{};
        ev.events = EPOLLIN;
        ev.data.u64 = kListenerId;
        ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
        listener_paused = false;
      }
      check_timers();
      run_runnable();
    } catch (const std::exception& e) {
      // Per-connection failures are handled where they happen; this is the last line of
      // defence (bad_alloc in a timer pass, ...), and the store is worth keeping alive.
      RR_LOG(warn, -1, where, ": internal error: ", e.what());
    }
    sweep();
  }
}

void TcpStoreServer::Impl::accept_all() {
  for (int i = 0; i < kAcceptBudget; ++i) {
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    int fd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&ss), &len,
                       SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
        // The pending connection stays in the backlog; stop polling the listener for a while
        // rather than spinning on it until a descriptor is freed.
        RR_LOG(warn, -1, where, ": accept failed (", errno_text(), "); pausing accepts for ",
               kAcceptPause.count(), " ms");
        epoll_event ev{};
        ev.data.u64 = kListenerId;
        ::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, listen_fd.get(), &ev);
        listener_paused = true;
        listener_resume = Clock::now() + kAcceptPause;
        return;
      }
      RR_LOG(warn, -1, where, ": accept failed: ", errno_text());
      return;
    }
    core::Fd owned(fd);
    set_nodelay(fd);
    int one = 1;
    // Lets the kernel notice a peer host that vanished without closing the connection.
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof(one));
    std::string peer = describe_address(reinterpret_cast<sockaddr*>(&ss), len);
    Conn& c = add_conn(std::move(owned), std::move(peer));
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = c.id;
    if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_ADD, fd, &ev) != 0) {
      drop(c, "epoll_ctl on a new connection failed: " + errno_text());
      continue;
    }
    c.events = EPOLLIN;
    RR_LOG(trace, -1, where, ": client ", c.peer, " connected");
  }
}

void TcpStoreServer::Impl::on_event(Conn& c, uint32_t events) {
  try {
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) read_some(c);
    if (!c.dead && (events & EPOLLOUT)) flush(c);
    if (!c.dead) process(c);
    if (!c.dead) update_interest(c);
  } catch (const std::exception& e) {
    // bad_alloc and the like: lose this client, never the server.
    drop(c, std::string("internal error: ") + e.what());
  }
}

void TcpStoreServer::Impl::read_some(Conn& c) {
  size_t budget = kReadBudget;
  // Bounded by the budget: every pass reads at least one byte or returns.
  while (budget > 0 && !c.dead) {
    // Into a scratch buffer first: growing c.in by a chunk per recv would zero the chunk each
    // time, which costs more than copying the few bytes a typical request has.
    ssize_t n = ::recv(c.fd.get(), scratch.data(), std::min(budget, scratch.size()), MSG_DONTWAIT);
    if (n > 0) {
      on_input(c, scratch.data(), static_cast<size_t>(n));
      budget -= static_cast<size_t>(n);
      continue;
    }
    if (n == 0) {
      on_eof(c);
      return;
    }
    if (errno == EINTR) continue;
    if (errno == EAGAIN || errno == EWOULDBLOCK) return;
    drop(c, "receive failed: " + errno_text());
    return;
  }
}

void TcpStoreServer::Impl::flush(Conn& c) {
  // Bounded: every pass sends at least one byte or returns.
  while (c.out_pending() && !c.dead) {
    ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off,
                       MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      sent(c, static_cast<size_t>(n));
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
    drop(c, "send failed: " + errno_text());
    return;
  }
  if (!c.dead) sent(c, 0);  // nothing was pending: a refusal already delivered closes now
}

void TcpStoreServer::Impl::update_interest(Conn& c) {
  if (c.dead) return;
  uint32_t want = EPOLLIN | (c.out_pending() ? EPOLLOUT : 0u);
  if (want == c.events) return;
  epoll_event ev{};
  ev.events = want;
  ev.data.u64 = c.id;
  if (::epoll_ctl(epoll_fd.get(), EPOLL_CTL_MOD, c.fd.get(), &ev) != 0) {
    drop(c, "epoll_ctl failed: " + errno_text());
    return;
  }
  c.events = want;
}

TcpStoreServer::TcpStoreServer(const std::string& host, int port, const std::string& token)
    : impl_(std::make_unique<Impl>(host, port, token, stall_timeout_setting())) {}

TcpStoreServer::~TcpStoreServer() = default;

int TcpStoreServer::port() const {
  return impl_->bound_port;
}

void TcpStoreServer::quiet() {
  impl_->quiet.store(true, std::memory_order_relaxed);
}

TcpStoreServer::Stats TcpStoreServer::stats() const {
  return {impl_->requests_served.load(std::memory_order_relaxed),
          impl_->connections_accepted.load(std::memory_order_relaxed)};
}

// ---------------------------------------------------------------------------------------------
// TcpStoreProtocol: the engine with a hand-moved clock and output kept for the caller.

struct TcpStoreProtocol::Impl final : StoreEngine {
  Impl(const std::string& token, milliseconds stall_timeout)
      : StoreEngine(token, stall_timeout, /*log_drops=*/false, 1) {
    where = "TCP store protocol";
  }
  Clock::time_point now() const override { return clock; }
  void flush(Conn&) override {}  // output stays in c.out until take_output()
  void update_interest(Conn&) override {}

  Conn* find(uint64_t id) {
    auto it = conns.find(id);
    return it == conns.end() ? nullptr : &it->second;
  }

  // Far from the epoch, so that nothing computed from it can underflow.
  Clock::time_point clock = Clock::time_point() + std::chrono::hours(24);
};

TcpStoreProtocol::TcpStoreProtocol(const std::string& token, std::chrono::milliseconds stall)
    : impl_(std::make_unique<Impl>(token, stall)) {}

TcpStoreProtocol::~TcpStoreProtocol() = default;

uint64_t TcpStoreProtocol::connect() {
  impl_->sweep();
  return impl_->add_conn(core::Fd(), "client " + std::to_string(impl_->conns.size())).id;
}

bool TcpStoreProtocol::receive(uint64_t conn, const uint8_t* data, size_t len) {
  Conn* c = impl_->find(conn);
  if (c == nullptr || c->dead) return false;
  try {
    impl_->on_input(*c, data, len);
    impl_->process(*c);
    impl_->run_runnable();
  } catch (const std::exception& e) {
    impl_->drop(*c, std::string("internal error: ") + e.what());
  }
  return !c->dead;
}

void TcpStoreProtocol::client_closed(uint64_t conn) {
  if (Conn* c = impl_->find(conn)) impl_->on_eof(*c);
  impl_->sweep();
}

std::vector<uint8_t> TcpStoreProtocol::take_output(uint64_t conn) {
  Conn* c = impl_->find(conn);
  if (c == nullptr) return {};
  std::vector<uint8_t> out(c->out.begin() + static_cast<ptrdiff_t>(c->out_off), c->out.end());
  impl_->sent(*c, out.size());
  if (!c->dead) {
    // Output delivered may let a connection held back by kOutputHighWater go on.
    impl_->process(*c);
    impl_->run_runnable();
  }
  return out;
}

bool TcpStoreProtocol::is_open(uint64_t conn) const {
  auto it = impl_->conns.find(conn);
  return it != impl_->conns.end() && !it->second.dead;
}

void TcpStoreProtocol::advance(std::chrono::milliseconds d) {
  impl_->clock +=
      std::clamp(d, std::chrono::milliseconds(0), std::chrono::milliseconds(int64_t{1} << 40));
  impl_->check_timers();
  impl_->run_runnable();
}

size_t TcpStoreProtocol::connections() const {
  size_t n = 0;
  for (const auto& [id, c] : impl_->conns) n += c.dead ? 0 : 1;
  return n;
}

}  // namespace ringreduce::rendezvous
