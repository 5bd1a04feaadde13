#include "core/auth.h"

#include <dlfcn.h>
#include <errno.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/opensslv.h>
#include <sys/random.h>

#include <mutex>
#include <vector>

#include "ringreduce/error.h"

namespace ringreduce::core::auth {
namespace {

// libcrypto is loaded when the first proof is made, not linked: only a job with a token needs
// HMAC-SHA256, and loading OpenSSL 3's libcrypto (21,000 relocations and its constructors) cost
// every process ~4 ms of its start (a program that only exits: 2.1 ms alone, 6.2 ms linked with
// it), one second of CPU at 256 ranks. The headers still give the functions' types; the soname
// is the major version the build compiled against (systemd loads its optional libraries so).
#ifndef OPENSSL_VERSION_MAJOR
#error "OpenSSL 3 or later is needed (its libcrypto's soname is named from OPENSSL_VERSION_MAJOR)"
#endif
#define RR_STR2(x) #x
#define RR_STR(x) RR_STR2(x)
constexpr const char* kLibcrypto = "libcrypto.so." RR_STR(OPENSSL_VERSION_MAJOR);

struct Libcrypto {
  decltype(&::HMAC) hmac = nullptr;
  decltype(&::EVP_sha256) sha256 = nullptr;
  std::string error;  // why it could not be loaded
};

const Libcrypto& libcrypto() {
  static Libcrypto lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // Never closed: the process may make proofs until it exits.
    void* h = dlopen(kLibcrypto, RTLD_NOW | RTLD_LOCAL);
    if (h) {
      lib.hmac = reinterpret_cast<decltype(&::HMAC)>(dlsym(h, "HMAC"));
      lib.sha256 = reinterpret_cast<decltype(&::EVP_sha256)>(dlsym(h, "EVP_sha256"));
    }
    if (!lib.hmac || !lib.sha256) {
      const char* why = dlerror();
      lib.error = why ? why : "HMAC or EVP_sha256 missing";
      lib.hmac = nullptr;
    }
  });
  return lib;
}

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
  void* h = dlopen(kLibcrypto, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // RTLD_NOLOAD took a reference
  return h != nullptr;
}

// The loaded library, or an Error naming it.
static const Libcrypto& loaded_libcrypto() {
  const Libcrypto& lib = libcrypto();
  if (!lib.hmac)
    throw Error(std::string("authentication: RINGREDUCE_TOKEN needs OpenSSL's ") + kLibcrypto +
                " (Debian: libssl3), which could not be loaded: " + lib.error);
  return lib;
}

void require_crypto() {
  loaded_libcrypto();
}

Proof make_proof(std::string_view token, std::string_view label, std::span<const uint8_t> context,
                 const Nonce& peer_nonce, const Nonce& own_nonce) {
  const Libcrypto& lib = loaded_libcrypto();
  std::vector<uint8_t> msg;
  msg.reserve(label.size() + 1 + context.size() + 2 * kNonceBytes);
  msg.insert(msg.end(), label.begin(), label.end());
  msg.push_back(0);  // the label cannot run into the context
  msg.insert(msg.end(), context.begin(), context.end());
  msg.insert(msg.end(), peer_nonce.begin(), peer_nonce.end());
  msg.insert(msg.end(), own_nonce.begin(), own_nonce.end());
  Proof out{};
  unsigned int len = 0;
  if (lib.hmac(lib.sha256(), token.data(), static_cast<int>(token.size()), msg.data(), msg.size(),
               out.data(), &len) == nullptr ||
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
