// The torch TCPStore client (torch_store.h): the probes, the two dialects' query types, a pool of
// connections, and the five Store operations over them.
#include "rendezvous/torch_store.h"

#include <sys/socket.h>

#include <algorithm>
#include <mutex>
#include <thread>
#include <vector>

#include "core/fd.h"
#include "core/log.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/store_util.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using core::Clock;
using core::Deadline;
using std::chrono::milliseconds;

// The query types of the operations used here, per dialect.
struct QueryTypes {
  uint8_t set, get, add, check, wait;
};
constexpr QueryTypes kV1Types{0, 2, 3, 4, 5};
constexpr QueryTypes kV2Types{1, 3, 4, 5, 6};
constexpr uint8_t kV2Validate = 0;
constexpr uint8_t kV2Ping = 13;
constexpr uint8_t kV1GetNumKeys = 6;
constexpr uint32_t kV2Magic = 0x3C85F7CE;
// The ping's nonce: its third byte, 0xFF, is the top byte of the key length a v1 server reads
// from the probe, which makes that length absurd (see torch_store.h).
constexpr uint32_t kPingNonce = 0x52FF5252;
constexpr uint8_t kReady = 0;     // CHECK's answer when every key is set
constexpr uint8_t kStopWait = 0;  // WAIT's answer once every key is set

// Limits on what a server's answer may make this client allocate.
constexpr uint64_t kMaxValueBytes = uint64_t{1} << 30;
constexpr size_t kMaxIdleTorch = 8;
// A probe that gets no answer (a service that is not a torch store, waiting for more bytes) is
// given up after this long, or the connect timeout if shorter.
constexpr milliseconds kProbeLimit(10000);
// After a timed-out wait, the keys still missing are looked up one by one for the message; at
// most this many (a wait on every rank's key, timed out in 100 ms slices, must stay cheap).
constexpr size_t kMaxKeysLookedUp = 16;

// A request under construction: the type byte and its arguments, in the host's byte order as
// torch sends them.
class Request {
 public:
  explicit Request(uint8_t type) { buf_.push_back(type); }
  Request& u8(uint8_t v) { return raw(&v, sizeof(v)); }
  Request& u32(uint32_t v) { return raw(&v, sizeof(v)); }
  Request& u64(uint64_t v) { return raw(&v, sizeof(v)); }
  Request& bytes(const void* p, size_t n) {
    u64(n);
    return raw(p, n);
  }
  Request& key(const std::string& k) {
    // torch's TCPStore client puts "/" before every key; so does this one.
    u64(k.size() + 1);
    buf_.push_back('/');
    return raw(k.data(), k.size());
  }
  Request& keys(const std::vector<std::string>& ks) {
    u64(ks.size());
    for (const auto& k : ks) key(k);
    return *this;
  }
  const std::vector<uint8_t>& data() const { return buf_; }

 private:
  Request& raw(const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    buf_.insert(buf_.end(), b, b + n);
    return *this;
  }
  std::vector<uint8_t> buf_;
};

class TorchStoreClient : public Store {
 public:
  TorchStoreClient(std::string host, int port, milliseconds timeout)
      : host_(std::move(host)),
        port_(port),
        timeout_(std::max(timeout, milliseconds(0))),
        name_("torch's TCPStore at " + join_host_port(host_, port_)) {}

  // The first connection finds the dialect; it goes into the pool.
  void connect_first() { release(connect_with_retry(store_deadline(timeout_))); }

  TorchStoreDialect dialect() const { return dialect_; }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    const Deadline deadline = store_deadline(timeout_);
    core::Fd fd = acquire(deadline);
    Request set(types().set);
    set.key(key).bytes(value.data(), value.size());
    send(fd, set, deadline, "set");
    // SET has no answer: the CHECK behind it on the same connection is answered only once the
    // server has stored the value.
    if (!check_on(fd, {key}, deadline, "set"))
      throw PeerError(name_ + ": key " + quote_key(key) + " is not there right after its set", -1);
    release(std::move(fd));
  }

  std::vector<uint8_t> get(const std::string& key, milliseconds timeout) override {
    wait(std::vector<std::string>{key}, timeout);
    const Deadline deadline = store_deadline(timeout_);
    core::Fd fd = acquire(deadline);
    Request get(types().get);
    get.key(key);
    send(fd, get, deadline, "get");
    const uint64_t len = recv_value<uint64_t>(fd, deadline, "get");
    if (len > kMaxValueBytes)
      throw PeerError(name_ + ": a get answered a value of " + std::to_string(len) +
                          " bytes, over the limit of " + std::to_string(kMaxValueBytes),
                      -1);
    std::vector<uint8_t> value(static_cast<size_t>(len));
    io_or_throw(recv_exact(fd.get(), value.data(), value.size(), deadline), "get");
    release(std::move(fd));
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    const Deadline deadline = store_deadline(timeout_);
    core::Fd fd = acquire(deadline);
    Request add(types().add);
    add.key(key).u64(static_cast<uint64_t>(delta));
    send(fd, add, deadline, "add");
    const auto v = static_cast<int64_t>(recv_value<uint64_t>(fd, deadline, "add"));
    release(std::move(fd));
    return v;
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    if (keys.empty()) return;
    // The answer may take the whole timeout; the request's own deadline is the store's.
    const Deadline deadline = store_deadline(timeout);
    core::Fd fd = acquire(store_deadline(timeout_));
    Request wait(types().wait);
    wait.keys(keys);
    send(fd, wait, store_deadline(timeout_), "wait");
    uint8_t answer = 0;
    const IoResult r = recv_exact(fd.get(), &answer, 1, deadline);
    if (r == IoResult::timeout) {
      // The answer is still to come on this connection: it is closed, not reused.
      fd.reset();
      throw TimeoutError(missing_keys_message(name_, still_missing(keys), timeout));
    }
    io_or_throw(r, "wait");
    if (answer != kStopWait)
      throw PeerError(name_ + ": a wait answered " + std::to_string(answer) + ", not 0", -1);
    release(std::move(fd));
  }

  bool check(const std::vector<std::string>& keys) override {
    const Deadline deadline = store_deadline(timeout_);
    core::Fd fd = acquire(deadline);
    const bool ready = check_on(fd, keys, deadline, "check");
    release(std::move(fd));
    return ready;
  }

 private:
  const QueryTypes& types() const {
    return dialect_ == TorchStoreDialect::v1 ? kV1Types : kV2Types;
  }

  bool check_on(const core::Fd& fd, const std::vector<std::string>& keys, const Deadline& deadline,
                const char* op) {
    Request check(types().check);
    check.keys(keys);
    send(fd, check, deadline, op);
    const auto answer = recv_value<uint8_t>(fd, deadline, op);
    if (answer > 1)
      throw PeerError(name_ + ": a check answered " + std::to_string(answer) + ", not 0 or 1", -1);
    return answer == kReady;
  }

  // For a timeout's message: which of the keys are not set (the first kMaxKeysLookedUp looked
  // up, the rest named as they are); every key if the lookup itself fails.
  std::vector<std::string> still_missing(const std::vector<std::string>& keys) {
    if (keys.size() == 1) return keys;
    try {
      std::vector<std::string> missing;
      const Deadline deadline = store_deadline(std::min(timeout_, milliseconds(1000)));
      core::Fd fd = acquire(deadline);
      for (size_t i = 0; i < keys.size(); ++i) {
        if (i >= kMaxKeysLookedUp || !check_on(fd, {keys[i]}, deadline, "check"))
          missing.push_back(keys[i]);
      }
      release(std::move(fd));
      return missing.empty() ? keys : missing;
    } catch (const Error&) {
      return keys;
    }
  }

  void send(const core::Fd& fd, const Request& req, const Deadline& deadline, const char* op) {
    io_or_throw(send_exact(fd.get(), req.data().data(), req.data().size(), deadline), op);
  }

  template <typename T>
  T recv_value(const core::Fd& fd, const Deadline& deadline, const char* op) {
    T v{};
    io_or_throw(recv_exact(fd.get(), &v, sizeof(v), deadline), op);
    return v;
  }

  void io_or_throw(IoResult r, const char* op) const {
    switch (r) {
      case IoResult::ok:
        return;
      case IoResult::timeout:
        throw TimeoutError(name_ + ": no answer to a " + op + " within the store timeout of " +
                           std::to_string(timeout_.count()) + " ms");
      case IoResult::closed:
        // torch's server closes a connection whose request it cannot serve (or it went away
        // with torchrun's agent).
        throw PeerError(name_ + ": the server closed the connection during a " + op, -1);
      case IoResult::error:
        throw PeerError(name_ + ": a " + op + " failed: " + core::errno_text(), -1);
    }
  }

  core::Fd acquire(const Deadline& deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        core::Fd fd = std::move(idle_.back());
        idle_.pop_back();
        return fd;
      }
    }
    return connect_with_retry(deadline.earliest(store_deadline(timeout_)));
  }

  // Only a connection whose every answer was read comes back here.
  void release(core::Fd fd) {
    std::lock_guard<std::mutex> lock(mu_);
    if (idle_.size() < kMaxIdleTorch) idle_.push_back(std::move(fd));
  }

  core::Fd connect_with_retry(const Deadline& deadline) {
    return rendezvous::connect_with_retry(name_, timeout_, deadline,
                                          [this](const Deadline& d) { return connect_once(d); });
  }

  core::Fd connect_once(const Deadline& deadline) {
    std::string error;
    AddrInfoList addrs = resolve_tcp(host_, port_, /*passive=*/false, &error);
    if (!addrs) throw Retryable{error};
    std::string reasons;
    for (addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
      const std::string addr = describe_address(ai->ai_addr, ai->ai_addrlen);
      std::string why;
      core::Fd fd = open_to(ai, deadline, &why);
      if (fd.valid()) {
        if (!known_) {
          why = probe(fd, ai, deadline);
          if (why.empty()) return fd;
        } else {
          why = handshake(fd, deadline);
          if (why.empty()) return fd;
        }
      }
      reasons += (reasons.empty() ? "" : "; ") + addr + ": " + why;
      if (deadline.expired()) break;
    }
    throw Retryable{reasons};
  }

  static core::Fd open_to(const addrinfo* ai, const Deadline& deadline, std::string* why) {
    core::Fd fd(
        ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
    if (!fd.valid()) {
      *why = "socket: " + core::errno_text();
      return fd;
    }
    *why = connect_before(fd.get(), ai, deadline);
    if (!why->empty()) return core::Fd();
    set_nodelay(fd.get());
    return fd;
  }

  // A new connection in the known dialect: v2's VALIDATE (no answer), v1's nothing.
  std::string handshake(const core::Fd& fd, const Deadline& deadline) {
    if (dialect_ == TorchStoreDialect::v1) return "";
    Request validate(kV2Validate);
    validate.u32(kV2Magic);
    if (send_exact(fd.get(), validate.data().data(), validate.data().size(), deadline) !=
        IoResult::ok)
      return "sending VALIDATE failed";
    return "";
  }

  // The first connection: the v2 probe on it, then the v1 probe on a second one if the server
  // closed the first. "" once the dialect is known (fd is then the connection to use); a reason
  // to retry when the connection failed for another cause. Throws when the server answered
  // neither probe the way a torch store would.
  std::string probe(core::Fd& fd, const addrinfo* ai, const Deadline& deadline) {
    const Deadline limit = deadline.earliest(Deadline::after(kProbeLimit));
    // VALIDATE and its magic, then PING and its nonce, in one send.
    Request validate_ping(kV2Validate);
    validate_ping.u32(kV2Magic).u8(kV2Ping).u32(kPingNonce);
    const std::vector<uint8_t>& msg = validate_ping.data();
    const uint32_t nonce = kPingNonce;
    uint32_t echo = 0;
    IoResult r = send_exact(fd.get(), msg.data(), msg.size(), limit);
    if (r == IoResult::ok) r = recv_exact(fd.get(), &echo, sizeof(echo), limit);
    if (r == IoResult::ok) {
      if (echo != nonce) throw not_torch("its answer to torch 2's PING is not the nonce sent");
      adopt(TorchStoreDialect::v2);
      return "";
    }
    if (r == IoResult::timeout) throw not_torch("no answer to torch 2's VALIDATE and PING");
    // Closed (or reset): a torch 1 server, or not a torch store. torch 1's probe, afresh.
    std::string why;
    fd = open_to(ai, deadline, &why);
    if (!fd.valid()) return why;
    const uint8_t getnumkeys = kV1GetNumKeys;
    int64_t numkeys = 0;
    r = send_exact(fd.get(), &getnumkeys, 1, limit);
    if (r == IoResult::ok) r = recv_exact(fd.get(), &numkeys, sizeof(numkeys), limit);
    if (r == IoResult::ok && numkeys >= 0) {
      adopt(TorchStoreDialect::v1);
      return "";
    }
    throw not_torch(
        "it closed the connection on torch 2's VALIDATE and PING, and did not answer torch 1's "
        "GETNUMKEYS either");
  }

  Error not_torch(const std::string& why) const {
    return Error(name_ +
                 ": the service there does not speak torch's TCPStore protocol as torch "
                 "1.13 or 2.x do (" +
                 why +
                 "); torchrun's agent store was expected there (TORCHELASTIC_USE_AGENT_STORE="
                 "True); set RINGREDUCE_ADDR=host:port to use a ringreduce store instead");
  }

  void adopt(TorchStoreDialect d) {
    std::lock_guard<std::mutex> lock(mu_);
    dialect_ = d;
    known_ = true;
  }

  const std::string host_;
  const int port_;
  const milliseconds timeout_;
  const std::string name_;
  std::mutex mu_;
  std::vector<core::Fd> idle_;
  // Set once, by the first connection (connect_first), before any other thread can see the
  // store.
  TorchStoreDialect dialect_ = TorchStoreDialect::v2;
  bool known_ = false;
};

}  // namespace

std::shared_ptr<Store> connect_torch_store(const std::string& host, int port,
                                           std::chrono::milliseconds timeout) {
  if (port <= 0 || port > 65535)
    throw InvalidArgument("connect_torch_store: port " + std::to_string(port) +
                          " is not in 1..65535");
  if (host.empty()) throw InvalidArgument("connect_torch_store: the host name is empty");
  auto store = std::make_shared<TorchStoreClient>(host, port, timeout);
  store->connect_first();
  return store;
}

std::optional<TorchStoreDialect> torch_store_dialect(const Store& store) {
  if (const auto* t = dynamic_cast<const TorchStoreClient*>(&store)) return t->dialect();
  return std::nullopt;
}

}  // namespace ringreduce::rendezvous
