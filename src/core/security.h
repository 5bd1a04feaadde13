// What protects a job's connections, read once from the settings: RINGREDUCE_TOKEN (who may join
// and connect) and RINGREDUCE_ENCRYPT with its certificate files (what protects the bytes once
// connected). One reading, shared by the store's connections (rendezvous/) and the data links
// (transport/tcp/), so that both refuse the same bad settings with the same words and agree on a
// cipher the same way.
#pragma once

#include <cstdint>
#include <string>

#include "core/aead.h"
#include "core/tls_keys.h"

namespace ringreduce::core {

class Config;

// RINGREDUCE_ENCRYPT. psk: records sealed under keys derived from the token and both ends'
// nonces; tls: a TLS 1.3 handshake with mutual certificates, then records under keys it exports.
enum class Encrypt : uint8_t { off, psk, tls };
const char* encrypt_name(Encrypt e);  // "off", "psk", "tls"

struct Security {
  std::string token;  // RINGREDUCE_TOKEN; empty: connections are not authenticated by a token
  Encrypt encrypt = Encrypt::off;
  tls::Files tls;  // RINGREDUCE_TLS_KEY, _CERT, _CA (tls only)
};

// Reads and checks the settings: RINGREDUCE_ENCRYPT is one of off, psk, tls; psk has a token to
// derive keys from; tls has its three files. Throws InvalidArgument saying which setting is
// wrong, and Error where encryption is asked for and libcrypto cannot be loaded.
Security security_settings(const Config& config);

// Whether this side would seal with AES-256-GCM: its CPU runs it fastest (aead::preferred_cipher)
// or its libcrypto lacks ChaCha20-Poly1305. What each end's hello says.
bool prefers_aes();
// The cipher two ends agree on from what their hellos said: AES-256-GCM only where both prefer it.
inline aead::Cipher agreed_cipher(bool connector_aes, bool acceptor_aes) {
  return connector_aes && acceptor_aes ? aead::Cipher::aes_256_gcm
                                       : aead::Cipher::chacha20_poly1305;
}

}  // namespace ringreduce::core
