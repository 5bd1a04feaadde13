// The start-up handshake of a TCP data connection, kept apart from the sockets so that it can be
// unit-tested and fuzzed byte by byte.
//
// Without a token: the connector (the rank that first sends over the link, connector.h) sends its
// Hello; the acceptor checks it and
// answers with its own.
// With a token (RINGREDUCE_TOKEN), both sides prove they hold it (HMAC-SHA256, core/auth.h).
// Every rank publishes a fresh random nonce beside its data address in the store, which is
// itself authenticated: that nonce is the acceptor's challenge, delivered ahead of time, so the
// handshake costs no extra round trip. Then
//   connector -> acceptor  Hello | connector nonce | HMAC(token, "ringreduce data connector",
//                                   Hello, acceptor nonce, connector nonce)
//   acceptor -> connector  Hello | HMAC(token, "ringreduce data acceptor", both Hellos,
//                                   connector nonce, acceptor nonce)
// The acceptor checks the proof before the link exists; the connector checks the answer before
// it uses the link. A stranger without the token can neither join (its proof is wrong) nor pose
// as a rank to a connector (it cannot answer). Without encryption the bytes of an established
// connection are not protected (an attacker on the path could read or alter them); with
// RINGREDUCE_ENCRYPT=psk (kHelloAuthHmacAead, bound into both proofs) every byte after the hellos
// travels in records sealed under keys derived from the token and both nonces
// (secure_channel.h), and a rank whose setting differs is refused at the hello. With
// RINGREDUCE_ENCRYPT=tls the hellos carry no proof (kHelloAuthTls): a TLS 1.3 handshake with
// certificates follows them, and its exported keys seal the records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/aead.h"
#include "core/auth.h"
#include "core/security.h"
#include "transport/tcp/wire.h"

namespace ringreduce::transport::tcp {

// RINGREDUCE_ENCRYPT: what follows the hellos (core/security.h).
using core::Encrypt;

constexpr size_t kConnectorAuthBytes = core::auth::kNonceBytes + core::auth::kProofBytes;
constexpr size_t kAcceptorAuthBytes = core::auth::kProofBytes;

// What an acceptor expects of the hellos it reads.
struct HelloExpect {
  uint64_t comm_id = 0;
  int rank = 0;  // the acceptor; connectors are any other rank
  int size = 1;
  int channels = 1;                // connections per peer
  std::string token;               // empty: no authentication
  Encrypt encrypt = Encrypt::off;  // RINGREDUCE_ENCRYPT (tls: hellos carry no proof, token empty)
  core::auth::Nonce nonce{};       // the acceptor's published nonce (with a token)
};

// The acceptor's side of one connection's hello, fed bytes as they arrive. Bounded: it never
// wants more than sizeof(Hello) + kConnectorAuthBytes in all.
class HelloReader {
 public:
  enum class State { need_more, done, rejected };
  explicit HelloReader(const HelloExpect* expect) : expect_(expect) {}
  // How many more bytes to read: the caller reads at most this many, so nothing after the hello
  // is taken from the socket.
  size_t want() const;
  // Takes n <= want() bytes.
  State feed(const uint8_t* data, size_t n);
  State state() const { return state_; }
  const Hello& hello() const { return hello_; }
  const core::auth::Nonce& peer_nonce() const { return peer_nonce_; }
  // Why the hello was rejected, for the log.
  const std::string& why() const { return why_; }

 private:
  State check_hello();
  State check_proof();
  State reject(std::string why);

  const HelloExpect* expect_;
  uint8_t buf_[sizeof(Hello) + kConnectorAuthBytes] = {};
  size_t got_ = 0;
  Hello hello_;
  core::auth::Nonce peer_nonce_{};
  State state_ = State::need_more;
  std::string why_;
};

// What a connector sends: its Hello (auth set when token is not empty), and with a token its
// nonce (a fresh one is stored in *own_nonce) and its proof for the acceptor's nonce.
std::vector<uint8_t> connector_hello(Hello mine, const std::string& token,
                                     const core::auth::Nonce& acceptor_nonce,
                                     core::auth::Nonce* own_nonce, Encrypt encrypt = Encrypt::off);

// What an acceptor answers to a hello its reader accepted.
std::vector<uint8_t> acceptor_hello(const HelloReader& accepted, Hello mine,
                                    const std::string& token, const core::auth::Nonce& own_nonce,
                                    Encrypt encrypt = Encrypt::off);

// Bytes of the acceptor's answer.
inline size_t acceptor_hello_bytes(const std::string& token) {
  return sizeof(Hello) + (token.empty() ? 0 : kAcceptorAuthBytes);
}

// The connector's check of the answer: "" when it comes from `peer` on `channel` of this
// communicator and, with a token, proves the token; else why not.
std::string check_acceptor_hello(const uint8_t* data, size_t len, const Hello& mine, int peer,
                                 const std::string& token, const core::auth::Nonce& acceptor_nonce,
                                 const core::auth::Nonce& own_nonce,
                                 Encrypt encrypt = Encrypt::off);

// The auth field of this rank's hellos.
uint32_t hello_auth(const std::string& token, Encrypt encrypt);
// The cipher of an encrypted connection whose hellos carried these auth fields.
core::aead::Cipher connection_cipher(uint32_t connector_auth, uint32_t acceptor_auth);

}  // namespace ringreduce::transport::tcp
