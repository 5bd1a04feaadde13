// The certificate mode of issue 45 (RINGREDUCE_ENCRYPT=tls): a TLS 1.3 handshake with mutual
// certificate verification against a CA, run on a connection only to agree on keys. TLS then
// steps aside: the handshake's exported keying material goes to aead.h, whose Sealer and Opener
// frame the connection's data as in the pre-shared-key mode, and the socket stays open for them.
// (TLS records for the data itself would cost a copy and the links' own framing; this way both
// modes share one data path.)
//
// OpenSSL's libssl is loaded on first use, like libcrypto (libcrypto.h). The socket is driven
// with MSG_DONTWAIT and poll(), so it may be blocking or not, every wait ends at the deadline, and
// a peer that closes never raises SIGPIPE. After the handshake both sides send TLS's close_notify
// and read the peer's, which also tells a client that the server accepted its certificate (in TLS
// 1.3 a client finishes before the server has checked it); not a byte beyond the peer's
// close_notify is read, so the caller's first frame is the next thing on the socket.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

#include "core/aead.h"
#include "core/deadline.h"
#include "ringreduce/error.h"

struct ssl_ctx_st;  // OpenSSL's SSL_CTX

namespace ringreduce::core::tls {

// What the handshake exports: HKDF input for aead::derive_keys_from_secret.
constexpr size_t kSecretBytes = 32;
struct Secret {
  std::array<uint8_t, kSecretBytes> bytes{};
  Secret() = default;
  Secret(const Secret&) = default;
  Secret& operator=(const Secret&) = default;
  ~Secret();  // zeroised
};

// The exporter's label (RFC 8446, 7.5): the keys are for this use alone.
constexpr const char* kExporterLabel = "ringreduce data keys";

// PEM files: this side's private key and certificate (chain: the leaf first), and the CA the
// peer's certificate must be signed by.
struct Files {
  std::string key;   // RINGREDUCE_TLS_KEY
  std::string cert;  // RINGREDUCE_TLS_CERT
  std::string ca;    // RINGREDUCE_TLS_CA
};

// A refused handshake or unusable files. `reason` says which, for callers that act on it; the
// message says it in words ("the peer's certificate is not trusted: certificate has expired").
// A deadline passed is a ringreduce::TimeoutError instead.
class TlsError : public Error {
 public:
  enum class Reason : uint8_t {
    files,            // this side's key, certificate or CA cannot be used
    no_certificate,   // the peer presented none
    untrusted,        // the peer's certificate failed verification against the CA
    refused_by_peer,  // the peer refused this side (its certificate, most often)
    not_tls,          // the peer sent something that is not TLS
    closed,           // the peer closed the connection (or it failed) mid-handshake
    other,            // anything else OpenSSL refused; its words are in the message
  };
  TlsError(Reason reason, const std::string& what)
      : Error(what, ErrorCode::peer), reason_(reason) {}
  Reason reason() const { return reason_; }

 private:
  Reason reason_;
};

// The files loaded and checked once (a wrong path or a key that is not the certificate's is said
// here, at start-up, naming the file), shared by every handshake; handshakes may run concurrently
// from several threads.
class Context {
 public:
  explicit Context(const Files& files);  // throws TlsError(files) or Error (libssl missing)
  ~Context();
  Context(Context&& o) noexcept;
  Context& operator=(Context&& o) noexcept;
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  // Runs TLS 1.3 on the connected socket `fd` as its connector (TLS client) or acceptor (server),
  // both sides presenting and verifying certificates, then exports kSecretBytes under
  // kExporterLabel and `context` (what both sides agreed on: bind the connection's parameters),
  // then closes TLS, leaving `fd` open with nothing of TLS's left on it. Both sides get the same
  // Secret. Throws TlsError naming what was refused, TimeoutError where `deadline` passes first.
  Secret handshake(int fd, aead::Side side, std::span<const uint8_t> context,
                   const Deadline& deadline) const;

 private:
  ssl_ctx_st* ctx_ = nullptr;
  std::string ca_;  // for messages
};

}  // namespace ringreduce::core::tls
