// Fuzzes the TCP store server's protocol: the per-connection state machine (hello, proof of the
// token, requests) and the key-value data behind it, through TcpStoreProtocol, which runs the very
// code a TcpStoreServer runs, without sockets.
//
// Input: a flags byte (bit 0: the store has a token), then commands, each one byte c acting on
// client slot c & 3 (four connections, each opened on its first use) with (c >> 2) & 7 saying:
//   0-3  feed: the next byte n, then n bytes (fewer at the end of the input) from the client
//   4    prove: the harness sends the right proof of the token for the slot's hello and the
//        server's challenge (the fuzzer cannot forge an HMAC; this takes it past the handshake)
//   5    time: the next byte b moves the server's clock by b*b*10 ms (get/wait timeouts, the
//        handshake deadline, stalls)
//   6    close: the client closes the slot (its next use opens a new connection)
//   7    hello: the slot sends a well-formed hello (with a nonce when the store has a token)
// After every command the harness reads what the server sent on every connection and checks it
// (any violation aborts, which libFuzzer reports as a crash):
//   - it parses: a server hello (magic, version, a known status, a 64-byte challenge only with a
//     token and status ok), then with a token one verdict byte, then response frames (a known
//     status, a payload within the wire limit); nothing at all after a refusal or a denial, and
//     the connection is closed once a refusal has been delivered;
//   - the server's proof in its challenge is right for the client's nonce and the token;
//   - a verdict of ok comes only on a connection the harness proved: anything else would mean the
//     fuzzer's own bytes got past the token.
// Sanitizers (ASan, UBSan) check every access the server makes while parsing.
// Seeds: tests/fuzz/corpus/fuzz_store/ (written by tests/fuzz/make_store_seeds.py).
#include <algorithm>
#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "core/auth.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/tcp_store_wire.h"

namespace {

using namespace ringreduce;
namespace wire = rendezvous::wire;
namespace auth = core::auth;

constexpr const char* kToken = "fuzz token";
constexpr size_t kSlots = 4;

[[noreturn]] void fail(const char* what) {
  std::fprintf(stderr, "fuzz_store: invariant broken: %s\n", what);
  std::abort();
}

struct Slot {
  enum class Phase { hello, challenge, verdict, frames, refused };
  uint64_t id = 0;
  bool open = false;
  std::vector<uint8_t> fed;  // the first bytes the client sent: its hello
  std::vector<uint8_t> got;  // what the server sent, not yet parsed
  Phase phase = Phase::hello;
  bool have_challenge = false;
  auth::Nonce server_nonce{};
  bool proved = false;  // the harness sent the right proof
};

class Harness {
 public:
  explicit Harness(bool token) : token_(token), store_(token ? kToken : "") {}

  void run(const uint8_t* data, size_t size) {
    size_t i = 0;
    // Bounded: every pass consumes at least the command byte.
    while (i < size) {
      const uint8_t c = data[i++];
      Slot& s = slots_[c & 3];
      const unsigned op = (c >> 2) & 7;
      if (op == 6) {
        if (s.open) store_.client_closed(s.id);
        s = Slot{};
        collect();
        continue;
      }
      if (op == 5) {
        const unsigned b = i < size ? data[i++] : 0;
        store_.advance(std::chrono::milliseconds(uint64_t{b} * b * 10));
        collect();
        continue;
      }
      if (!s.open) open(s);
      if (op <= 3) {
        const size_t n = i < size ? data[i++] : 0;
        const size_t take = std::min(n, size - i);
        feed(s, data + i, take);
        i += take;
      } else if (op == 4) {
        prove(s);
      } else {
        std::vector<uint8_t> h;
        auth::Nonce nonce = auth::random_nonce();
        if (token_)
          wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                                    nonce.size());
        else
          wire::append_client_hello(&h);
        feed(s, h.data(), h.size());
      }
      collect();
    }
    for (auto& s : slots_)
      if (s.open) store_.client_closed(s.id);
  }

 private:
  void open(Slot& s) {
    s = Slot{};
    s.id = store_.connect();
    s.open = true;
  }

  void feed(Slot& s, const uint8_t* p, size_t n) {
    const size_t keep = std::min(n, kHelloMax - std::min(kHelloMax, s.fed.size()));
    s.fed.insert(s.fed.end(), p, p + keep);
    store_.receive(s.id, p, n);
  }

  // The right proof, if the slot's hello carried a nonce and the server has sent its challenge.
  void prove(Slot& s) {
    auth::Nonce client{};
    if (!token_ || !s.have_challenge || !client_nonce(s, &client)) return;
    const auto ctx = wire::auth_context(wire::kVersion, wire::Auth::hmac_sha256);
    const auth::Proof p =
        auth::make_proof(kToken, wire::kClientProofLabel, ctx, s.server_nonce, client);
    s.proved = true;
    store_.receive(s.id, p.data(), p.size());
  }

  static bool client_nonce(const Slot& s, auth::Nonce* out) {
    if (s.fed.size() < wire::kHelloBytes + out->size()) return false;
    if (wire::load16(s.fed.data() + 6) != static_cast<uint16_t>(wire::Auth::hmac_sha256) ||
        wire::load32(s.fed.data() + 8) != out->size())
      return false;
    std::copy_n(s.fed.begin() + wire::kHelloBytes, out->size(), out->begin());
    return true;
  }

  void collect() {
    for (auto& s : slots_) {
      if (!s.open) continue;
      std::vector<uint8_t> out = store_.take_output(s.id);
      s.got.insert(s.got.end(), out.begin(), out.end());
      parse(s);
      if (s.phase == Slot::Phase::refused && store_.is_open(s.id))
        fail("a refused connection stays open after its refusal was delivered");
      if (!store_.is_open(s.id)) s.open = false;
    }
  }

  void parse(Slot& s) {
    size_t off = 0;
    // Bounded: every pass consumes bytes or breaks.
    for (;;) {
      const size_t left = s.got.size() - off;
      const uint8_t* p = s.got.data() + off;
      if (s.phase == Slot::Phase::refused) {
        if (left > 0) fail("bytes after a refusal");
        break;
      }
      if (s.phase == Slot::Phase::hello) {
        if (left < wire::kHelloBytes) break;
        if (wire::load32(p) != wire::kMagic) fail("server hello with a bad magic");
        if (wire::load16(p + 4) != wire::kVersion) fail("server hello with another version");
        const uint16_t status = wire::load16(p + 6);
        const uint32_t clen = wire::load32(p + 8);
        if (status > static_cast<uint16_t>(wire::HelloStatus::encryption_differs))
          fail("unknown hello status");
        if (status == static_cast<uint16_t>(wire::HelloStatus::encryption_differs)) {
          // A client asking for RINGREDUCE_ENCRYPT=psk or tls: refused with the store's own mode,
          // off (TcpStoreProtocol's).
          if (clen != 1) fail("an encryption refusal without the store's mode");
          if (left < wire::kHelloBytes + 1) break;
          if (p[wire::kHelloBytes] != static_cast<uint8_t>(core::Encrypt::off))
            fail("an encryption refusal naming a mode the store does not have");
          off += wire::kHelloBytes + 1;
          s.phase = Slot::Phase::refused;
          continue;
        }
        off += wire::kHelloBytes;
        if (status != static_cast<uint16_t>(wire::HelloStatus::ok)) {
          if (clen != 0) fail("a refusal with a challenge");
          s.phase = Slot::Phase::refused;
        } else if (token_) {
          if (clen != wire::kChallengeBytes) fail("a store with a token sent no challenge");
          s.phase = Slot::Phase::challenge;
        } else {
          if (clen != 0) fail("a store without a token sent a challenge");
          s.phase = Slot::Phase::frames;
        }
        continue;
      }
      if (s.phase == Slot::Phase::challenge) {
        if (left < wire::kChallengeBytes) break;
        std::copy_n(p, s.server_nonce.size(), s.server_nonce.begin());
        auth::Nonce client{};
        if (!client_nonce(s, &client)) fail("a challenge for a hello without a nonce");
        const auto ctx = wire::auth_context(wire::kVersion, wire::Auth::hmac_sha256);
        const auth::Proof want =
            auth::make_proof(kToken, wire::kServerProofLabel, ctx, client, s.server_nonce);
        if (!auth::proofs_equal(
                want, std::span<const uint8_t>(p + s.server_nonce.size(), auth::kProofBytes)))
          fail("the server's proof of the token is wrong");
        s.have_challenge = true;
        off += wire::kChallengeBytes;
        s.phase = Slot::Phase::verdict;
        continue;
      }
      if (s.phase == Slot::Phase::verdict) {
        if (left < 1) break;
        if (p[0] == static_cast<uint8_t>(wire::AuthStatus::ok)) {
          if (!s.proved) fail("a connection got past the token without the right proof");
          s.phase = Slot::Phase::frames;
        } else if (p[0] == static_cast<uint8_t>(wire::AuthStatus::denied)) {
          s.phase = Slot::Phase::refused;
        } else {
          fail("unknown verdict");
        }
        off += 1;
        continue;
      }
      // Response frames.
      if (left < wire::kFrameHeaderBytes) break;
      if (!wire::valid_status(p[0])) fail("unknown response status");
      const uint32_t len = wire::load32(p + 1);
      if (len > wire::kMaxResponsePayload) fail("response payload over the limit");
      if (left < wire::kFrameHeaderBytes + len) break;
      off += wire::kFrameHeaderBytes + len;
    }
    s.got.erase(s.got.begin(), s.got.begin() + static_cast<ptrdiff_t>(off));
  }

  static constexpr size_t kHelloMax = wire::kHelloBytes + wire::kMaxAuthBytes;

  const bool token_;
  rendezvous::TcpStoreProtocol store_;
  std::array<Slot, kSlots> slots_{};
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  Harness h((data[0] & 1) != 0);
  h.run(data + 1, size - 1);
  return 0;
}
