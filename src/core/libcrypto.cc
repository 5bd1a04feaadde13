#include "core/libcrypto.h"

#include <dlfcn.h>

#include <mutex>

#include "ringreduce/error.h"

namespace ringreduce::core {
namespace {

// RTLD_LOCAL: OpenSSL's symbols stay out of the global namespace, so that a program that links
// another OpenSSL of its own does not bind to ours or we to its.
void* open_library(const char* soname, std::string* error) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* why = dlerror();
    *error = why ? why : std::string(soname) + " not found";
  }
  return h;
}

// The function, or null with dlsym's words kept for the first one not found.
void* resolve(void* h, const char* name, std::string* first_missing) {
  void* f = dlsym(h, name);
  if (!f && first_missing->empty()) {
    const char* why = dlerror();
    *first_missing = why ? why : std::string(name) + " missing";
  }
  return f;
}

#define RR_RESOLVE(f) lib.f = reinterpret_cast<decltype(lib.f)>(resolve(h, #f, &missing));

}  // namespace

const Libcrypto& libcrypto() {
  static Libcrypto lib;
  static std::once_flag once;
  std::call_once(once, [] {
    void* h = open_library(kLibcryptoSoname, &lib.error);
    if (!h) return;
    std::string missing;
    RR_LIBCRYPTO_FUNCTIONS(RR_RESOLVE)
    if (!missing.empty()) {
      // A half-filled table would fail later, far from the cause.
      lib = Libcrypto{};
      lib.error = missing;
      return;
    }
    RR_LIBCRYPTO_OPTIONAL_FUNCTIONS(RR_RESOLVE)
  });
  return lib;
}

const Libssl& libssl() {
  static Libssl lib;
  static std::once_flag once;
  std::call_once(once, [] {
    // libssl hands out libcrypto's objects (errors, BIOs, X509 results), which its users then
    // handle through the libcrypto table: one without the other is of no use.
    const Libcrypto& crypto = libcrypto();
    if (!crypto.error.empty()) {
      lib.error = std::string(kLibcryptoSoname) + ": " + crypto.error;
      return;
    }
    void* h = open_library(kLibsslSoname, &lib.error);
    if (!h) return;
    std::string missing;
    RR_LIBSSL_FUNCTIONS(RR_RESOLVE)
    if (!missing.empty()) {
      lib = Libssl{};
      lib.error = missing;
    }
  });
  return lib;
}

#undef RR_RESOLVE

const Libcrypto& require_libcrypto(std::string_view user) {
  const Libcrypto& lib = libcrypto();
  if (!lib.error.empty())
    throw Error(std::string(user) + " needs OpenSSL's " + kLibcryptoSoname +
                " (Debian: libssl3), which could not be loaded: " + lib.error);
  return lib;
}

const Libssl& require_libssl(std::string_view user) {
  const Libssl& lib = libssl();
  if (!lib.error.empty())
    throw Error(std::string(user) + " needs OpenSSL's " + kLibsslSoname +
                " (Debian: libssl3), which could not be loaded: " + lib.error);
  return lib;
}

bool libcrypto_loaded() {
  void* h = dlopen(kLibcryptoSoname, RTLD_NOW | RTLD_NOLOAD);
  if (h) dlclose(h);  // RTLD_NOLOAD took a reference
  return h != nullptr;
}

std::string openssl_errors(const Libcrypto& lib) {
  std::string out;
  if (!lib.ERR_get_error) return out;
  for (unsigned long e = lib.ERR_get_error(); e != 0; e = lib.ERR_get_error()) {
    char buf[256];
    lib.ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out;
}

}  // namespace ringreduce::core
