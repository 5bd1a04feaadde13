#include "transport/tcp/handshake.h"

#include <cstring>
#include <span>

namespace ringreduce::transport::tcp {
namespace {

using core::auth::Nonce;
using core::auth::Proof;

constexpr const char* kConnectorLabel = "ringreduce data connector";
constexpr const char* kAcceptorLabel = "ringreduce data acceptor";

std::span<const uint8_t> bytes_of(const Hello& h) {
  return {reinterpret_cast<const uint8_t*>(&h), sizeof h};
}

std::vector<uint8_t> both(const Hello& connector, const Hello& acceptor) {
  std::vector<uint8_t> v(2 * sizeof(Hello));
  std::memcpy(v.data(), &connector, sizeof(Hello));
  std::memcpy(v.data() + sizeof(Hello), &acceptor, sizeof(Hello));
  return v;
}

}  // namespace

size_t HelloReader::want() const {
  if (state_ != State::need_more) return 0;
  if (got_ < sizeof(Hello)) return sizeof(Hello) - got_;
  return sizeof(Hello) + kConnectorAuthBytes - got_;
}

HelloReader::State HelloReader::feed(const uint8_t* data, size_t n) {
  if (state_ != State::need_more) return state_;
  if (n > want()) return reject("sent more than its hello before the answer");
  const bool had_hello = got_ >= sizeof(Hello);
  std::memcpy(buf_ + got_, data, n);
  got_ += n;
  if (!had_hello && got_ == sizeof(Hello)) {
    if (check_hello() == State::rejected) return state_;
    if (expect_->token.empty()) return state_ = State::done;
  }
  if (got_ == sizeof(Hello) + kConnectorAuthBytes) return check_proof();
  return state_;
}

HelloReader::State HelloReader::check_hello() {
  std::memcpy(&hello_, buf_, sizeof hello_);
  const Hello& h = hello_;
  const HelloExpect& e = *expect_;
  if (h.magic != kHelloMagic) return reject("bad magic (not a ringreduce data connection)");
  if (h.version != kProtocolVersion) return reject("protocol version " + std::to_string(h.version));
  // Token presence before identity: a rank of this job with a different RINGREDUCE_TOKEN
  // setting should be told that, not that it belongs elsewhere.
  // TLS first: its hellos carry no proof whatever the token (the handshake after them checks
  // certificates instead).
  if (e.encrypt == Encrypt::tls && !tls_auth(h.auth))
    return reject("connects without TLS (RINGREDUCE_ENCRYPT=tls here, not there?)");
  if (e.encrypt != Encrypt::tls && tls_auth(h.auth))
    return reject("connects with TLS (RINGREDUCE_ENCRYPT=tls there, not here?)");
  if (h.auth == kHelloAuthNone && !e.token.empty())
    return reject("sent no proof of the token (RINGREDUCE_TOKEN is set here, not there?)");
  if (h.auth != kHelloAuthNone && !tls_auth(h.auth) && e.token.empty())
    return reject("offers a token proof, but RINGREDUCE_TOKEN is not set here");
  if (h.auth != kHelloAuthNone && h.auth != kHelloAuthHmac && !encrypted_auth(h.auth) &&
      !tls_auth(h.auth))
    return reject("unknown authentication method " + std::to_string(h.auth));
  // Encryption before identity too: a rank that would read our records as plaintext (or send
  // its own in the clear) is refused at its hello, saying which setting differs.
  if (h.auth == kHelloAuthHmac && e.encrypt == Encrypt::psk)
    return reject("connects without encryption (RINGREDUCE_ENCRYPT=psk here, not there?)");
  if (encrypted_auth(h.auth) && e.encrypt != Encrypt::psk)
    return reject("connects encrypted (RINGREDUCE_ENCRYPT=psk there, not here?)");
  if (h.comm_id != e.comm_id) return reject("belongs to another communicator");
  if (h.world_size != e.size) return reject("world size " + std::to_string(h.world_size));
  if (h.rank == e.rank || h.rank < 0 || h.rank >= e.size)
    return reject("unexpected rank " + std::to_string(h.rank));
  if (h.channel < 0 || h.channel >= e.channels)
    return reject("bad channel " + std::to_string(h.channel));
  return state_;
}

HelloReader::State HelloReader::check_proof() {
  std::memcpy(peer_nonce_.data(), buf_ + sizeof(Hello), peer_nonce_.size());
  const Proof want = core::auth::make_proof(expect_->token, kConnectorLabel, bytes_of(hello_),
                                            expect_->nonce, peer_nonce_);
  std::span<const uint8_t> got(buf_ + sizeof(Hello) + core::auth::kNonceBytes,
                               core::auth::kProofBytes);
  if (!core::auth::proofs_equal(want, got))
    return reject(
        "wrong proof of the token (RINGREDUCE_TOKEN differs) from a connection claiming "
        "to be rank " +
        std::to_string(hello_.rank));
  return state_ = State::done;
}

HelloReader::State HelloReader::reject(std::string why) {
  why_ = std::move(why);
  return state_ = State::rejected;
}

uint32_t hello_auth(const std::string& token, Encrypt encrypt) {
  const bool aes = core::prefers_aes();
  if (encrypt == Encrypt::tls) return aes ? kHelloAuthTls : kHelloAuthTlsChacha;
  if (token.empty()) return kHelloAuthNone;
  if (encrypt == Encrypt::off) return kHelloAuthHmac;
  return aes ? kHelloAuthHmacAead : kHelloAuthHmacChacha;
}

core::aead::Cipher connection_cipher(uint32_t connector_auth, uint32_t acceptor_auth) {
  auto aes = [](uint32_t a) { return a == kHelloAuthHmacAead || a == kHelloAuthTls; };
  return core::agreed_cipher(aes(connector_auth), aes(acceptor_auth));
}

std::vector<uint8_t> connector_hello(Hello mine, const std::string& token,
                                     const Nonce& acceptor_nonce, Nonce* own_nonce,
                                     Encrypt encrypt) {
  mine.auth = hello_auth(token, encrypt);
  std::vector<uint8_t> out(bytes_of(mine).begin(), bytes_of(mine).end());
  if (token.empty()) return out;
  *own_nonce = core::auth::random_nonce();
  const Proof p =
      core::auth::make_proof(token, kConnectorLabel, bytes_of(mine), acceptor_nonce, *own_nonce);
  out.insert(out.end(), own_nonce->begin(), own_nonce->end());
  out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::vector<uint8_t> acceptor_hello(const HelloReader& accepted, Hello mine,
                                    const std::string& token, const Nonce& own_nonce,
                                    Encrypt encrypt) {
  mine.auth = hello_auth(token, encrypt);
  std::vector<uint8_t> out(bytes_of(mine).begin(), bytes_of(mine).end());
  if (token.empty()) return out;
  const Proof p = core::auth::make_proof(token, kAcceptorLabel, both(accepted.hello(), mine),
                                         accepted.peer_nonce(), own_nonce);
  out.insert(out.end(), p.begin(), p.end());
  return out;
}

std::string check_acceptor_hello(const uint8_t* data, size_t len, const Hello& mine, int peer,
                                 const std::string& token, const Nonce& acceptor_nonce,
                                 const Nonce& own_nonce, Encrypt encrypt) {
  if (len != acceptor_hello_bytes(token)) return "answered with a hello of the wrong length";
  Hello h;
  std::memcpy(&h, data, sizeof h);
  if (h.magic != kHelloMagic || h.version != kProtocolVersion || h.comm_id != mine.comm_id ||
      h.rank != peer || h.world_size != mine.world_size || h.channel != mine.channel)
    return "answered with a wrong hello";
  if (encrypt == Encrypt::tls)
    return tls_auth(h.auth) ? "" : "answered without TLS (RINGREDUCE_ENCRYPT differs there?)";
  if (tls_auth(h.auth)) return "answered with TLS (RINGREDUCE_ENCRYPT=tls there?)";
  if (token.empty()) return "";
  Hello sent = mine;
  sent.auth = hello_auth(token, encrypt);
  const Proof want =
      core::auth::make_proof(token, kAcceptorLabel, both(sent, h), own_nonce, acceptor_nonce);
  if ((encrypt == Encrypt::psk ? !encrypted_auth(h.auth) : h.auth != sent.auth) ||
      !core::auth::proofs_equal(
          want, std::span<const uint8_t>(data + sizeof(Hello), core::auth::kProofBytes)))
    return "answered without a valid proof of the token (RINGREDUCE_TOKEN differs?)";
  return "";
}

}  // namespace ringreduce::transport::tcp
