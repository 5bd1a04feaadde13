// StoreEngine's admission of a connection (store_engine.h): the hello, the token's proofs and
// the TLS handshake's end, which decide whether a client is served and whether its bytes are
// sealed (RINGREDUCE_ENCRYPT). Requests and data are store_engine.cc's.
#include <algorithm>

#include "rendezvous/store_engine.h"

namespace ringreduce::rendezvous::store_server {

void StoreEngine::refuse(Conn& c, wire::HelloStatus status, const std::string& why,
                         std::span<const uint8_t> challenge) {
  // Answered before closing, so that the client can say what is wrong.
  warn("refusing client " + c.peer + ": " + why);
  wire::append_server_hello(&c.out, status, challenge.data(), challenge.size());
  c.state = Conn::State::closing;
  c.in.clear();
  c.in_off = 0;
  flush(c);
}

bool StoreEngine::handle_hello(Conn& c) {
  if (c.in_avail() < wire::kHelloBytes) return false;
  const uint8_t* p = c.in.data() + c.in_off;
  uint32_t magic = wire::load32(p);
  uint16_t version = wire::load16(p + 4);
  uint16_t auth = wire::load16(p + 6);
  uint32_t auth_len = wire::load32(p + 8);
  if (magic != wire::kMagic) {
    char buf[64];
    std::snprintf(buf, sizeof(buf), "bad magic 0x%08x (not a ringreduce store client)", magic);
    drop(c, buf);
    return false;
  }
  if (auth_len > wire::kMaxAuthBytes) {
    drop(c, "hello announces " + std::to_string(auth_len) + " bytes of authentication data");
    return false;
  }
  if (c.in_avail() < wire::kHelloBytes + auth_len) return false;
  const uint8_t* auth_data = p + wire::kHelloBytes;
  c.in_off += wire::kHelloBytes + auth_len;
  if (version != wire::kVersion) {
    refuse(c, wire::HelloStatus::bad_version,
           "it speaks protocol version " + std::to_string(version) + ", this server " +
               std::to_string(wire::kVersion));
    return false;
  }
  if (auth > wire::kMaxAuth) {
    refuse(c, wire::HelloStatus::auth_unsupported,
           "it asks for authentication method " + std::to_string(auth) +
               ", which this server does not offer");
    return false;
  }
  const core::Encrypt theirs = wire::auth_encrypt(auth);
  if (theirs != security_.encrypt) {
    const uint8_t mine = static_cast<uint8_t>(security_.encrypt);
    refuse(c, wire::HelloStatus::encryption_differs,
           std::string("it connects with RINGREDUCE_ENCRYPT=") + core::encrypt_name(theirs) +
               ", this store has " + core::encrypt_name(security_.encrypt),
           std::span<const uint8_t>(&mine, 1));
    return false;
  }
  if (theirs != core::Encrypt::off)
    c.cipher = core::agreed_cipher(wire::auth_prefers_aes(auth), core::prefers_aes());
  c.key_context = wire::key_context(version, auth, c.cipher);
  const uint8_t cipher = static_cast<uint8_t>(c.cipher);
  if (theirs == core::Encrypt::tls) {
    // The certificates authenticate both ends; the token plays no part.
    if (auth_len != 0) {
      drop(c, "TLS hello carries " + std::to_string(auth_len) + " bytes of authentication data");
      return false;
    }
    // Nothing may follow the hello before the server's answer: bytes here would be taken as
    // requests once the handshake (which reads the socket, not c.in) succeeded, unsealed, from
    // whoever put them on the path.
    if (c.in_avail() > 0) {
      drop(c, "sent " + std::to_string(c.in_avail()) +
                  " bytes after its TLS hello, before the server's answer");
      return false;
    }
    wire::append_server_hello(&c.out, wire::HelloStatus::ok, &cipher, 1);
    c.state = Conn::State::tls;
    flush(c);
    // 13 bytes on a fresh connection: a socket that does not take them at once is not worth a
    // handshake thread's wait.
    if (!c.dead && c.out_pending()) drop(c, "did not take the server's hello");
    if (!c.dead) start_tls(c);
    return false;
  }
  const bool wants_hmac = wire::auth_proves_token(auth);
  if (security_.token.empty()) {
    if (wants_hmac) {
      refuse(c, wire::HelloStatus::auth_unsupported,
             "it has a RINGREDUCE_TOKEN and asks to prove it, but this store was started without "
             "one");
      return false;
    }
    if (auth_len != 0) {
      drop(c, "hello without authentication carries " + std::to_string(auth_len) +
                  " bytes of authentication data");
      return false;
    }
    wire::append_server_hello(&c.out, wire::HelloStatus::ok);
    c.state = Conn::State::ready;
    RR_LOG(trace, store, -1, where, ": client ", c.peer, " said hello");
    flush(c);
    return !c.dead;
  }
  if (!wants_hmac) {
    refuse(c, wire::HelloStatus::auth_required,
           "it sent no proof of RINGREDUCE_TOKEN, which this store requires (the client has no "
           "token set)");
    return false;
  }
  if (auth_len != core::auth::kNonceBytes) {
    drop(c, "hello carries a nonce of " + std::to_string(auth_len) + " bytes, not " +
                std::to_string(core::auth::kNonceBytes));
    return false;
  }
  core::auth::Nonce client_nonce{};
  std::copy(auth_data, auth_data + client_nonce.size(), client_nonce.begin());
  const core::auth::Nonce server_nonce = core::auth::random_nonce();
  // The proofs bind the hello's auth, so that the mode asked for cannot be changed on the way.
  const auto ctx = wire::auth_context(version, static_cast<wire::Auth>(auth));
  const core::auth::Proof server_proof = core::auth::make_proof(
      security_.token, wire::kServerProofLabel, ctx, client_nonce, server_nonce);
  c.expected_proof = core::auth::make_proof(security_.token, wire::kClientProofLabel, ctx,
                                            server_nonce, client_nonce);
  uint8_t challenge[wire::kChallengeBytes + 1];
  std::copy(server_nonce.begin(), server_nonce.end(), challenge);
  std::copy(server_proof.begin(), server_proof.end(), challenge + server_nonce.size());
  size_t challenge_len = wire::kChallengeBytes;
  if (theirs == core::Encrypt::psk) {
    challenge[challenge_len++] = cipher;
    c.pending_keys = std::make_unique<core::aead::SessionKeys>(
        core::aead::derive_keys(security_.token, wire::kKeyLabel, c.key_context, client_nonce,
                                server_nonce, core::aead::Side::acceptor, c.cipher));
  }
  wire::append_server_hello(&c.out, wire::HelloStatus::ok, challenge, challenge_len);
  c.state = Conn::State::auth;
  RR_LOG(trace, store, -1, where, ": client ", c.peer, " said hello; challenge sent");
  flush(c);
  return !c.dead;
}

bool StoreEngine::handle_proof(Conn& c) {
  if (c.in_avail() < core::auth::kProofBytes) return false;
  std::span<const uint8_t> proof(c.in.data() + c.in_off, core::auth::kProofBytes);
  c.in_off += core::auth::kProofBytes;
  if (!core::auth::proofs_equal(c.expected_proof, proof)) {
    warn("dropping client " + c.peer +
         ": its proof of RINGREDUCE_TOKEN is wrong (another token, or a replayed proof)");
    c.out.push_back(static_cast<uint8_t>(wire::AuthStatus::denied));
    c.state = Conn::State::closing;
    c.in.clear();
    c.in_off = 0;
    flush(c);
    return false;
  }
  c.out.push_back(static_cast<uint8_t>(wire::AuthStatus::ok));
  c.state = Conn::State::ready;
  RR_LOG(trace, store, -1, where, ": client ", c.peer, " proved it holds the token");
  flush(c);
  if (c.pending_keys) {
    // Everything after the verdict is sealed; a client that sent more before reading it is not
    // ours.
    c.records = std::make_unique<StoreRecords>(*c.pending_keys);
    c.pending_keys.reset();
    if (c.in_avail() > 0) {
      drop(c, "sent " + std::to_string(c.in_avail()) + " bytes before its proof was accepted");
      return false;
    }
  }
  return !c.dead;
}

void StoreEngine::tls_done(Conn& c, const core::tls::Secret* secret, const std::string& error) {
  if (c.dead || c.state != Conn::State::tls) return;
  if (secret == nullptr || c.in_avail() > 0) {
    if (secret != nullptr) {  // cannot happen: nothing is read in state tls; never served unsealed
      drop(c, "had unsealed bytes when its TLS handshake ended");
      return;
    }
    drop(c, "RINGREDUCE_ENCRYPT=tls: " + error);  // the error says what of TLS failed
    return;
  }
  c.records = std::make_unique<StoreRecords>(core::aead::derive_keys_from_secret(
      secret->bytes, wire::kKeyLabel, c.key_context, core::aead::Side::acceptor, c.cipher));
  c.state = Conn::State::ready;
  c.last_progress = now();
  RR_LOG(trace, store, -1, where, ": client ", c.peer, " passed the TLS handshake");
}

}  // namespace ringreduce::rendezvous::store_server
