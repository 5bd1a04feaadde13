#include "core/auth.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <vector>

#include "ringreduce/error.h"

namespace ringreduce::core::auth {

Nonce random_nonce() {
  Nonce n{};
  if (RAND_bytes(n.data(), static_cast<int>(n.size())) != 1)
    throw Error("authentication: OpenSSL could not generate a random nonce");
  return n;
}

Proof make_proof(std::string_view token, std::string_view label, std::span<const uint8_t> context,
                 const Nonce& peer_nonce, const Nonce& own_nonce) {
  std::vector<uint8_t> msg;
  msg.reserve(label.size() + 1 + context.size() + 2 * kNonceBytes);
  msg.insert(msg.end(), label.begin(), label.end());
  msg.push_back(0);  // the label cannot run into the context
  msg.insert(msg.end(), context.begin(), context.end());
  msg.insert(msg.end(), peer_nonce.begin(), peer_nonce.end());
  msg.insert(msg.end(), own_nonce.begin(), own_nonce.end());
  Proof out{};
  unsigned int len = 0;
  if (HMAC(EVP_sha256(), token.data(), static_cast<int>(token.size()), msg.data(), msg.size(),
           out.data(), &len) == nullptr ||
      len != out.size())
    throw Error("authentication: OpenSSL's HMAC-SHA256 failed");
  return out;
}

bool proofs_equal(const Proof& a, std::span<const uint8_t> b) {
  return b.size() == a.size() && CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
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
