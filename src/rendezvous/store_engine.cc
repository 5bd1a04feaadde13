// StoreEngine: the TCP store's protocol and data (store_engine.h).
#include "rendezvous/store_engine.h"

#include <cerrno>
#include <cstring>

#include "rendezvous/store_util.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous::store_server {
namespace {

// Unprocessed input beyond one maximal request means the client pipelines without reading.
constexpr size_t kMaxBufferedInput =
    wire::kFrameHeaderBytes + wire::max_request_payload(wire::Op::set) + 4096;
// Before its proof is accepted, a client of a store with a token has nothing more to say than
// one hello and one proof: anything beyond is a stranger filling memory.
constexpr size_t kMaxPreAuthInput =
    wire::kHelloBytes + wire::kMaxAuthBytes + core::auth::kProofBytes;
// Prefix of the messages in bad_request responses; the client puts its own name before it.
constexpr const char* kRejected = "the server rejected the request";

}  // namespace

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
  if (c.records) {
    // Sealed: only whole records that pass their check become input; what a record did to the
    // stream (replayed, dropped, reordered, altered) is said, and the client is dropped.
    c.sealed_in.insert(c.sealed_in.end(), data, data + len);
    try {
      c.records->open_all(c.sealed_in, &c.sealed_off, &c.in);
    } catch (const std::exception& e) {
      drop(c, std::string("a sealed record failed its check (RINGREDUCE_ENCRYPT): ") + e.what());
      return;
    }
    // What is left is less than one record (a read ends mid-record): kept at the front, and the
    // buffer's capacity let go once a large transfer is over.
    c.sealed_in.erase(c.sealed_in.begin(),
                      c.sealed_in.begin() + static_cast<std::ptrdiff_t>(c.sealed_off));
    c.sealed_off = 0;
    if (c.sealed_in.empty() && c.sealed_in.capacity() > (size_t{1} << 20))
      std::vector<uint8_t>().swap(c.sealed_in);
  } else {
    c.in.insert(c.in.end(), data, data + len);
  }
  if ((!security_.token.empty() || security_.encrypt != core::Encrypt::off) &&
      (c.state == Conn::State::hello || c.state == Conn::State::auth) &&
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
    RR_LOG(trace, store, -1, where, ": client ", c.peer, " disconnected");
    c.dead = true;
  }
}

void StoreEngine::process(Conn& c) {
  // Bounded: every pass consumes a complete hello, proof or request from c.in, or returns.
  while (!c.dead) {
    // tls: the socket is a handshake thread's until tls_done().
    if (c.state == Conn::State::parked || c.state == Conn::State::closing ||
        c.state == Conn::State::tls)
      return;
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
  if (c.records) {
    uint8_t header[wire::kFrameHeaderBytes];
    header[0] = static_cast<uint8_t>(status);
    const auto len = static_cast<uint32_t>(payload.size());
    for (int i = 0; i < 4; ++i) header[1 + i] = static_cast<uint8_t>(len >> (24 - 8 * i));
    c.records->seal({std::span<const uint8_t>(header), std::span<const uint8_t>(payload)}, &c.out);
  } else {
    wire::Writer w(&c.out);
    w.begin(static_cast<uint8_t>(status));
    w.raw(payload.data(), payload.size());
    w.end();
  }
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
        else if (c.state == Conn::State::tls)
          drop(c, "did not finish its TLS handshake within " + limit + " of connecting (" +
                      (c.tls_started ? "a slow or stalled client, or the store's handshake "
                                       "threads busy with others"
                                     : "it sent nothing after its hello") +
                      ")");
        else
          drop(c, std::string("did not finish its hello") +
                      (security_.encrypt == core::Encrypt::tls ? " and TLS handshake"
                       : security_.token.empty()               ? ""
                                                               : " and proof of RINGREDUCE_TOKEN") +
                      " within " + limit + " of connecting (" + std::to_string(c.bytes_in) +
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

}  // namespace ringreduce::rendezvous::store_server
