// Cost, measured on the development machine (one core of an AMD EPYC with AES-NI, VAES and
// VPCLMULQDQ but no AVX-512; OpenSSL 3.0.19; tests/unit/aead_test.cc's AeadSpeed, in place, the
// frame in cache, best of 5 runs while another build shared the two cores), GB/s of payload:
//
//   cipher              frame     seal   open    (`openssl speed -evp`, 1 MiB: the same)
//   AES-256-GCM         64 KiB    3.80   3.84
//                       1 MiB     3.82   3.80     3.80
//                       4 MiB     3.82   3.84
//   ChaCha20-Poly1305   64 KiB    2.13   2.13
//                       1 MiB     2.14   2.12     2.07
//                       4 MiB     2.10   2.12
//
// So the wrapper costs nothing beyond OpenSSL's cipher, and the size of a frame does not matter
// from 64 KiB up: ~0.26 ns a byte to seal and as much to open with AES-GCM (0.47 with ChaCha).
// At 1 Gbit/s (0.125 GB/s each way) that is ~3% of a core per direction; on loopback, where
// plaintext moves several GB/s, one core sealing and opening a rank's traffic alone is slower than
// the plaintext link, so issue 45's 0.6 there needs the sealing spread over the striped sockets'
// threads and overlapped with the wire, as the issue plans. (OpenSSL 3.0's fastest GCM, with
// AVX-512 VAES, does not run on this CPU; on one with AVX-512 expect more.)
#include "core/aead.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <utility>

#include "core/libcrypto.h"

#if defined(__aarch64__)
#include <sys/auxv.h>
#endif

namespace ringreduce::core::aead {
namespace {

constexpr std::string_view kCryptoUser = "encryption (RINGREDUCE_ENCRYPT)";

// Zeroes memory that held keys; the volatile writes cannot be dropped as dead stores.
void wipe(void* p, size_t n) {
  volatile uint8_t* b = static_cast<volatile uint8_t*>(p);
  for (size_t i = 0; i < n; ++i) b[i] = 0;
}

const EVP_CIPHER* evp_cipher(const Libcrypto& lib, Cipher c) {
  switch (c) {
    case Cipher::aes_256_gcm:
      return lib.EVP_aes_256_gcm();
    case Cipher::chacha20_poly1305:
      return lib.EVP_chacha20_poly1305 ? lib.EVP_chacha20_poly1305() : nullptr;
  }
  return nullptr;
}

// OpenSSL's lengths are ints: a frame above 2 GiB goes through in pieces (the AEADs are stream
// ciphers, so pieces give the same bytes as one call).
constexpr size_t kPieceBytes = size_t{1} << 30;

// The per-frame nonce: the IV base with the sequence number XORed into its last 8 bytes, big-end
// first (TLS 1.3's record nonce).
std::array<uint8_t, kIvBytes> frame_nonce(const std::array<uint8_t, kIvBytes>& base, uint64_t seq) {
  std::array<uint8_t, kIvBytes> n = base;
  for (size_t i = 0; i < 8; ++i) n[kIvBytes - 1 - i] ^= static_cast<uint8_t>(seq >> (8 * i));
  return n;
}

SessionKeys expand(const Libcrypto& lib, std::span<const uint8_t> ikm,
                   std::span<const uint8_t> salt, std::string_view label,
                   std::span<const uint8_t> context, Side side, Cipher cipher) {
  if (!evp_cipher(lib, cipher))
    throw Error(std::string("encryption: this process's OpenSSL has no ") + cipher_name(cipher));
  // info = label | 0 | cipher | context: the zero ends the label, the cipher byte has a fixed
  // place, so no two different (label, cipher, context) give the same info.
  std::string info(label);
  info.push_back('\0');
  info.push_back(static_cast<char>(cipher));
  info.append(reinterpret_cast<const char*>(context.data()), context.size());

  struct Kdf {
    const Libcrypto& lib;
    EVP_KDF* kdf = nullptr;
    EVP_KDF_CTX* ctx = nullptr;
    ~Kdf() {
      if (ctx) lib.EVP_KDF_CTX_free(ctx);
      if (kdf) lib.EVP_KDF_free(kdf);
    }
  } k{lib};
  k.kdf = lib.EVP_KDF_fetch(nullptr, "HKDF", nullptr);
  if (k.kdf) k.ctx = lib.EVP_KDF_CTX_new(k.kdf);
  if (!k.ctx) throw Error("encryption: OpenSSL has no HKDF: " + openssl_errors(lib));
  char digest[] = "SHA256";
  OSSL_PARAM params[5];
  size_t n = 0;
  params[n++] = lib.OSSL_PARAM_construct_utf8_string("digest", digest, 0);
  params[n++] =
      lib.OSSL_PARAM_construct_octet_string("key", const_cast<uint8_t*>(ikm.data()), ikm.size());
  if (!salt.empty())  // none: HKDF's zero salt (RFC 5869, 2.2)
    params[n++] = lib.OSSL_PARAM_construct_octet_string("salt", const_cast<uint8_t*>(salt.data()),
                                                        salt.size());
  params[n++] = lib.OSSL_PARAM_construct_octet_string("info", info.data(), info.size());
  params[n++] = lib.OSSL_PARAM_construct_end();

  constexpr size_t kDirectionBytes = kKeyBytes + kIvBytes;
  uint8_t out[2 * kDirectionBytes];
  if (lib.EVP_KDF_derive(k.ctx, out, sizeof out, params) <= 0) {
    wipe(out, sizeof out);
    throw Error("encryption: OpenSSL's HKDF-SHA256 failed: " + openssl_errors(lib));
  }
  DirectionKey to_acceptor, to_connector;
  std::memcpy(to_acceptor.key.data(), out, kKeyBytes);
  std::memcpy(to_acceptor.iv.data(), out + kKeyBytes, kIvBytes);
  std::memcpy(to_connector.key.data(), out + kDirectionBytes, kKeyBytes);
  std::memcpy(to_connector.iv.data(), out + kDirectionBytes + kKeyBytes, kIvBytes);
  wipe(out, sizeof out);
  SessionKeys keys;
  keys.cipher = cipher;
  keys.send = side == Side::connector ? to_acceptor : to_connector;
  keys.recv = side == Side::connector ? to_connector : to_acceptor;
  return keys;
}

}  // namespace

// An EVP_CIPHER_CTX keyed once for one direction: a frame then only sets its nonce, which costs
// neither an allocation nor a key schedule.
class CipherContext {
 public:
  CipherContext(Cipher cipher, const DirectionKey& key, bool encrypt)
      : lib_(require_libcrypto(kCryptoUser)), encrypt_(encrypt) {
    const EVP_CIPHER* c = evp_cipher(lib_, cipher);
    if (!c)
      throw Error(std::string("encryption: this process's OpenSSL has no ") + cipher_name(cipher));
    ctx_ = lib_.EVP_CIPHER_CTX_new();
    if (!ctx_) throw Error("encryption: OpenSSL could not allocate a cipher context");
    // Both ciphers' default IV length is 12 bytes, the nonce we give each frame.
    const int ok = encrypt ? lib_.EVP_EncryptInit_ex(ctx_, c, nullptr, key.key.data(), nullptr)
                           : lib_.EVP_DecryptInit_ex(ctx_, c, nullptr, key.key.data(), nullptr);
    if (ok != 1) {
      lib_.EVP_CIPHER_CTX_free(ctx_);  // the destructor does not run for a throwing constructor
      throw Error(std::string("encryption: OpenSSL could not set up ") + cipher_name(cipher) +
                  ": " + openssl_errors(lib_));
    }
  }
  // OpenSSL cleanses the key schedule as it frees the context.
  ~CipherContext() { lib_.EVP_CIPHER_CTX_free(ctx_); }
  CipherContext(const CipherContext&) = delete;
  CipherContext& operator=(const CipherContext&) = delete;

  // Starts a frame under `nonce`, feeding `aad`; false where OpenSSL fails.
  bool begin(const std::array<uint8_t, kIvBytes>& nonce, std::span<const uint8_t> aad) {
    if ((encrypt_ ? lib_.EVP_EncryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce.data())
                  : lib_.EVP_DecryptInit_ex(ctx_, nullptr, nullptr, nullptr, nonce.data())) != 1)
      return false;
    for (size_t off = 0; off < aad.size();) {
      const int len = static_cast<int>(std::min(kPieceBytes, aad.size() - off));
      int out = 0;
      if ((encrypt_ ? lib_.EVP_EncryptUpdate(ctx_, nullptr, &out, aad.data() + off, len)
                    : lib_.EVP_DecryptUpdate(ctx_, nullptr, &out, aad.data() + off, len)) != 1)
        return false;
      off += static_cast<size_t>(len);
    }
    return true;
  }

  // Encrypts or decrypts `data` in place (both AEADs are stream ciphers: the output is exactly the
  // input's length, written over it).
  bool crypt(std::span<uint8_t> data) { return crypt(data, data.data()); }
  // Out of place (to may equal from's start): what reads the caller's buffer and writes the
  // record, or reads the record and writes the caller's, in one pass.
  bool crypt(std::span<const uint8_t> from, uint8_t* to) {
    for (size_t off = 0; off < from.size();) {
      const int len = static_cast<int>(std::min(kPieceBytes, from.size() - off));
      int out = 0;
      const uint8_t* p = from.data() + off;
      uint8_t* q = to + off;
      if ((encrypt_ ? lib_.EVP_EncryptUpdate(ctx_, q, &out, p, len)
                    : lib_.EVP_DecryptUpdate(ctx_, q, &out, p, len)) != 1 ||
          out != len)
        return false;
      off += static_cast<size_t>(len);
    }
    return true;
  }

  bool finish_seal(std::span<uint8_t, kTagBytes> tag) {
    uint8_t none[16];
    int out = 0;
    return lib_.EVP_EncryptFinal_ex(ctx_, none, &out) == 1 && out == 0 &&
           lib_.EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_GET_TAG, kTagBytes, tag.data()) == 1;
  }

  // False where the tag does not match (or OpenSSL failed: either way nothing to deliver).
  bool finish_open(std::span<const uint8_t, kTagBytes> tag) {
    Tag copy;  // the ctrl takes a non-const pointer
    std::memcpy(copy.data(), tag.data(), kTagBytes);
    uint8_t none[16];
    int out = 0;
    const bool ok =
        lib_.EVP_CIPHER_CTX_ctrl(ctx_, EVP_CTRL_AEAD_SET_TAG, kTagBytes, copy.data()) == 1 &&
        lib_.EVP_DecryptFinal_ex(ctx_, none, &out) > 0;
    if (!ok) lib_.ERR_clear_error();  // a mismatch is the caller's error to report, not OpenSSL's
    return ok;
  }

  const Libcrypto& lib() const { return lib_; }

 private:
  const Libcrypto& lib_;
  EVP_CIPHER_CTX* ctx_ = nullptr;
  bool encrypt_;
};

const char* cipher_name(Cipher c) {
  switch (c) {
    case Cipher::aes_256_gcm:
      return "AES-256-GCM";
    case Cipher::chacha20_poly1305:
      return "ChaCha20-Poly1305";
  }
  return "an unknown cipher";
}

Cipher preferred_cipher() {
  static const Cipher c = [] {
#if defined(__x86_64__) || defined(__i386__)
    // GCM's speed needs both: AES rounds in hardware and the carry-less multiply of its GHASH.
    if (__builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul"))
      return Cipher::aes_256_gcm;
#elif defined(__aarch64__)
    const unsigned long hw = getauxval(AT_HWCAP);
    if ((hw & HWCAP_AES) && (hw & HWCAP_PMULL)) return Cipher::aes_256_gcm;
#endif
    return Cipher::chacha20_poly1305;
  }();
  return c;
}

bool cipher_available(Cipher c) {
  const Libcrypto& lib = libcrypto();
  return lib.error.empty() && evp_cipher(lib, c) != nullptr;
}

DirectionKey::~DirectionKey() {
  wipe(key.data(), key.size());
  wipe(iv.data(), iv.size());
}

SessionKeys derive_keys(std::string_view token, std::string_view label,
                        std::span<const uint8_t> context, const auth::Nonce& connector_nonce,
                        const auth::Nonce& acceptor_nonce, Side side, Cipher cipher) {
  if (token.empty())
    throw InvalidArgument("encryption: the pre-shared-key mode needs RINGREDUCE_TOKEN set");
  const Libcrypto& lib = require_libcrypto(kCryptoUser);
  uint8_t salt[2 * auth::kNonceBytes];
  std::memcpy(salt, connector_nonce.data(), auth::kNonceBytes);
  std::memcpy(salt + auth::kNonceBytes, acceptor_nonce.data(), auth::kNonceBytes);
  return expand(lib, std::span(reinterpret_cast<const uint8_t*>(token.data()), token.size()), salt,
                label, context, side, cipher);
}

SessionKeys derive_keys_from_secret(std::span<const uint8_t> secret, std::string_view label,
                                    std::span<const uint8_t> context, Side side, Cipher cipher) {
  if (secret.empty()) throw InvalidArgument("encryption: no keying material to derive keys from");
  return expand(require_libcrypto(kCryptoUser), secret, {}, label, context, side, cipher);
}

Sealer::Sealer(const SessionKeys& keys)
    : ctx_(std::make_unique<CipherContext>(keys.cipher, keys.send, true)),
      iv_base_(keys.send.iv),
      cipher_(keys.cipher) {}
Sealer::~Sealer() = default;
Sealer::Sealer(Sealer&&) noexcept = default;
Sealer& Sealer::operator=(Sealer&&) noexcept = default;

uint64_t Sealer::seal(std::span<const uint8_t> aad, std::span<uint8_t> payload,
                      std::span<uint8_t, kTagBytes> tag) {
  if (payload.size() > kMaxPayloadBytes)
    throw InvalidArgument("encryption: a frame of " + std::to_string(payload.size()) +
                          " bytes is above the ciphers' limit of " +
                          std::to_string(kMaxPayloadBytes));
  // The last number is never used, so that no count can wrap to a nonce used before (2^64 frames
  // are centuries away at any line rate).
  if (next_ == std::numeric_limits<uint64_t>::max())
    throw Error("encryption: this connection has sealed all the frames its keys allow");
  const uint64_t seq = next_;
  if (!ctx_->begin(frame_nonce(iv_base_, seq), aad) || !ctx_->crypt(payload) ||
      !ctx_->finish_seal(tag))
    throw Error(std::string("encryption: OpenSSL's ") + cipher_name(cipher_) +
                " failed to seal frame " + std::to_string(seq) + ": " +
                openssl_errors(ctx_->lib()));
  ++next_;
  return seq;
}

uint64_t Sealer::begin(std::span<const uint8_t> aad) {
  if (next_ == std::numeric_limits<uint64_t>::max())
    throw Error("encryption: this connection has sealed all the frames its keys allow");
  if (!ctx_->begin(frame_nonce(iv_base_, next_), aad))
    throw Error(std::string("encryption: OpenSSL's ") + cipher_name(cipher_) +
                " failed to begin frame " + std::to_string(next_) + ": " +
                openssl_errors(ctx_->lib()));
  piece_bytes_ = 0;
  return next_;
}

void Sealer::add(std::span<const uint8_t> in, uint8_t* out) {
  piece_bytes_ += in.size();
  if (piece_bytes_ > kMaxPayloadBytes || !ctx_->crypt(in, out))
    throw Error(std::string("encryption: OpenSSL's ") + cipher_name(cipher_) +
                " failed to seal frame " + std::to_string(next_) + ": " +
                openssl_errors(ctx_->lib()));
}

void Sealer::end(std::span<uint8_t, kTagBytes> tag) {
  if (!ctx_->finish_seal(tag))
    throw Error(std::string("encryption: OpenSSL's ") + cipher_name(cipher_) +
                " failed to seal frame " + std::to_string(next_) + ": " +
                openssl_errors(ctx_->lib()));
  ++next_;
}

Opener::Opener(const SessionKeys& keys)
    : ctx_(std::make_unique<CipherContext>(keys.cipher, keys.recv, false)),
      iv_base_(keys.recv.iv),
      cipher_(keys.cipher) {}
Opener::~Opener() = default;
Opener::Opener(Opener&&) noexcept = default;
Opener& Opener::operator=(Opener&&) noexcept = default;

void Opener::open(uint64_t seq, std::span<const uint8_t> aad, std::span<uint8_t> payload,
                  std::span<const uint8_t, kTagBytes> tag) {
  open(seq, aad, payload, payload.data(), tag);
}

void Opener::open(uint64_t seq, std::span<const uint8_t> aad, std::span<const uint8_t> payload,
                  uint8_t* out, std::span<const uint8_t, kTagBytes> tag) {
  // The number first: it says what happened to the stream in words a tag failure cannot, and a
  // frame out of place is refused before any work on it.
  if (seq < next_)
    throw FrameError(FrameError::Kind::replayed, next_, seq,
                     "replayed: frame " + std::to_string(seq) + " arrived again, frame " +
                         std::to_string(next_) + " expected");
  if (seq > next_)
    throw FrameError(FrameError::Kind::dropped_or_reordered, next_, seq,
                     "dropped or reordered: frame " + std::to_string(next_) + " expected, " +
                         std::to_string(seq) + " arrived");
  const bool ok = payload.size() <= kMaxPayloadBytes &&
                  ctx_->begin(frame_nonce(iv_base_, seq), aad) && ctx_->crypt(payload, out) &&
                  ctx_->finish_open(tag);
  if (!ok) {
    // Decryption ran before the tag could be checked: what it left is not data.
    if (!payload.empty()) std::memset(out, 0, payload.size());
    throw FrameError(FrameError::Kind::altered, next_, seq,
                     "altered: frame " + std::to_string(seq) + " failed its " +
                         cipher_name(cipher_) +
                         " integrity check (changed on the way, or sealed with another key)");
  }
  ++next_;
}

}  // namespace ringreduce::core::aead
