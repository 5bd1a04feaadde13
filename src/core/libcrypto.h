// OpenSSL, loaded with dlopen on first use and never linked: the token's proofs (auth.h), the
// per-frame AEAD and its key derivation (aead.h) and the TLS 1.3 handshake (tls_keys.h) call it
// through the tables of function pointers here, one per library, so that every user shares one
// load and one list of what is needed.
//
// Why not linked: only jobs with a token or encryption need OpenSSL, and loading OpenSSL 3's
// libcrypto (21,000 relocations and its constructors) cost every process ~4 ms of its start (a
// program that only exits: 2.1 ms alone, 6.2 ms linked with it), one second of CPU at 256 ranks.
// The headers still give the functions' types; the sonames are the major version the build
// compiled against (systemd loads its optional libraries so).
#pragma once

#include <openssl/bio.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/opensslv.h>
#include <openssl/params.h>
#include <openssl/ssl.h>
#include <openssl/x509.h>

#include <string>
#include <string_view>

namespace ringreduce::core {

#ifndef OPENSSL_VERSION_MAJOR
#error "OpenSSL 3 or later is needed (its libraries' sonames are named from OPENSSL_VERSION_MAJOR)"
#endif
#define RR_OPENSSL_STR2(x) #x
#define RR_OPENSSL_STR(x) RR_OPENSSL_STR2(x)
inline constexpr const char* kLibcryptoSoname =
    "libcrypto.so." RR_OPENSSL_STR(OPENSSL_VERSION_MAJOR);
inline constexpr const char* kLibsslSoname = "libssl.so." RR_OPENSSL_STR(OPENSSL_VERSION_MAJOR);

// Every libcrypto function the project calls. A member has the function's own name and type, so
// that a call reads as OpenSSL's documentation does (lib.EVP_EncryptUpdate(...)). None of these
// may be a macro in the headers (a macro such as BIO_set_retry_read expands to a direct call,
// which would not link): spell such macros out through the functions they wrap.
#define RR_LIBCRYPTO_FUNCTIONS(X)      \
  X(HMAC)                              \
  X(EVP_sha256)                        \
  X(EVP_CIPHER_CTX_new)                \
  X(EVP_CIPHER_CTX_free)               \
  X(EVP_CIPHER_CTX_ctrl)               \
  X(EVP_EncryptInit_ex)                \
  X(EVP_EncryptUpdate)                 \
  X(EVP_EncryptFinal_ex)               \
  X(EVP_DecryptInit_ex)                \
  X(EVP_DecryptUpdate)                 \
  X(EVP_DecryptFinal_ex)               \
  X(EVP_aes_256_gcm)                   \
  X(EVP_KDF_fetch)                     \
  X(EVP_KDF_free)                      \
  X(EVP_KDF_CTX_new)                   \
  X(EVP_KDF_CTX_free)                  \
  X(EVP_KDF_derive)                    \
  X(OSSL_PARAM_construct_utf8_string)  \
  X(OSSL_PARAM_construct_octet_string) \
  X(OSSL_PARAM_construct_end)          \
  X(ERR_get_error)                     \
  X(ERR_clear_error)                   \
  X(ERR_error_string_n)                \
  X(X509_verify_cert_error_string)     \
  X(BIO_get_new_index)                 \
  X(BIO_meth_new)                      \
  X(BIO_meth_set_write)                \
  X(BIO_meth_set_read)                 \
  X(BIO_meth_set_ctrl)                 \
  X(BIO_new)                           \
  X(BIO_free)                          \
  X(BIO_set_data)                      \
  X(BIO_get_data)                      \
  X(BIO_set_init)                      \
  X(BIO_set_flags)                     \
  X(BIO_clear_flags)

// Those a libcrypto may lack and still serve: a build configured with no-chacha has no
// ChaCha20-Poly1305 (aead.cc then offers AES-GCM alone).
#define RR_LIBCRYPTO_OPTIONAL_FUNCTIONS(X) X(EVP_chacha20_poly1305)

#define RR_LIBSSL_FUNCTIONS(X)          \
  X(TLS_method)                         \
  X(SSL_CTX_new)                        \
  X(SSL_CTX_free)                       \
  X(SSL_CTX_ctrl)                       \
  X(SSL_CTX_set_num_tickets)            \
  X(SSL_CTX_set_verify)                 \
  X(SSL_CTX_use_certificate_chain_file) \
  X(SSL_CTX_use_PrivateKey_file)        \
  X(SSL_CTX_check_private_key)          \
  X(SSL_CTX_load_verify_locations)      \
  X(SSL_new)                            \
  X(SSL_free)                           \
  X(SSL_set_bio)                        \
  X(SSL_set_connect_state)              \
  X(SSL_set_accept_state)               \
  X(SSL_do_handshake)                   \
  X(SSL_get_error)                      \
  X(SSL_get_verify_result)              \
  X(SSL_export_keying_material)         \
  X(SSL_shutdown)                       \
  X(SSL_read)                           \
  X(SSL_alert_desc_string_long)

#define RR_OPENSSL_MEMBER(f) decltype(&::f) f = nullptr;

struct Libcrypto {
  RR_LIBCRYPTO_FUNCTIONS(RR_OPENSSL_MEMBER)
  RR_LIBCRYPTO_OPTIONAL_FUNCTIONS(RR_OPENSSL_MEMBER)
  // Why the library cannot serve (dlopen's or dlsym's words); empty where every required function
  // was found. Where it is not empty, every pointer above is null.
  std::string error;
};

struct Libssl {
  RR_LIBSSL_FUNCTIONS(RR_OPENSSL_MEMBER)
  std::string error;  // as Libcrypto's
};

#undef RR_OPENSSL_MEMBER

// The tables, loaded by the first call (thread-safe; the libraries are never closed: their users
// may call them until the process exits). These never throw: look at `error`, or use require_*.
const Libcrypto& libcrypto();
const Libssl& libssl();  // loads libcrypto too (libssl needs it; the libcrypto table is loaded)

// The table, or an Error "<user> needs OpenSSL's libcrypto.so.3 (Debian: libssl3), which could
// not be loaded: <why>": `user` names the setting that needs it, so that a missing library is said
// at start-up in the words of what asked for it.
const Libcrypto& require_libcrypto(std::string_view user);
const Libssl& require_libssl(std::string_view user);

// Whether libcrypto is in the process (loaded by anyone), without loading it.
bool libcrypto_loaded();

// OpenSSL's words for the errors queued on this thread (oldest first, "; " between), emptying the
// queue; "" where none is queued. For messages: "...: OpenSSL says: <this>".
std::string openssl_errors(const Libcrypto& lib);

}  // namespace ringreduce::core
