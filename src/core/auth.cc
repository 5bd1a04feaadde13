#include "core/auth.h"

#include <errno.h>
#include <sys/random.h>

#include <vector>

#include "core/libcrypto.h"
#include "ringreduce/error.h"

namespace ringreduce::core::auth {

// libcrypto is loaded when the first proof is made, not linked: only a job with a token needs
// HMAC-SHA256 (libcrypto.h says what linking it cost every process).
namespace {
constexpr std::string_view kCryptoUser = "authentication: RINGREDUCE_TOKEN";
}  // namespace

Nonce random_nonce() {
  // The kernel's CSPRNG (what OpenSSL seeds from). getrandom blocks only until the pool is
  // initialised at boot, and gives a request of up to 256 bytes whole unless a signal interrupts
  // it: the loop is for that.
  Nonce n{};
  size_t got = 0;
  for (int tries = 0; got < n.size() && tries < 100; ++tries) {
    const ssize_t r = getrandom(n.data() + got, n.size() - got, 0);
    if (r > 0)
      got += static_cast<size_t>(r);
    else if (r < 0 && errno != EINTR)
      break;
  }
  if (got < n.size()) throw Error("authentication: the kernel could not generate a random nonce");
  return n;
}

bool crypto_loaded() {
  return libcrypto_loaded();
}

void require_crypto() {
  require_libcrypto(kCryptoUser);
}

Proof make_proof(std::string_view token, std::string_view label, std::span<const uint8_t> context,
                 const Nonce& peer_nonce, const Nonce& own_nonce) {
  const Libcrypto& lib = require_libcrypto(kCryptoUser);
  std::vector<uint8_t> msg;
  msg.reserve(label.size() + 1 + context.size() + 2 * kNonceBytes);
  msg.insert(msg.end(), label.begin(), label.end());
  msg.push_back(0);  // the label cannot run into the context
  msg.insert(msg.end(), context.begin(), context.end());
  msg.insert(msg.end(), peer_nonce.begin(), peer_nonce.end());
  msg.insert(msg.end(), own_nonce.begin(), own_nonce.end());
  Proof out{};
  unsigned int len = 0;
  if (lib.HMAC(lib.EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(),
               msg.size(), out.data(), &len) == nullptr ||
      len != out.size())
    throw Error("authentication: OpenSSL's HMAC-SHA256 failed");
  return out;
}

bool proofs_equal(const Proof& a, std::span<const uint8_t> b) {
  if (b.size() != a.size()) return false;
  // In constant time (CRYPTO_memcmp's job): every byte is compared whatever the first difference,
  // and the compiler cannot end the loop early through the volatile accumulator.
  volatile uint8_t diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff = diff | static_cast<uint8_t>(a[i] ^ b[i]);
  return diff == 0;
}

bool proofs_equal(const Proof& a, const Proof& b) {
  return proofs_equal(a, std::span<const uint8_t>(b));
}

std::string nonce_to_hex(const Nonce& n) {
  static const char* digits = "0123456789abcdef";
  std::string s;
  for (uint8_t b : n) {
    s += digits[b >> 4];
    s += digits[b & 15];
  }
  return s;
}

bool nonce_from_hex(const std::string& hex, Nonce* out) {
  if (hex.size() != 2 * out->size()) return false;
  auto val = [](char c) -> int {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
  };
  for (size_t i = 0; i < out->size(); ++i) {
    const int hi = val(hex[2 * i]), lo = val(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return false;
    (*out)[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  return true;
}

}  // namespace ringreduce::core::auth
