// Authenticated encryption of a connection's frames (issue 45: RINGREDUCE_ENCRYPT): AES-256-GCM
// or ChaCha20-Poly1305 through OpenSSL's libcrypto (libcrypto.h: loaded on first use), with keys
// derived per connection by HKDF-SHA256, and frames numbered so that one replayed, dropped,
// reordered or altered on the way is an error that says which, never data.
//
// Keys: each direction of a connection has its own key and 12-byte IV base, both derived from one
// secret (the token and both sides' nonces in the pre-shared-key mode; TLS 1.3's exported keying
// material in the certificate mode), so that the two sides never seal under the same key and
// nonce. A frame's nonce is its direction's IV base XOR its 64-bit sequence number (TLS 1.3's
// construction): numbers are never reused within a connection, and the key is the connection's.
//
// Frames: the Sealer numbers them itself (0, 1, 2, ...) and returns the number it used, which the
// caller puts in the frame's header; the Opener checks that number against the next one it
// expects before it looks at anything else, then the tag over the header (`aad`) and payload.
// The payload is encrypted and decrypted in place: no copy beyond the one the link already makes.
//
// Not thread-safe: one Sealer and one Opener per direction of a socket, used by one thread at a
// time (each owns a reusable OpenSSL cipher context, so a frame costs no allocation).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/auth.h"
#include "ringreduce/error.h"

namespace ringreduce::core::aead {

constexpr size_t kKeyBytes = 32;  // both ciphers take 256-bit keys
constexpr size_t kIvBytes = 12;   // both ciphers' standard nonce
constexpr size_t kTagBytes = 16;
using Tag = std::array<uint8_t, kTagBytes>;

// The largest payload one frame may carry: GCM's limit per nonce (2^36 - 32 bytes; ChaCha20's
// 32-bit block counter allows 2^38 - 64).
constexpr size_t kMaxPayloadBytes = (size_t{1} << 36) - 32;

enum class Cipher : uint8_t {
  aes_256_gcm = 1,
  chacha20_poly1305 = 2,
};
const char* cipher_name(Cipher c);  // "AES-256-GCM", "ChaCha20-Poly1305"

// What this CPU runs fastest: AES-256-GCM where it has AES and carry-less multiply instructions
// (x86's AES-NI and PCLMULQDQ, Arm's AES and PMULL), ChaCha20-Poly1305 elsewhere, where software
// AES is several times slower and leaks timing. Both sides of a connection must use the same
// cipher: the caller agrees on one (AES-GCM only where both prefer it, say) and passes it below.
Cipher preferred_cipher();
// Whether this process's libcrypto offers `c` (a no-chacha build has no ChaCha20-Poly1305). Loads
// libcrypto; false where it cannot be loaded.
bool cipher_available(Cipher c);

// Which end of the connection this side is: the one that connected (TCP client, TLS client) or
// the one that accepted. It picks which derived key seals and which opens.
enum class Side : uint8_t { connector, acceptor };

// One direction's key and IV base; zeroised when destroyed.
struct DirectionKey {
  std::array<uint8_t, kKeyBytes> key{};
  std::array<uint8_t, kIvBytes> iv{};
  DirectionKey() = default;
  DirectionKey(const DirectionKey&) = default;
  DirectionKey& operator=(const DirectionKey&) = default;
  ~DirectionKey();
};

// A connection's keys as one side sees them.
struct SessionKeys {
  Cipher cipher = Cipher::aes_256_gcm;
  DirectionKey send;  // what this side seals with (the peer opens with it)
  DirectionKey recv;  // what the peer seals with
};

// Pre-shared-key mode: HKDF-SHA256 with the token as input keying material, the connector's then
// the acceptor's nonce as salt, and `label`, a zero byte, `context` and the cipher as info; the
// first 44 bytes out are the connector-to-acceptor key and IV base, the next 44 the other
// direction's. `label` separates uses (data links, store), `context` binds what both sides agreed
// on (their hello's fields); the cipher is bound so that one key never serves two ciphers. Both
// sides call this with the same arguments but `side`. Throws InvalidArgument on an empty token and
// Error where libcrypto cannot be loaded or fails.
SessionKeys derive_keys(std::string_view token, std::string_view label,
                        std::span<const uint8_t> context, const auth::Nonce& connector_nonce,
                        const auth::Nonce& acceptor_nonce, Side side,
                        Cipher cipher = preferred_cipher());

// Certificate mode: the same expansion from raw keying material (TLS 1.3's exporter's output,
// tls_keys.h), without a salt (the material is already uniformly random and connection-unique).
SessionKeys derive_keys_from_secret(std::span<const uint8_t> secret, std::string_view label,
                                    std::span<const uint8_t> context, Side side,
                                    Cipher cipher = preferred_cipher());

// A frame that must not be delivered: what happened to it is `kind`, and the message says it with
// the frame numbers (the caller prefixes the peer and the op).
class FrameError : public Error {
 public:
  enum class Kind : uint8_t { replayed, dropped_or_reordered, altered };
  FrameError(Kind kind, uint64_t expected, uint64_t arrived, const std::string& what)
      : Error(what, ErrorCode::peer), kind_(kind), expected_(expected), arrived_(arrived) {}
  Kind kind() const { return kind_; }
  uint64_t expected() const { return expected_; }
  uint64_t arrived() const { return arrived_; }

 private:
  Kind kind_;
  uint64_t expected_;
  uint64_t arrived_;
};

class CipherContext;  // aead.cc: an OpenSSL EVP_CIPHER_CTX, keyed once

// Seals one direction's frames, numbering them 0, 1, 2, ...
class Sealer {
 public:
  explicit Sealer(const SessionKeys& keys);  // seals with keys.send
  ~Sealer();
  Sealer(Sealer&&) noexcept;
  Sealer& operator=(Sealer&&) noexcept;
  Sealer(const Sealer&) = delete;
  Sealer& operator=(const Sealer&) = delete;

  // Encrypts `payload` in place and writes the tag over `aad` and the ciphertext into `tag`;
  // returns the frame's sequence number, which the frame's header must carry for the Opener (it
  // may be part of `aad`). Throws InvalidArgument beyond kMaxPayloadBytes, Error where OpenSSL
  // fails (the payload is then unusable).
  uint64_t seal(std::span<const uint8_t> aad, std::span<uint8_t> payload,
                std::span<uint8_t, kTagBytes> tag);
  // The same piece by piece and out of place, for a frame gathered from several buffers (a
  // record of the caller's iovecs, read where they are and written sealed into the record):
  // begin() returns the frame's number, add() encrypts `in` into `out` (any number of times, in
  // order), end() writes the tag and moves on to the next number.
  uint64_t begin(std::span<const uint8_t> aad);
  void add(std::span<const uint8_t> in, uint8_t* out);
  void end(std::span<uint8_t, kTagBytes> tag);
  uint64_t next_sequence() const { return next_; }
  Cipher cipher() const { return cipher_; }

 private:
  std::unique_ptr<CipherContext> ctx_;  // holds the key (OpenSSL's schedule of it)
  std::array<uint8_t, kIvBytes> iv_base_{};
  Cipher cipher_;
  uint64_t next_ = 0;
  size_t piece_bytes_ = 0;  // of the frame begun
};

// Opens the frames the peer's Sealer sealed, in order.
class Opener {
 public:
  explicit Opener(const SessionKeys& keys);  // opens with keys.recv
  ~Opener();
  Opener(Opener&&) noexcept;
  Opener& operator=(Opener&&) noexcept;
  Opener(const Opener&) = delete;
  Opener& operator=(const Opener&) = delete;

  // Checks `seq` (from the frame's header) against the next frame expected, first: an earlier one
  // is "replayed", a later one "dropped or reordered"; then decrypts `payload` in place and checks
  // `tag` over `aad` and the ciphertext: a mismatch is "altered" (a changed header, payload or
  // tag, a frame sealed with another key or for another position). On any FrameError the payload
  // holds no data (an altered one is zeroed), and the expected number stays where it was; on
  // success it moves to seq + 1.
  void open(uint64_t seq, std::span<const uint8_t> aad, std::span<uint8_t> payload,
            std::span<const uint8_t, kTagBytes> tag);
  // Out of place: decrypts `payload` into `out` (as many bytes; zeroed on any failure), so that
  // a record goes from the socket's buffer to where its bytes are used in one pass.
  void open(uint64_t seq, std::span<const uint8_t> aad, std::span<const uint8_t> payload,
            uint8_t* out, std::span<const uint8_t, kTagBytes> tag);
  uint64_t expected_sequence() const { return next_; }
  Cipher cipher() const { return cipher_; }

 private:
  std::unique_ptr<CipherContext> ctx_;  // holds the key (OpenSSL's schedule of it)
  std::array<uint8_t, kIvBytes> iv_base_{};
  Cipher cipher_;
  uint64_t next_ = 0;
};

}  // namespace ringreduce::core::aead
