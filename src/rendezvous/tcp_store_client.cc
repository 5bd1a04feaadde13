// The TCP store client. Each request takes a connection from a small pool, so that threads of
// one process can share the store without queueing behind each other: a thread parked in a long
// get() must not keep another thread from the set() that would satisfy it. A connection goes
// back to the pool only after a complete, well-formed response; on any I/O error, timeout or
// protocol violation it is closed, because its request/response stream is no longer in step.
// With a token, every new connection runs the mutual proof of tcp_store_wire.h before its first
// request; with RINGREDUCE_ENCRYPT=psk or tls its requests and responses then travel sealed
// (store_records.h).
#include "rendezvous/tcp_store.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <thread>

#include "core/auth.h"
#include "core/fd.h"
#include "core/log.h"
#include "core/tls_keys.h"
#include "rendezvous/socket_util.h"
#include "rendezvous/store_records.h"
#include "rendezvous/store_util.h"
#include "rendezvous/tcp_store_wire.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using core::Clock;
using core::Deadline;
using std::chrono::milliseconds;

// Idle connections kept for reuse; more than this many concurrent requests open extra
// connections that are closed afterwards.
constexpr size_t kMaxIdle = 8;
// One connect() attempt to one address waits at most this long, so that an address that drops
// SYNs does not use up the whole timeout before the others are tried.
constexpr milliseconds kConnectAttemptMax(10000);

using core::errno_text;

// A connection of the pool: its socket and, encrypted, its records.
struct Channel {
  core::Fd fd;
  std::unique_ptr<StoreRecords> records;
};

class TcpStoreClient : public Store {
 public:
  TcpStoreClient(std::string host, int port, milliseconds timeout, core::Security security)
      : host_(std::move(host)),
        port_(port),
        timeout_(std::max(timeout, milliseconds(0))),
        security_(std::move(security)),
        name_("TCP store at " + join_host_port(host_, port_)) {
    if (security_.encrypt == core::Encrypt::tls)
      tls_ = std::make_unique<const core::tls::Context>(security_.tls);
  }

  // Opens the first connection, retrying until the timeout: the server may start later.
  void connect_first() { release(connect_with_retry(store_deadline(timeout_)), true); }

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    check_key(key);
    if (value.size() > wire::kMaxValueBytes)
      throw InvalidArgument(name_ + ": value of " + std::to_string(value.size()) +
                            " bytes for key " + quote_key(key) + " exceeds the limit of " +
                            std::to_string(wire::kMaxValueBytes));
    std::vector<uint8_t> req;
    wire::Writer w(&req);
    w.begin(static_cast<uint8_t>(wire::Op::set));
    w.str(key);
    w.bytes(value.data(), value.size());
    w.end();
    call(wire::Op::set, req, store_deadline(timeout_), [](wire::Status s, wire::Reader& r) {
      expect_ok(s);
      r.expect_end();
      return 0;
    });
  }

  std::vector<uint8_t> get(const std::string& key, milliseconds timeout) override {
    check_key(key);
    std::vector<uint8_t> req;
    wire::Writer w(&req);
    w.begin(static_cast<uint8_t>(wire::Op::get));
    w.u64(wire_timeout(timeout));
    w.str(key);
    w.end();
    return call(wire::Op::get, req, response_deadline(timeout),
                [&](wire::Status s, wire::Reader& r) {
                  if (s == wire::Status::timeout) throw_timeout(r, timeout);
                  expect_ok(s);
                  auto v = r.value();
                  r.expect_end();
                  return v;
                });
  }

  int64_t add(const std::string& key, int64_t delta) override {
    check_key(key);
    std::vector<uint8_t> req;
    wire::Writer w(&req);
    w.begin(static_cast<uint8_t>(wire::Op::add));
    w.str(key);
    w.u64(static_cast<uint64_t>(delta));
    w.end();
    return call(wire::Op::add, req, store_deadline(timeout_), [&](wire::Status s, wire::Reader& r) {
      if (s == wire::Status::bad_request) {
        std::string message = r.message();
        r.expect_end();
        throw InvalidArgument(name_ + ": " + message);
      }
      expect_ok(s);
      auto v = static_cast<int64_t>(r.u64());
      r.expect_end();
      return v;
    });
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    std::vector<uint8_t> req;
    wire::Writer w(&req);
    w.begin(static_cast<uint8_t>(wire::Op::wait));
    w.u64(wire_timeout(timeout));
    append_keys(&w, keys);
    w.end();
    call(wire::Op::wait, req, response_deadline(timeout), [&](wire::Status s, wire::Reader& r) {
      if (s == wire::Status::timeout) throw_timeout(r, timeout);
      expect_ok(s);
      r.expect_end();
      return 0;
    });
  }

  std::optional<std::vector<uint8_t>> get_unless(const std::string& key, const std::string& unless,
                                                 milliseconds timeout) override {
    check_key(key);
    check_key(unless);
    std::vector<uint8_t> req;
    wire::Writer w(&req);
    w.begin(static_cast<uint8_t>(wire::Op::get_unless));
    w.u64(wire_timeout(timeout));
    w.str(key);
    w.str(unless);
    w.end();
    return call(wire::Op::get_unless, req, response_deadline(timeout),
                [&](wire::Status s, wire::Reader& r) -> std::optional<std::vector<uint8_t>> {
                  if (s == wire::Status::timeout) {
                    (void)r.keys();
                    r.expect_end();
                    throw TimeoutError(missing_keys_message(name_, {key}, timeout));
                  }
                  expect_ok(s);
                  const uint8_t which = r.u8();
                  auto v = r.value();
                  r.expect_end();
                  if (which > 1)
                    throw wire::ProtocolError("get_unless answered " + std::to_string(which));
                  if (which == 1) return std::nullopt;
                  return v;
                });
  }

  bool check(const std::vector<std::string>& keys) override {
    std::vector<uint8_t> req;
    wire::Writer w(&req);
    w.begin(static_cast<uint8_t>(wire::Op::check));
    append_keys(&w, keys);
    w.end();
    return call(wire::Op::check, req, store_deadline(timeout_),
                [&](wire::Status s, wire::Reader& r) {
                  expect_ok(s);
                  uint8_t v = r.u8();
                  r.expect_end();
                  if (v > 1) throw wire::ProtocolError("check answered " + std::to_string(v));
                  return v == 1;
                });
  }

 private:
  void check_key(const std::string& key) const {
    if (key.size() > wire::kMaxKeyBytes)
      throw InvalidArgument(name_ + ": key of " + std::to_string(key.size()) +
                            " bytes exceeds the limit of " + std::to_string(wire::kMaxKeyBytes) +
                            ": " + quote_key(key));
  }

  void append_keys(wire::Writer* w, const std::vector<std::string>& keys) const {
    if (keys.size() > wire::kMaxKeys)
      throw InvalidArgument(name_ + ": " + std::to_string(keys.size()) +
                            " keys in one request exceed the limit of " +
                            std::to_string(wire::kMaxKeys));
    w->u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) {
      check_key(k);
      w->str(k);
    }
  }

  static uint64_t wire_timeout(milliseconds timeout) {
    return static_cast<uint64_t>(std::max<int64_t>(timeout.count(), 0));
  }

  // The server answers a get/wait at its timeout; the client allows one more request timeout
  // for the answer to arrive before it gives up on the server.
  Deadline response_deadline(milliseconds timeout) const {
    constexpr milliseconds kCap = std::chrono::hours(24 * 365 * 10);
    return store_deadline(std::clamp(timeout, milliseconds(0), kCap) + timeout_);
  }

  static void expect_ok(wire::Status s) {
    if (s != wire::Status::ok)
      throw wire::ProtocolError("unexpected status " + std::to_string(static_cast<int>(s)));
  }

  // A get/wait the server timed out: the payload lists the keys still missing.
  [[noreturn]] void throw_timeout(wire::Reader& r, milliseconds timeout) const {
    std::vector<std::string> missing = r.keys();
    r.expect_end();
    throw TimeoutError(missing_keys_message(name_, missing, timeout));
  }

  // Sends one request and hands its response to `parse`, under the deadline. Errors that the
  // server reported in a well-formed response (a timeout, a rejected add) leave the connection
  // in step, so it goes back to the pool; anything else closes it.
  template <typename Parse>
  auto call(wire::Op op, const std::vector<uint8_t>& request, const Deadline& deadline, Parse parse)
      -> decltype(parse(wire::Status::ok, std::declval<wire::Reader&>())) {
    Channel ch = acquire(deadline);
    std::vector<uint8_t> payload;
    wire::Status status = exchange(ch, op, request, deadline, &payload);
    wire::Reader reader(payload.data(), payload.size());
    try {
      auto result = parse(status, reader);
      release(std::move(ch), false);
      return result;
    } catch (const wire::ProtocolError& e) {
      throw PeerError(name_ + ": malformed " + wire::op_name(op) + " response: " + e.what(), -1);
    } catch (const Error&) {
      release(std::move(ch), false);
      throw;
    }
  }

  wire::Status exchange(Channel& ch, wire::Op op, const std::vector<uint8_t>& request,
                        const Deadline& deadline, std::vector<uint8_t>* payload) {
    const char* what = wire::op_name(op);
    const int fd = ch.fd.get();
    if (ch.records) {
      std::vector<uint8_t> sealed;
      ch.records->seal({std::span<const uint8_t>(request)}, &sealed);
      io_or_throw(send_exact(fd, sealed.data(), sealed.size(), deadline), what, "sending");
    } else {
      io_or_throw(send_exact(fd, request.data(), request.size(), deadline), what, "sending");
    }
    uint8_t header[wire::kFrameHeaderBytes];
    std::vector<uint8_t> first;  // sealed: the record(s) holding the header, and what follows it
    if (ch.records) {
      read_plain(ch, wire::kFrameHeaderBytes, &first, deadline, what);
      std::copy(first.begin(), first.begin() + wire::kFrameHeaderBytes, header);
    } else {
      io_or_throw(recv_exact(fd, header, sizeof(header), deadline), what, "receiving");
    }
    uint8_t status = header[0];
    uint32_t len = wire::load32(header + 1);
    if (!wire::valid_status(status) || len > wire::kMaxResponsePayload)
      throw PeerError(name_ + ": malformed " + what + " response (status " +
                          std::to_string(status) + ", length " + std::to_string(len) + ")",
                      -1);
    if (ch.records) {
      // The rest of the payload opens straight into it (no shifting a large value by the header).
      payload->assign(first.begin() + wire::kFrameHeaderBytes, first.end());
      read_plain(ch, len, payload, deadline, what);
      // Strictly one response per request: a record's worth more would put the stream out of step.
      if (payload->size() != len)
        throw PeerError(
            name_ + ": the " + std::string(what) + " response came with bytes beyond it", -1);
    } else {
      payload->resize(len);
      io_or_throw(recv_exact(fd, payload->data(), len, deadline), what, "receiving");
    }
    return static_cast<wire::Status>(status);
  }

  // Opens records from the connection until *plain holds `want` bytes: each checked whole
  // before any of it is used.
  void read_plain(Channel& ch, size_t want, std::vector<uint8_t>* plain, const Deadline& deadline,
                  const char* what) {
    std::vector<uint8_t> record;
    // Bounded: every pass adds a record's 1 or more bytes to *plain, or throws.
    while (plain->size() < want) {
      uint8_t header[StoreRecords::kHeaderBytes];
      io_or_throw(recv_exact(ch.fd.get(), header, sizeof header, deadline), what, "receiving");
      size_t bytes = 0;
      try {
        bytes = StoreRecords::record_bytes(header);
        record.resize(bytes);
        std::copy(header, header + sizeof header, record.begin());
        io_or_throw(
            recv_exact(ch.fd.get(), record.data() + sizeof header, bytes - sizeof header, deadline),
            what, "receiving");
        ch.records->open(record.data(), plain);
      } catch (const wire::ProtocolError& e) {
        throw PeerError(name_ + ": a " + what + " response failed its check: " + e.what(), -1);
      } catch (const core::aead::FrameError& e) {
        throw PeerError(
            name_ + ": a " + what +
                " response failed its integrity check (RINGREDUCE_ENCRYPT): " + e.what(),
            -1);
      }
    }
  }

  void io_or_throw(IoResult r, const char* op, const char* doing) const {
    switch (r) {
      case IoResult::ok:
        return;
      case IoResult::timeout:
        throw TimeoutError(name_ + ": no answer to " + op + " within the store timeout of " +
                           std::to_string(timeout_.count()) + " ms");
      case IoResult::closed:
        throw PeerError(
            name_ + ": the server closed the connection while " + doing + " a " + op + " request",
            -1);
      case IoResult::error:
        throw PeerError(name_ + ": " + doing + " a " + op + " request failed: " + errno_text(), -1);
    }
  }

  // A pooled connection, or a new one; connecting counts against the request's deadline.
  Channel acquire(const Deadline& deadline) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!idle_.empty()) {
        Channel ch = std::move(idle_.back());
        idle_.pop_back();
        return ch;
      }
    }
    // Connecting outside the lock: other threads keep using the idle connections meanwhile.
    return connect_with_retry(deadline.earliest(store_deadline(timeout_)));
  }

  void release(Channel ch, bool force) {
    std::lock_guard<std::mutex> lock(mu_);
    if (force || idle_.size() < kMaxIdle) idle_.push_back(std::move(ch));
  }

  Channel connect_with_retry(const Deadline& deadline) {
    std::unique_ptr<StoreRecords> records;
    core::Fd fd = rendezvous::connect_with_retry(name_, timeout_, deadline, [&](const Deadline& d) {
      Channel ch = connect_once(d);
      records = std::move(ch.records);
      return std::move(ch.fd);
    });
    return Channel{std::move(fd), std::move(records)};
  }

  Channel connect_once(const Deadline& deadline) {
    std::string error;
    AddrInfoList addrs = resolve_tcp(host_, port_, /*passive=*/false, &error);
    if (!addrs) throw Retryable{error};
    std::string reasons;
    // Every address the name resolves to ("localhost" may be ::1 and 127.0.0.1), in order.
    for (addrinfo* ai = addrs.get(); ai != nullptr; ai = ai->ai_next) {
      std::string addr = describe_address(ai->ai_addr, ai->ai_addrlen);
      core::Fd fd(
          ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol));
      if (!fd.valid()) {
        reasons += (reasons.empty() ? "" : "; ") + addr + ": socket: " + errno_text();
        continue;
      }
      Deadline attempt = deadline.earliest(Deadline::after(kConnectAttemptMax));
      std::unique_ptr<StoreRecords> records;
      std::string why = connect_before(fd.get(), ai, attempt);
      if (why.empty()) why = hello(fd.get(), attempt, &records);
      if (why.empty()) {
        set_nodelay(fd.get());
        return Channel{std::move(fd), std::move(records)};
      }
      reasons += (reasons.empty() ? "" : "; ") + addr + ": " + why;
      if (deadline.expired()) break;
    }
    throw Retryable{reasons};
  }

  // The hello exchange (and with a token, the proofs both ways; with RINGREDUCE_ENCRYPT=tls, the
  // TLS handshake); returns "" when the server accepted it, with *records set where the
  // connection is encrypted, else a transient reason to retry. A server that answers with the
  // wrong magic or another version, a token on one side only or two different tokens, another
  // RINGREDUCE_ENCRYPT, or a certificate refused either way is not transient: that throws.
  std::string hello(int fd, const Deadline& deadline, std::unique_ptr<StoreRecords>* records) {
    const uint16_t auth = static_cast<uint16_t>(wire::client_auth(security_));
    const core::Encrypt encrypt = security_.encrypt;
    const bool proves = wire::auth_proves_token(auth);
    const core::auth::Nonce client_nonce =
        proves ? core::auth::random_nonce() : core::auth::Nonce{};
    std::vector<uint8_t> msg;
    wire::append_client_hello(&msg, wire::kVersion, static_cast<wire::Auth>(auth),
                              proves ? client_nonce.data() : nullptr,
                              proves ? client_nonce.size() : 0);
    IoResult r = send_exact(fd, msg.data(), msg.size(), deadline);
    uint8_t reply[wire::kHelloBytes];
    if (r == IoResult::ok) r = recv_exact(fd, reply, sizeof(reply), deadline);
    if (std::string why = io_reason(r, "the hello"); !why.empty()) return why;
    uint32_t magic = wire::load32(reply);
    uint16_t version = wire::load16(reply + 4);
    uint16_t status = wire::load16(reply + 6);
    uint32_t challenge_len = wire::load32(reply + 8);
    if (magic != wire::kMagic)
      throw Error(name_ + ": the service at this address is not a ringreduce store (bad magic)");
    if (status == static_cast<uint16_t>(wire::HelloStatus::bad_version))
      throw Error(name_ + ": the server speaks store protocol version " + std::to_string(version) +
                  ", this client version " + std::to_string(wire::kVersion));
    if (status == static_cast<uint16_t>(wire::HelloStatus::encryption_differs)) {
      uint8_t theirs = 0xff;
      if (challenge_len == 1) r = recv_exact(fd, &theirs, 1, deadline);
      const std::string there = theirs <= static_cast<uint8_t>(core::Encrypt::tls)
                                    ? core::encrypt_name(static_cast<core::Encrypt>(theirs))
                                    : std::string("another mode");
      throw Error(name_ + ": the store's connections have RINGREDUCE_ENCRYPT=" + there +
                  " and this process's " + core::encrypt_name(encrypt) +
                  ": set the same RINGREDUCE_ENCRYPT where the store runs (rank 0, ringrun or "
                  "ringreduce-store) and on every rank");
    }
    if (status == static_cast<uint16_t>(wire::HelloStatus::auth_required))
      throw Error(name_ +
                  ": the store requires a token and this process has none: set RINGREDUCE_TOKEN "
                  "(or Options::token) to the job's token, as on the other ranks");
    if (status == static_cast<uint16_t>(wire::HelloStatus::auth_unsupported) &&
        encrypt != core::Encrypt::off)
      throw Error(name_ +
                  ": the store does not offer RINGREDUCE_ENCRYPT=" + core::encrypt_name(encrypt) +
                  " (a ringreduce from before store encryption?): run the same version there");
    if (status == static_cast<uint16_t>(wire::HelloStatus::auth_unsupported))
      throw Error(name_ +
                  (proves
                       ? ": RINGREDUCE_TOKEN is set in this process, but the store was started "
                         "without one: set the same RINGREDUCE_TOKEN where the store runs (rank "
                         "0, ringrun or ringreduce-store), or unset it here"
                       : ": the server does not offer the authentication this client asked for"));
    const size_t want_challenge =
        encrypt == core::Encrypt::tls ? 1
        : !proves                     ? 0
                  : wire::kChallengeBytes + (encrypt == core::Encrypt::psk ? 1 : 0);
    if (status != static_cast<uint16_t>(wire::HelloStatus::ok) || challenge_len != want_challenge)
      throw Error(name_ +
                  ": the server requires a hello step this client does not support "
                  "(status " +
                  std::to_string(status) + ", challenge of " + std::to_string(challenge_len) +
                  " bytes)");
    if (encrypt == core::Encrypt::tls) return tls_handshake(fd, auth, deadline, records);
    if (!proves) return "";

    uint8_t challenge[wire::kChallengeBytes + 1];
    r = recv_exact(fd, challenge, want_challenge, deadline);
    if (std::string why = io_reason(r, "the authentication"); !why.empty()) return why;
    core::auth::Nonce server_nonce{};
    std::copy(challenge, challenge + server_nonce.size(), server_nonce.begin());
    const auto ctx = wire::auth_context(wire::kVersion, static_cast<wire::Auth>(auth));
    const core::auth::Proof want = core::auth::make_proof(security_.token, wire::kServerProofLabel,
                                                          ctx, client_nonce, server_nonce);
    // The store proves itself first: a client never hands its proof, which a stranger could use
    // to guess a weak token offline, to a server that has not shown it knows the token.
    if (!core::auth::proofs_equal(want, std::span<const uint8_t>(challenge + server_nonce.size(),
                                                                 core::auth::kProofBytes)))
      throw Error(name_ +
                  ": the store does not know this process's RINGREDUCE_TOKEN (its proof of the "
                  "token is wrong): the store belongs to another job, or the tokens differ");
    const core::auth::Proof mine = core::auth::make_proof(security_.token, wire::kClientProofLabel,
                                                          ctx, server_nonce, client_nonce);
    r = send_exact(fd, mine.data(), mine.size(), deadline);
    uint8_t verdict = 0;
    if (r == IoResult::ok) r = recv_exact(fd, &verdict, 1, deadline);
    if (std::string why = io_reason(r, "the authentication"); !why.empty()) return why;
    if (verdict != static_cast<uint8_t>(wire::AuthStatus::ok))
      throw Error(name_ + ": the store rejected this process's proof of RINGREDUCE_TOKEN");
    if (encrypt == core::Encrypt::psk) {
      const auto cipher = chosen_cipher(challenge[wire::kChallengeBytes]);
      *records = std::make_unique<StoreRecords>(core::aead::derive_keys(
          security_.token, wire::kKeyLabel, wire::key_context(wire::kVersion, auth, cipher),
          client_nonce, server_nonce, core::aead::Side::connector, cipher));
    }
    return "";
  }

  // The cipher the server chose, checked: a byte that names none is not a store of ours.
  core::aead::Cipher chosen_cipher(uint8_t c) const {
    if (c != static_cast<uint8_t>(core::aead::Cipher::aes_256_gcm) &&
        c != static_cast<uint8_t>(core::aead::Cipher::chacha20_poly1305))
      throw Error(name_ + ": the server chose cipher " + std::to_string(c) + ", which is none");
    return static_cast<core::aead::Cipher>(c);
  }

  // RINGREDUCE_ENCRYPT=tls, after the hello: the cipher the server chose, then TLS 1.3 with both
  // certificates checked, whose exported secret keys the records.
  std::string tls_handshake(int fd, uint16_t auth, const Deadline& deadline,
                            std::unique_ptr<StoreRecords>* records) {
    uint8_t c = 0;
    if (std::string why = io_reason(recv_exact(fd, &c, 1, deadline), "the hello"); !why.empty())
      return why;
    const core::aead::Cipher cipher = chosen_cipher(c);
    const auto ctx = wire::key_context(wire::kVersion, auth, cipher);
    core::tls::Secret secret;
    try {
      secret = tls_->handshake(fd, core::aead::Side::connector, ctx, deadline);
    } catch (const core::tls::TlsError& e) {
      // The server's thread may be gone or busy (a restart): worth another try. A certificate
      // refused either way is not.
      if (e.reason() == core::tls::TlsError::Reason::closed)
        return std::string("RINGREDUCE_ENCRYPT=tls: ") + e.what();
      throw Error(name_ + ": RINGREDUCE_ENCRYPT=tls: " + e.what());
    } catch (const TimeoutError& e) {
      return std::string("the TLS handshake did not finish in time: ") + e.what();
    }
    *records = std::make_unique<StoreRecords>(core::aead::derive_keys_from_secret(
        secret.bytes, wire::kKeyLabel, ctx, core::aead::Side::connector, cipher));
    return "";
  }

  static std::string io_reason(IoResult r, const char* during) {
    switch (r) {
      case IoResult::ok:
        return "";
      case IoResult::timeout:
        return std::string("no answer from the server in time during ") + during;
      case IoResult::closed:
        return std::string("the server closed the connection during ") + during;
      case IoResult::error:
        return std::string(during) + " failed: " + errno_text();
    }
    return "?";
  }

  const std::string host_;
  const int port_;
  const milliseconds timeout_;
  const core::Security security_;
  const std::string name_;
  std::unique_ptr<const core::tls::Context> tls_;  // RINGREDUCE_ENCRYPT=tls
  std::mutex mu_;
  std::vector<Channel> idle_;
};

}  // namespace

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds timeout,
                                         const std::string& token) {
  return connect_tcp_store(host, port, timeout, core::Security{token, core::Encrypt::off, {}});
}

std::shared_ptr<Store> connect_tcp_store(const std::string& host, int port,
                                         std::chrono::milliseconds timeout,
                                         const core::Security& security) {
  if (port <= 0 || port > 65535)
    throw InvalidArgument("connect_tcp_store: port " + std::to_string(port) +
                          " is not in 1..65535");
  if (host.empty()) throw InvalidArgument("connect_tcp_store: the host name is empty");
  auto store = std::make_shared<TcpStoreClient>(host, port, timeout, security);
  store->connect_first();
  return store;
}

}  // namespace ringreduce::rendezvous
