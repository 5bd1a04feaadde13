// Wire formats of the TCP transport. All ranks of a job share one architecture (x86-64, little
// endian), so structs go on the wire as they are; their sizes are pinned by static_asserts.
#pragma once

#include <cstdint>

#include "transport/link.h"

namespace ringreduce::transport::tcp {

inline constexpr uint32_t kHelloMagic = 0x31485252;  // "RRH1"
inline constexpr uint32_t kFrameMagic = 0x31465252;  // "RRF1"
inline constexpr uint32_t kProtocolVersion = 2;      // 2: either rank of a pair may connect

// First bytes on every data connection, connector -> acceptor; the acceptor answers with its own
// Hello. A connection whose hello is wrong (magic, version, communicator, rank, channel, or its
// proof of the token) is a stranger and is dropped without disturbing the job. With a token
// (`auth` = kHelloAuthHmac) each Hello is followed by its sender's proof (handshake.h).
struct Hello {
  uint32_t magic = kHelloMagic;
  uint32_t version = kProtocolVersion;
  uint64_t comm_id = 0;
  int32_t rank = -1;
  int32_t world_size = 0;
  int32_t channel = 0;
  uint32_t auth = 0;  // kHelloAuthNone, kHelloAuthHmac or kHelloAuthHmacAead
};
static_assert(sizeof(Hello) == 32);
inline constexpr uint32_t kHelloAuthNone = 0;
inline constexpr uint32_t kHelloAuthHmac = 1;
// The token's proof, and every byte after the hellos in encrypted records (secure_channel.h)
// under keys derived from the token and both nonces (RINGREDUCE_ENCRYPT=psk); the value says the
// cipher its sender prefers (its CPU's fastest: core/aead.h). A connection uses AES-256-GCM
// where both ends prefer it, ChaCha20-Poly1305 otherwise.
inline constexpr uint32_t kHelloAuthHmacAead = 2;    // prefers AES-256-GCM
inline constexpr uint32_t kHelloAuthHmacChacha = 3;  // prefers ChaCha20-Poly1305
inline bool encrypted_auth(uint32_t auth) {
  return auth == kHelloAuthHmacAead || auth == kHelloAuthHmacChacha;
}
// No proof: a TLS 1.3 handshake with certificates follows the hellos (RINGREDUCE_ENCRYPT=tls),
// whose exported keys seal the records; the value says the cipher preferred, as above.
inline constexpr uint32_t kHelloAuthTls = 4;        // prefers AES-256-GCM
inline constexpr uint32_t kHelloAuthTlsChacha = 5;  // prefers ChaCha20-Poly1305
inline bool tls_auth(uint32_t auth) {
  return auth == kHelloAuthTls || auth == kHelloAuthTlsChacha;
}

enum FrameType : uint16_t {
  kFrameData = 1,
  // The sender failed; payload = int32 error code + reason text. The receiver fails with it.
  kFrameAbort = 2,
};

inline constexpr uint64_t kMaxAbortPayload = 8192;

struct FrameHeader {
  uint32_t magic = kFrameMagic;
  uint16_t type = kFrameData;
  uint16_t channel = 0;
  uint64_t payload_bytes = 0;
  OpTag tag;
};
static_assert(sizeof(FrameHeader) == 64);

}  // namespace ringreduce::transport::tcp
