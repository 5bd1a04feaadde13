#include "core/security.h"

#include "core/auth.h"
#include "core/config.h"
#include "ringreduce/error.h"

namespace ringreduce::core {

const char* encrypt_name(Encrypt e) {
  switch (e) {
    case Encrypt::off:
      return "off";
    case Encrypt::psk:
      return "psk";
    case Encrypt::tls:
      return "tls";
  }
  return "?";
}

Security security_settings(const Config& config) {
  Security s;
  s.token = config.str("RINGREDUCE_TOKEN");
  const std::string e = config.str("RINGREDUCE_ENCRYPT");
  if (e == "off")
    s.encrypt = Encrypt::off;
  else if (e == "psk")
    s.encrypt = Encrypt::psk;
  else if (e == "tls")
    s.encrypt = Encrypt::tls;
  else
    throw InvalidArgument("RINGREDUCE_ENCRYPT='" + e + "' is none of off, psk, tls");
  // The keys of psk come from the token; without one there is nothing secret to derive them from.
  if (s.encrypt == Encrypt::psk && s.token.empty())
    throw InvalidArgument(
        "RINGREDUCE_ENCRYPT=psk needs RINGREDUCE_TOKEN (its keys are derived from the token)");
  if (s.encrypt == Encrypt::tls) {
    s.tls = {config.str("RINGREDUCE_TLS_KEY"), config.str("RINGREDUCE_TLS_CERT"),
             config.str("RINGREDUCE_TLS_CA")};
    for (const char* f : {"RINGREDUCE_TLS_KEY", "RINGREDUCE_TLS_CERT", "RINGREDUCE_TLS_CA"})
      if (config.str(f).empty())
        throw InvalidArgument(std::string("RINGREDUCE_ENCRYPT=tls needs ") + f +
                              " (this rank's key and certificate, and the CA its peers' are "
                              "signed by, as PEM files)");
  }
  if (s.encrypt != Encrypt::off) auth::require_crypto();
  return s;
}

bool prefers_aes() {
  // ChaCha20 only where this libcrypto has it (an OpenSSL built without it still has AES-GCM).
  return aead::preferred_cipher() == aead::Cipher::aes_256_gcm ||
         !aead::cipher_available(aead::Cipher::chacha20_poly1305);
}

}  // namespace ringreduce::core
