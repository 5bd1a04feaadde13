#include "core/tls_keys.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <utility>

#include "core/fd.h"
#include "core/libcrypto.h"

namespace ringreduce::core::tls {
namespace {

constexpr std::string_view kSslUser = "TLS (RINGREDUCE_ENCRYPT=tls)";

// What the socket BIO saw, for the error messages: OpenSSL's own words for a peer that closed or
// sent garbage ("unexpected eof while reading", "wrong version number") say little to a user.
struct Io {
  int fd = -1;
  bool eof = false;
  int error = 0;  // errno of a failed send or recv
  size_t received = 0;
  std::array<uint8_t, 8> first{};  // the peer's first bytes
};

// A BIO over the socket of our own instead of OpenSSL's socket BIO: it sends with MSG_NOSIGNAL (a
// peer that closed must not kill the process with SIGPIPE; the library never ignores the signal),
// works whether or not the socket is non-blocking (MSG_DONTWAIT), and keeps Io.
int bio_write(BIO* b, const char* buf, int len) {
  const Libcrypto& lib = libcrypto();
  Io* io = static_cast<Io*>(lib.BIO_get_data(b));
  lib.BIO_clear_flags(b, BIO_FLAGS_RWS | BIO_FLAGS_SHOULD_RETRY);
  const ssize_t w = ::send(io->fd, buf, static_cast<size_t>(len), MSG_NOSIGNAL | MSG_DONTWAIT);
  if (w >= 0) return static_cast<int>(w);
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
    lib.BIO_set_flags(b, BIO_FLAGS_WRITE | BIO_FLAGS_SHOULD_RETRY);
  else
    io->error = errno;
  return -1;
}

int bio_read(BIO* b, char* buf, int len) {
  const Libcrypto& lib = libcrypto();
  Io* io = static_cast<Io*>(lib.BIO_get_data(b));
  lib.BIO_clear_flags(b, BIO_FLAGS_RWS | BIO_FLAGS_SHOULD_RETRY);
  // OpenSSL asks for exactly the record it reads (read-ahead is off), so nothing after the peer's
  // close_notify is taken from the socket.
  const ssize_t r = ::recv(io->fd, buf, static_cast<size_t>(len), MSG_DONTWAIT);
  if (r > 0) {
    for (size_t i = 0; io->received + i < io->first.size() && i < static_cast<size_t>(r); ++i)
      io->first[io->received + i] = static_cast<uint8_t>(buf[i]);
    io->received += static_cast<size_t>(r);
    return static_cast<int>(r);
  }
  if (r == 0) {
    io->eof = true;
    return 0;
  }
  if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
    lib.BIO_set_flags(b, BIO_FLAGS_READ | BIO_FLAGS_SHOULD_RETRY);
  else
    io->error = errno;
  return -1;
}

long bio_ctrl(BIO*, int cmd, long, void*) {
  return cmd == BIO_CTRL_FLUSH ? 1 : 0;  // nothing is buffered here
}

BIO_METHOD* socket_method(const Libcrypto& lib) {
  static BIO_METHOD* method = nullptr;  // never freed: handshakes may run until the process exits
  static std::once_flag once;
  std::call_once(once, [&] {
    BIO_METHOD* m =
        lib.BIO_meth_new(lib.BIO_get_new_index() | BIO_TYPE_SOURCE_SINK, "ringreduce socket");
    if (m && lib.BIO_meth_set_write(m, bio_write) == 1 && lib.BIO_meth_set_read(m, bio_read) == 1 &&
        lib.BIO_meth_set_ctrl(m, bio_ctrl) == 1)
      method = m;
  });
  if (!method) throw Error("TLS: OpenSSL could not make a socket BIO: " + openssl_errors(lib));
  return method;
}

// Whether `b` (the peer's first `n` bytes) can begin a TLS record: a content type (change cipher
// spec, alert, handshake, application data) then version 3.x.
bool looks_like_tls(const std::array<uint8_t, 8>& b, size_t n) {
  if (n >= 1 && (b[0] < 20 || b[0] > 23)) return false;
  if (n >= 2 && b[1] != 3) return false;
  if (n >= 3 && b[2] > 4) return false;
  return true;
}

std::string hex_bytes(const std::array<uint8_t, 8>& b, size_t n) {
  std::string s;
  char buf[4];
  for (size_t i = 0; i < std::min(n, b.size()); ++i) {
    std::snprintf(buf, sizeof buf, "%s%02x", i ? " " : "", b[i]);
    s += buf;
  }
  return s;
}

// TLS alerts about this side's certificate (RFC 8446, 6.2): the peer refused us for it.
bool certificate_alert(int alert) {
  switch (alert) {
    case SSL_AD_BAD_CERTIFICATE:
    case SSL_AD_UNSUPPORTED_CERTIFICATE:
    case SSL_AD_CERTIFICATE_REVOKED:
    case SSL_AD_CERTIFICATE_EXPIRED:
    case SSL_AD_CERTIFICATE_UNKNOWN:
    case SSL_AD_UNKNOWN_CA:
    case SSL_AD_ACCESS_DENIED:
    case SSL_AD_CERTIFICATE_REQUIRED:
      return true;
    default:
      return false;
  }
}

struct SslDeleter {
  void operator()(SSL* s) const { libssl().SSL_free(s); }
};

// One handshake's state and its failures put into words.
class Handshake {
 public:
  Handshake(const Libssl& ssl, const Libcrypto& crypto, SSL* s, Io& io, const std::string& ca)
      : ssl_(ssl), crypto_(crypto), s_(s), io_(io), ca_(ca), start_(Clock::now()) {}

  // Runs `step` until `done(its result, SSL_get_error's)`, waiting on the socket as OpenSSL asks.
  template <typename Step, typename Done>
  void drive(Step step, Done done, const Deadline& deadline) {
    for (;;) {
      crypto_.ERR_clear_error();
      const int r = step();
      const int e = ssl_.SSL_get_error(s_, r);
      if (done(r, e)) return;
      // Garbage is refused as soon as it is seen: a server reading what it takes for an SSLv2
      // hello would otherwise wait for as many bytes as the garbage's "length" says.
      if ((e != SSL_ERROR_WANT_READ && e != SSL_ERROR_WANT_WRITE) ||
          (io_.received > 0 && !looks_like_tls(io_.first, io_.received)))
        fail();
      pollfd p{io_.fd, static_cast<short>(e == SSL_ERROR_WANT_READ ? POLLIN : POLLOUT), 0};
      const int n = ::poll(&p, 1, deadline.remaining_ms());
      if (n < 0 && errno != EINTR) {
        io_.error = errno;
        fail();
      }
      if (n == 0 && deadline.expired()) timeout();
    }
  }

  // From here on this side's part of the handshake is done, and the peer's confirmation awaited.
  void closing() { closing_ = true; }

 private:
  [[noreturn]] void timeout() {
    char secs[32];
    std::snprintf(secs, sizeof secs, "%.2f s", seconds_since(start_));
    throw TimeoutError(std::string("TLS handshake timed out after ") + secs + ": " +
                       (io_.received == 0 ? "the peer sent nothing (is it speaking TLS?)"
                        : closing_        ? "the peer did not confirm the handshake"
                                          : "the peer stopped answering"));
  }

  [[noreturn]] void fail() {
    using R = TlsError::Reason;
    const std::string what = "TLS handshake failed: ";
    // The bytes first: garbage then a close is best said as garbage.
    if (io_.received > 0 && !looks_like_tls(io_.first, io_.received))
      throw TlsError(R::not_tls, what + "the peer does not speak TLS (its first bytes: " +
                                     hex_bytes(io_.first, io_.received) + ")");
    // OpenSSL's queue: the first error of libssl's says why it stopped.
    const long verify = ssl_.SSL_get_verify_result(s_);
    int reason = 0;
    std::string words;
    for (unsigned long e = crypto_.ERR_get_error(); e != 0; e = crypto_.ERR_get_error()) {
      if (reason == 0 && ERR_GET_LIB(e) == ERR_LIB_SSL) reason = ERR_GET_REASON(e);
      char buf[256];
      crypto_.ERR_error_string_n(e, buf, sizeof buf);
      words += (words.empty() ? "" : "; ") + std::string(buf);
    }
    if (reason == SSL_R_PEER_DID_NOT_RETURN_A_CERTIFICATE)
      throw TlsError(R::no_certificate, what + "the peer presented no certificate");
    if (verify != X509_V_OK)
      throw TlsError(R::untrusted, what + "the peer's certificate is not trusted: " +
                                       crypto_.X509_verify_cert_error_string(verify) +
                                       " (checked against the CA in " + ca_ + ")");
    if (reason >= SSL_AD_REASON_OFFSET) {
      const int alert = reason - SSL_AD_REASON_OFFSET;
      const std::string desc = ssl_.SSL_alert_desc_string_long(alert);
      if (certificate_alert(alert))
        throw TlsError(R::refused_by_peer,
                       what + "the peer refused this side's certificate (its alert: " + desc + ")");
      throw TlsError(R::refused_by_peer,
                     what + "the peer refused the handshake (its alert: " + desc + ")");
    }
    // A peer that refused us may close before its alert is read (a reset discards it): after our
    // side of the handshake is done, a close is most likely that.
    const std::string hint =
        closing_ ? " before confirming the handshake (did it refuse this side's certificate?)" : "";
    if (io_.error == EPIPE || io_.error == ECONNRESET)
      throw TlsError(R::closed, what + "the peer closed the connection" + hint + " (" +
                                    errno_text(io_.error) + ")");
    if (io_.error != 0)
      throw TlsError(R::closed, what + "the connection failed: " + errno_text(io_.error));
    if (io_.eof)
      throw TlsError(R::closed,
                     what + (io_.received == 0 ? "the peer closed the connection without a word"
                                               : "the peer closed the connection" + hint));
    throw TlsError(R::other, what + (words.empty() ? "OpenSSL gave no reason" : words));
  }

  const Libssl& ssl_;
  const Libcrypto& crypto_;
  SSL* s_;
  Io& io_;
  const std::string& ca_;
  Clock::time_point start_;
  bool closing_ = false;
};

}  // namespace

Secret::~Secret() {
  volatile uint8_t* b = bytes.data();
  for (size_t i = 0; i < bytes.size(); ++i) b[i] = 0;
}

Context::Context(const Files& files) : ca_(files.ca) {
  const Libssl& ssl = require_libssl(kSslUser);
  const Libcrypto& crypto = libcrypto();
  crypto.ERR_clear_error();
  ctx_ = ssl.SSL_CTX_new(ssl.TLS_method());
  if (!ctx_) throw Error("TLS: OpenSSL could not make a context: " + openssl_errors(crypto));
  // A constructor that throws runs no destructor: the guard frees the context then.
  struct Guard {
    Context& c;
    bool armed = true;
    ~Guard() {
      if (armed) {
        libssl().SSL_CTX_free(c.ctx_);
        c.ctx_ = nullptr;
      }
    }
  } guard{*this};

  auto check = [&](const std::string& path, const char* setting, const char* what, auto load) {
    if (path.empty())
      throw TlsError(TlsError::Reason::files,
                     std::string("TLS: no ") + what + " file given (" + setting + ")");
    if (::access(path.c_str(), R_OK) != 0)
      throw TlsError(TlsError::Reason::files, std::string("TLS: the ") + what + " file " + path +
                                                  " (" + setting +
                                                  ") cannot be read: " + errno_text());
    if (load() != 1)
      throw TlsError(TlsError::Reason::files, std::string("TLS: the ") + what + " file " + path +
                                                  " (" + setting + ") is not a usable PEM " + what +
                                                  ": " + openssl_errors(crypto));
  };
  // The key first: loading a certificate quietly drops a key that is not its own, so that the
  // check below can say so in words (the other order fails in OpenSSL's "key values mismatch").
  check(files.key, "RINGREDUCE_TLS_KEY", "private key",
        [&] { return ssl.SSL_CTX_use_PrivateKey_file(ctx_, files.key.c_str(), SSL_FILETYPE_PEM); });
  check(files.cert, "RINGREDUCE_TLS_CERT", "certificate",
        [&] { return ssl.SSL_CTX_use_certificate_chain_file(ctx_, files.cert.c_str()); });
  if (ssl.SSL_CTX_check_private_key(ctx_) != 1)
    throw TlsError(TlsError::Reason::files,
                   "TLS: the private key in " + files.key +
                       " (RINGREDUCE_TLS_KEY) is not the certificate's in " + files.cert +
                       " (RINGREDUCE_TLS_CERT): " + openssl_errors(crypto));
  check(files.ca, "RINGREDUCE_TLS_CA", "CA certificate",
        [&] { return ssl.SSL_CTX_load_verify_locations(ctx_, files.ca.c_str(), nullptr); });

  // TLS 1.3 only: its handshake authenticates both sides in one round trip and its exporter is
  // bound to the whole handshake.
  ssl.SSL_CTX_ctrl(ctx_, SSL_CTRL_SET_MIN_PROTO_VERSION, TLS1_3_VERSION, nullptr);
  // Mutual: each side requires the other's certificate, signed by the CA.
  ssl.SSL_CTX_set_verify(ctx_, SSL_VERIFY_PEER | SSL_VERIFY_FAIL_IF_NO_PEER_CERT, nullptr);
  // No session tickets: a TLS 1.3 server sends them after the handshake, and they would be left
  // on the socket in front of the caller's first frame. No resumption either, which needs them.
  ssl.SSL_CTX_set_num_tickets(ctx_, 0);
  ssl.SSL_CTX_ctrl(ctx_, SSL_CTRL_SET_SESS_CACHE_MODE, SSL_SESS_CACHE_OFF, nullptr);
  guard.armed = false;
}

Context::~Context() {
  if (ctx_) libssl().SSL_CTX_free(ctx_);
}

Context::Context(Context&& o) noexcept
    : ctx_(std::exchange(o.ctx_, nullptr)), ca_(std::move(o.ca_)) {}

Context& Context::operator=(Context&& o) noexcept {
  if (this != &o) {
    if (ctx_) libssl().SSL_CTX_free(ctx_);
    ctx_ = std::exchange(o.ctx_, nullptr);
    ca_ = std::move(o.ca_);
  }
  return *this;
}

Secret Context::handshake(int fd, aead::Side side, std::span<const uint8_t> context,
                          const Deadline& deadline) const {
  const Libssl& ssl = libssl();  // loaded: this Context exists
  const Libcrypto& crypto = libcrypto();
  crypto.ERR_clear_error();
  std::unique_ptr<SSL, SslDeleter> s(ssl.SSL_new(ctx_));
  if (!s) throw Error("TLS: OpenSSL could not start a connection: " + openssl_errors(crypto));
  Io io;
  io.fd = fd;
  BIO* bio = crypto.BIO_new(socket_method(crypto));
  if (!bio) throw Error("TLS: OpenSSL could not make a socket BIO: " + openssl_errors(crypto));
  crypto.BIO_set_data(bio, &io);
  crypto.BIO_set_init(bio, 1);
  ssl.SSL_set_bio(s.get(), bio, bio);  // s owns it now, and frees it before io goes
  if (side == aead::Side::connector)
    ssl.SSL_set_connect_state(s.get());
  else
    ssl.SSL_set_accept_state(s.get());

  Handshake h(ssl, crypto, s.get(), io, ca_);
  h.drive([&] { return ssl.SSL_do_handshake(s.get()); }, [](int r, int) { return r == 1; },
          deadline);
  Secret out;
  if (ssl.SSL_export_keying_material(s.get(), out.bytes.data(), out.bytes.size(), kExporterLabel,
                                     std::strlen(kExporterLabel), context.data(), context.size(),
                                     1) != 1)
    throw Error("TLS: OpenSSL could not export keying material: " + openssl_errors(crypto));
  // Our close_notify sent (SSL_shutdown: 0 once sent, 1 had the peer's come already), the peer's
  // read: the socket is the caller's from the next byte on. A peer that refused our certificate
  // says so here, with an alert instead of its close_notify. (SSL_read, not a second SSL_shutdown,
  // which takes a fatal alert for a close and succeeds.)
  h.closing();
  int shut = 0;
  h.drive([&] { return shut = ssl.SSL_shutdown(s.get()); }, [](int r, int) { return r >= 0; },
          deadline);
  uint8_t byte = 0;
  if (shut == 0)
    h.drive([&] { return ssl.SSL_read(s.get(), &byte, 1); },
            [&](int r, int e) {
              if (r > 0)
                throw TlsError(TlsError::Reason::other,
                               "TLS handshake failed: the peer sent data inside TLS");
              return e == SSL_ERROR_ZERO_RETURN;
            },
            deadline);
  return out;
}

}  // namespace ringreduce::core::tls
