// Shared-token authentication: an HMAC-SHA256 challenge-response (OpenSSL's libcrypto, loaded on
// first use; no crypto of our own). Each side of a connection sends a fresh random nonce; each
// proves it holds the token by sending HMAC(token, role label | context | the peer's nonce | its
// own nonce). The role label keeps a proof from being reflected back as the other side's (a
// stranger echoing what it received proves nothing), and the nonces keep a recorded proof from
// being replayed on a new connection. The token itself never crosses the wire.
//
// Used by the TCP store (rendezvous/) and the data connections (transport/), each with its own
// labels. Without a token set, no connection is authenticated (the behaviour before issue 6).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace ringreduce::core::auth {

constexpr size_t kNonceBytes = 32;
constexpr size_t kProofBytes = 32;  // SHA-256
using Nonce = std::array<uint8_t, kNonceBytes>;
using Proof = std::array<uint8_t, kProofBytes>;

// A fresh nonce from the kernel's CSPRNG (getrandom); throws ringreduce::Error if it cannot give
// one.
Nonce random_nonce();

// HMAC-SHA256 keyed by `token` over: label, a zero byte, context, peer_nonce, own_nonce.
// `context` binds whatever else both sides agree on (the hello's fields), so a proof made for
// one connection's parameters is worthless for another's.
Proof make_proof(std::string_view token, std::string_view label, std::span<const uint8_t> context,
                 const Nonce& peer_nonce, const Nonce& own_nonce);

// Loads libcrypto now (make_proof() would on first use), or throws ringreduce::Error naming it:
// where a token is set, a missing library is said at start-up, not deep in a connection's hello.
void require_crypto();
// Whether libcrypto is in the process: the first make_proof() loads it (libcrypto.h says why not
// at start).
bool crypto_loaded();

// Compares in constant time, so that timing does not leak how much of a guess was right.
bool proofs_equal(const Proof& a, const Proof& b);
bool proofs_equal(const Proof& a, std::span<const uint8_t> b);

// Nonces published through the store travel as lowercase hex; from_hex is false on anything else.
std::string nonce_to_hex(const Nonce& n);
bool nonce_from_hex(const std::string& hex, Nonce* out);

}  // namespace ringreduce::core::auth
