// The TCP store's wire format, shared by the server, the client and the tests that feed the
// server malformed input. All integers are big-endian.
//
// Connection start (the "hello"):
//   client -> server  magic u32 | version u16 | auth u16 | auth_len u32 | auth_len bytes
//   server -> client  magic u32 | version u16 | status u16 | challenge_len u32 | challenge bytes
// Without a token (RINGREDUCE_TOKEN unset) auth is none with auth_len 0, the server answers with
// challenge_len 0, and connections are not authenticated. With a token, the handshake is a mutual
// HMAC-SHA256 challenge-response (core/auth.h); the token itself never crosses the wire:
//   client hello   auth = hmac_sha256, auth_len 32: the client's nonce
//   server hello   status ok, challenge_len 64: the server's nonce (32) | the server's proof (32)
//                  = make_proof(token, kServerProofLabel, context, client nonce, server nonce)
//   client         checks the server's proof (a store that does not know the token is left at
//                  once, before the client proves anything), then sends its proof (32 bytes)
//                  = make_proof(token, kClientProofLabel, context, server nonce, client nonce)
//   server         one AuthStatus byte: ok, or denied and the connection is closed.
// `context` is the client hello's first 8 bytes (magic, version, auth). The server's fresh nonce
// makes a proof recorded on one connection worthless on the next, and the role labels keep either
// side from reflecting the other's proof. A token on one side only is refused with a status that
// says which side lacks it (auth_required: the client has none; auth_unsupported: the server has
// none). Until the proof is accepted the server buffers no more than one hello and one proof, and
// the whole exchange must finish within a hard deadline from accept, however the bytes trickle in.
//
// Encrypted connections (RINGREDUCE_ENCRYPT, issue 45): the client hello's auth says the mode and
// the cipher its CPU prefers (psk_aes/psk_chacha, tls_aes/tls_chacha); the server answers with the
// cipher both will use (AES-256-GCM only where both prefer it) as the last byte of its challenge:
//   psk   as hmac_sha256 above (the token's proofs, the client's nonce), challenge_len 65: the
//         server's nonce | its proof | the cipher; after the server's AuthStatus ok, every byte
//         both ways is in sealed records (store_records.h) under keys derived from the token and
//         both nonces (core::aead::derive_keys, kKeyLabel, key_context()).
//   tls   auth_len 0; challenge_len 1: the cipher; then a TLS 1.3 handshake with mutual
//         certificates (core/tls_keys.h; the client is TLS's client), whose exported secret keys
//         the records (derive_keys_from_secret); the token plays no part, as on the data links.
// A client whose mode differs from the server's is refused with encryption_differs and, as its
// 1-byte challenge, the server's core::Encrypt, so that it can say which setting differs where.
//
// Then request/response frames, strictly one response per request, in order:
//   request   op u8     | payload_len u32 | payload
//   response  status u8 | payload_len u32 | payload
// Request payloads (key = u32 length + bytes, value = u32 length + bytes):
//   set   key, value                  -> ok: (empty)
//   get   timeout_ms u64, key         -> ok: value           timeout: keys (the key)
//   add   key, delta i64              -> ok: i64              bad_request: message
//   wait  timeout_ms u64, n u32, keys -> ok: (empty)         timeout: keys still missing
//   check n u32, keys                 -> ok: u8 (0 or 1)
//   get_unless timeout_ms u64, key, unless
//                                     -> ok: u8 (0: key, 1: unless), the value of that key
//                                        timeout: keys (both)
// The payload must be consumed exactly: trailing bytes are a protocol error. Every length is
// checked against the limits below and against the bytes that remain before it is used, and a
// peer that breaks any rule is disconnected.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/aead.h"
#include "core/auth.h"
#include "core/security.h"

namespace ringreduce::rendezvous::wire {

constexpr uint32_t kMagic = 0x52524b56;  // "RRKV"
// 2: get_unless.
constexpr uint16_t kVersion = 2;

constexpr size_t kMaxKeyBytes = 4096;
constexpr size_t kMaxValueBytes = size_t{64} << 20;
constexpr size_t kMaxKeys = 4096;
constexpr size_t kMaxAuthBytes = 1024;
constexpr size_t kMaxMessageBytes = 4096;

constexpr size_t kHelloBytes = 12;
constexpr size_t kFrameHeaderBytes = 5;

// The token handshake's pieces.
constexpr size_t kChallengeBytes = core::auth::kNonceBytes + core::auth::kProofBytes;
constexpr size_t kAuthContextBytes = 8;
constexpr const char* kServerProofLabel = "ringreduce store server";
constexpr const char* kClientProofLabel = "ringreduce store client";

enum class Auth : uint16_t {
  none = 0,
  hmac_sha256 = 1,
  psk_aes = 2,  // RINGREDUCE_ENCRYPT=psk; the client's CPU prefers AES-256-GCM
  psk_chacha = 3,
  tls_aes = 4,  // RINGREDUCE_ENCRYPT=tls
  tls_chacha = 5,
};
constexpr uint16_t kMaxAuth = 5;
// The mode a hello's auth asks for, and whether its sender prefers AES.
inline core::Encrypt auth_encrypt(uint16_t auth) {
  return auth >= 4 ? core::Encrypt::tls : auth >= 2 ? core::Encrypt::psk : core::Encrypt::off;
}
inline bool auth_prefers_aes(uint16_t auth) {
  return auth == static_cast<uint16_t>(Auth::psk_aes) ||
         auth == static_cast<uint16_t>(Auth::tls_aes);
}
// What a client with these settings says in its hello.
inline Auth client_auth(const core::Security& s) {
  const bool aes = s.encrypt != core::Encrypt::off && core::prefers_aes();
  switch (s.encrypt) {
    case core::Encrypt::off:
      return s.token.empty() ? Auth::none : Auth::hmac_sha256;
    case core::Encrypt::psk:
      return aes ? Auth::psk_aes : Auth::psk_chacha;
    case core::Encrypt::tls:
      return aes ? Auth::tls_aes : Auth::tls_chacha;
  }
  return Auth::none;
}
// Whether the client's hello carries a nonce and the token's proofs follow.
inline bool auth_proves_token(uint16_t auth) {
  return auth == static_cast<uint16_t>(Auth::hmac_sha256) ||
         auth_encrypt(auth) == core::Encrypt::psk;
}
// The label and context the records' keys are derived with: the client hello's magic, version
// and auth, and the cipher the server chose.
constexpr const char* kKeyLabel = "ringreduce store connection";
constexpr size_t kKeyContextBytes = 9;

enum class HelloStatus : uint16_t {
  ok = 0,
  bad_version = 1,         // the server's hello carries the version it speaks
  auth_unsupported = 2,    // the client asked for an auth method the server does not offer
  auth_required = 3,       // the server has a token and the client sent no proof method
  encryption_differs = 4,  // the client's RINGREDUCE_ENCRYPT is not the server's (its challenge)
};

// The server's answer to the client's proof.
enum class AuthStatus : uint8_t { ok = 0, denied = 1 };

enum class Op : uint8_t { set = 1, get = 2, add = 3, wait = 4, check = 5, get_unless = 6 };
enum class Status : uint8_t { ok = 0, timeout = 1, bad_request = 2 };

inline bool valid_op(uint8_t op) {
  return op >= 1 && op <= 6;
}
inline bool valid_status(uint8_t s) {
  return s <= 2;
}
inline const char* op_name(Op op) {
  switch (op) {
    case Op::set:
      return "set";
    case Op::get:
      return "get";
    case Op::add:
      return "add";
    case Op::wait:
      return "wait";
    case Op::check:
      return "check";
    case Op::get_unless:
      return "get_unless";
  }
  return "?";
}

// The largest payload a well-formed request of this kind can have: the frame length is checked
// against it before a single payload byte is buffered for parsing.
constexpr size_t max_request_payload(Op op) {
  constexpr size_t kKey = 4 + kMaxKeyBytes;
  switch (op) {
    case Op::set:
      return kKey + 4 + kMaxValueBytes;
    case Op::get:
      return 8 + kKey;
    case Op::add:
      return kKey + 8;
    case Op::wait:
      return 8 + 4 + kMaxKeys * kKey;
    case Op::check:
      return 4 + kMaxKeys * kKey;
    case Op::get_unless:
      return 8 + 2 * kKey;
  }
  return 0;
}
// The largest response payload: get_unless's flag and a value (the key lists of a timeout are
// smaller).
constexpr size_t kMaxResponsePayload = 1 + 4 + kMaxValueBytes;
static_assert(4 + kMaxKeys * (4 + kMaxKeyBytes) <= kMaxResponsePayload);
// get_unless's answer for the largest value a set may store.
static_assert(1 + 4 + kMaxValueBytes <= kMaxResponsePayload);

// Malformed input from the peer. Caught where the connection is owned, which then drops it.
class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline uint16_t load16(const uint8_t* p) {
  return static_cast<uint16_t>((p[0] << 8) | p[1]);
}
inline uint32_t load32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}
inline uint64_t load64(const uint8_t* p) {
  return (uint64_t{load32(p)} << 32) | load32(p + 4);
}

// Appends big-endian fields to a buffer.
class Writer {
 public:
  explicit Writer(std::vector<uint8_t>* out) : out_(out) {}
  void u8(uint8_t v) { out_->push_back(v); }
  void u16(uint16_t v) {
    u8(static_cast<uint8_t>(v >> 8));
    u8(static_cast<uint8_t>(v));
  }
  void u32(uint32_t v) {
    u16(static_cast<uint16_t>(v >> 16));
    u16(static_cast<uint16_t>(v));
  }
  void u64(uint64_t v) {
    u32(static_cast<uint32_t>(v >> 32));
    u32(static_cast<uint32_t>(v));
  }
  void raw(const void* data, size_t len) {
    if (len == 0) return;  // data may be null then
    const uint8_t* p = static_cast<const uint8_t*>(data);
    out_->insert(out_->end(), p, p + len);
  }
  // Length-prefixed bytes. Callers have checked len against the wire limits.
  void bytes(const void* data, size_t len) {
    u32(static_cast<uint32_t>(len));
    raw(data, len);
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }

  // Frames: begin() writes the type byte and a placeholder length that end() fills in.
  void begin(uint8_t type) {
    start_ = out_->size();
    u8(type);
    u32(0);
  }
  void end() {
    uint32_t len = static_cast<uint32_t>(out_->size() - start_ - kFrameHeaderBytes);
    for (int i = 0; i < 4; ++i) (*out_)[start_ + 1 + i] = static_cast<uint8_t>(len >> (24 - 8 * i));
  }

 private:
  std::vector<uint8_t>* out_;
  size_t start_ = 0;
};

// Reads fields from a received payload; every read is bounds-checked and every length is checked
// against its limit before it is used.
class Reader {
 public:
  Reader(const uint8_t* data, size_t len) : p_(data), left_(len) {}
  uint8_t u8() { return *take(1); }
  uint32_t u32() { return load32(take(4)); }
  uint64_t u64() { return load64(take(8)); }
  std::string key() {
    uint32_t len = u32();
    if (len > kMaxKeyBytes)
      throw ProtocolError("key length " + std::to_string(len) + " exceeds the limit of " +
                          std::to_string(kMaxKeyBytes));
    const uint8_t* p = take(len);
    return std::string(reinterpret_cast<const char*>(p), len);
  }
  std::vector<uint8_t> value() {
    uint32_t len = u32();
    if (len > kMaxValueBytes)
      throw ProtocolError("value length " + std::to_string(len) + " exceeds the limit of " +
                          std::to_string(kMaxValueBytes));
    const uint8_t* p = take(len);
    return std::vector<uint8_t>(p, p + len);
  }
  std::string message() {
    uint32_t len = u32();
    if (len > kMaxMessageBytes) throw ProtocolError("message length " + std::to_string(len));
    const uint8_t* p = take(len);
    return std::string(reinterpret_cast<const char*>(p), len);
  }
  std::vector<std::string> keys() {
    uint32_t n = u32();
    // Each key takes at least its 4-byte length, so a count the payload cannot hold is rejected
    // before anything is reserved for it.
    if (n > kMaxKeys || size_t{n} * 4 > left_)
      throw ProtocolError("key count " + std::to_string(n) + " exceeds the limit of " +
                          std::to_string(kMaxKeys) + " or the payload");
    std::vector<std::string> out;
    out.reserve(n);
    for (uint32_t i = 0; i < n; ++i) out.push_back(key());
    return out;
  }
  void expect_end() const {
    if (left_ != 0) throw ProtocolError(std::to_string(left_) + " unexpected trailing bytes");
  }

 private:
  const uint8_t* take(size_t n) {
    if (n > left_)
      throw ProtocolError("field of " + std::to_string(n) + " bytes overruns the payload (" +
                          std::to_string(left_) + " left)");
    const uint8_t* p = p_;
    p_ += n;
    left_ -= n;
    return p;
  }
  const uint8_t* p_;
  size_t left_;
};

inline void append_client_hello(std::vector<uint8_t>* out, uint16_t version = kVersion,
                                Auth auth = Auth::none, const uint8_t* auth_data = nullptr,
                                size_t auth_len = 0) {
  Writer w(out);
  w.u32(kMagic);
  w.u16(version);
  w.u16(static_cast<uint16_t>(auth));
  w.bytes(auth_data, auth_len);
}

inline void append_server_hello(std::vector<uint8_t>* out, HelloStatus status,
                                const uint8_t* challenge = nullptr, size_t challenge_len = 0) {
  Writer w(out);
  w.u32(kMagic);
  w.u16(kVersion);
  w.u16(static_cast<uint16_t>(status));
  w.bytes(challenge, challenge_len);
}

// What both proofs bind besides the nonces: the client hello's magic, version and auth method.
inline std::array<uint8_t, kAuthContextBytes> auth_context(uint16_t version, Auth auth) {
  std::vector<uint8_t> v;
  Writer w(&v);
  w.u32(kMagic);
  w.u16(version);
  w.u16(static_cast<uint16_t>(auth));
  std::array<uint8_t, kAuthContextBytes> out{};
  for (size_t i = 0; i < out.size(); ++i) out[i] = v[i];
  return out;
}

inline std::array<uint8_t, kKeyContextBytes> key_context(uint16_t version, uint16_t auth,
                                                         core::aead::Cipher cipher) {
  std::array<uint8_t, kKeyContextBytes> out{};
  const auto head = auth_context(version, static_cast<Auth>(auth));
  std::copy(head.begin(), head.end(), out.begin());
  out[kAuthContextBytes] = static_cast<uint8_t>(cipher);
  return out;
}

}  // namespace ringreduce::rendezvous::wire
