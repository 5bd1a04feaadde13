// The data connections' start-up handshake (transport/tcp/handshake.h) and the token proofs
// under it (core/auth.h): a right hello is accepted whichever way its bytes are split, and every
// wrong one (identity, token presence, token value, replay, garbage) is rejected with a reason.
#include "transport/tcp/handshake.h"

#include <gtest/gtest.h>

#include <cstring>

namespace {

using namespace ringreduce::transport::tcp;
namespace auth = ringreduce::core::auth;

HelloExpect expect_for(const std::string& token) {
  HelloExpect e;
  e.comm_id = 77;
  e.rank = 1;
  e.size = 4;
  e.channels = 2;
  e.token = token;
  if (!token.empty()) e.nonce = auth::random_nonce();
  return e;
}

Hello hello_from(int rank, int channel) {
  Hello h;
  h.comm_id = 77;
  h.rank = rank;
  h.world_size = 4;
  h.channel = channel;
  return h;
}

// Feeds msg `step` bytes at a time; the reader's final state.
HelloReader::State feed(HelloReader& r, const std::vector<uint8_t>& msg, size_t step) {
  size_t off = 0;
  while (off < msg.size() && r.state() == HelloReader::State::need_more) {
    const size_t n = std::min({step, msg.size() - off, r.want()});
    if (n == 0) break;
    r.feed(msg.data() + off, n);
    off += n;
  }
  return r.state();
}

// libcrypto is loaded by the first proof, not at start (auth.cc): a job without a token never pays
// for it. (ctest runs each test in a process of its own; run alone, this one starts clean.)
TEST(Auth, LibcryptoIsLoadedByTheFirstProofOnly) {
  const auth::Nonce a = auth::random_nonce(), b = auth::random_nonce();
  EXPECT_FALSE(auth::crypto_loaded());
  auth::make_proof("tok", "label", std::vector<uint8_t>{}, a, b);
  EXPECT_TRUE(auth::crypto_loaded());
}

TEST(Auth, ProofsDependOnEveryInput) {
  const auth::Nonce a = auth::random_nonce(), b = auth::random_nonce();
  EXPECT_NE(a, b);
  const std::vector<uint8_t> ctx = {1, 2, 3};
  const auth::Proof p = auth::make_proof("tok", "label", ctx, a, b);
  EXPECT_TRUE(auth::proofs_equal(p, auth::make_proof("tok", "label", ctx, a, b)));
  EXPECT_FALSE(auth::proofs_equal(p, auth::make_proof("tok2", "label", ctx, a, b)));
  EXPECT_FALSE(auth::proofs_equal(p, auth::make_proof("tok", "label2", ctx, a, b)));
  EXPECT_FALSE(
      auth::proofs_equal(p, auth::make_proof("tok", "label", std::vector<uint8_t>{1, 2}, a, b)));
  EXPECT_FALSE(auth::proofs_equal(p, auth::make_proof("tok", "label", ctx, b, a)));
  // The proof is OpenSSL's HMAC-SHA256 over label | 0 | context | nonces, and nothing of our own:
  // this value is python3's hmac.new(b"Jefe", b"what do ya want for nothing?" + bytes(65),
  // hashlib.sha256).hexdigest() (RFC 4231's key and message, then the NUL and two zero nonces).
  const auth::Nonce zero{};
  const auth::Proof q = auth::make_proof("Jefe", "what do ya want for nothing?",
                                         std::span<const uint8_t>(), zero, zero);
  EXPECT_EQ(auth::nonce_to_hex(q),
            "809a3793e41cd9521eb4b588db62534fe95920fa2d1013dc037ba91813be05ab");
}

TEST(Auth, HexRoundTripAndGarbage) {
  const auth::Nonce n = auth::random_nonce();
  auth::Nonce back{};
  ASSERT_TRUE(auth::nonce_from_hex(auth::nonce_to_hex(n), &back));
  EXPECT_EQ(n, back);
  EXPECT_FALSE(auth::nonce_from_hex("-", &back));
  EXPECT_FALSE(auth::nonce_from_hex(std::string(64, 'g'), &back));
  EXPECT_FALSE(auth::nonce_from_hex(std::string(63, 'a'), &back));
}

TEST(Handshake, RightHellosAreAcceptedWhateverTheSplit) {
  for (const std::string token : {"", "s3cret"}) {
    const HelloExpect e = expect_for(token);
    for (size_t step : {1, 3, 32, 33, 64, 96}) {
      auth::Nonce cn{};
      const auto msg = connector_hello(hello_from(3, 1), token, e.nonce, &cn);
      EXPECT_EQ(msg.size(), sizeof(Hello) + (token.empty() ? 0 : kConnectorAuthBytes));
      HelloReader r(&e);
      ASSERT_EQ(feed(r, msg, step), HelloReader::State::done) << r.why();
      EXPECT_EQ(r.hello().rank, 3);
      EXPECT_EQ(r.want(), 0u);
      // The answer proves the token back, and only to this connector.
      Hello acc = hello_from(1, 1);
      const auto answer = acceptor_hello(r, acc, token, e.nonce);
      Hello sent = hello_from(3, 1);
      EXPECT_EQ(check_acceptor_hello(answer.data(), answer.size(), sent, 1, token, e.nonce, cn),
                "");
      EXPECT_NE(check_acceptor_hello(answer.data(), answer.size(), sent, 2, token, e.nonce, cn),
                "");
      if (!token.empty()) {
        auth::Nonce other = auth::random_nonce();
        EXPECT_NE(
            check_acceptor_hello(answer.data(), answer.size(), sent, 1, token, e.nonce, other), "");
        EXPECT_NE(check_acceptor_hello(answer.data(), answer.size(), sent, 1, "nope", e.nonce, cn),
                  "");
      }
    }
  }
}

TEST(Handshake, WrongHellosAreRejectedWithAReason) {
  const HelloExpect e = expect_for("s3cret");
  auto rejected = [&](const std::vector<uint8_t>& msg) {
    HelloReader r(&e);
    feed(r, msg, 7);
    EXPECT_EQ(r.state(), HelloReader::State::rejected);
    return r.why();
  };
  auth::Nonce cn{};
  // Wrong token.
  EXPECT_NE(rejected(connector_hello(hello_from(3, 0), "other", e.nonce, &cn)).find("wrong proof"),
            std::string::npos);
  // No token on the connector.
  EXPECT_NE(rejected(connector_hello(hello_from(3, 0), "", e.nonce, &cn)).find("no proof"),
            std::string::npos);
  // A proof made for another acceptor's nonce (a replay from elsewhere).
  EXPECT_NE(rejected(connector_hello(hello_from(3, 0), "s3cret", auth::random_nonce(), &cn))
                .find("wrong proof"),
            std::string::npos);
  // A right proof for rank 3 presented as rank 2: the proof covers the hello.
  auto msg = connector_hello(hello_from(3, 0), "s3cret", e.nonce, &cn);
  Hello h;
  std::memcpy(&h, msg.data(), sizeof h);
  h.rank = 2;
  std::memcpy(msg.data(), &h, sizeof h);
  EXPECT_NE(rejected(msg).find("wrong proof"), std::string::npos);
  // Identity: its own rank, out-of-range rank and channel, other communicator, world size, magic.
  // (Any other rank may connect: whichever end sends first, connector.h.)
  EXPECT_NE(rejected(connector_hello(hello_from(1, 0), "s3cret", e.nonce, &cn)).find("rank 1"),
            std::string::npos);
  {
    HelloReader lower(&e);
    feed(lower, connector_hello(hello_from(0, 0), "s3cret", e.nonce, &cn), 7);
    EXPECT_EQ(lower.state(), HelloReader::State::done);
  }
  EXPECT_NE(rejected(connector_hello(hello_from(4, 0), "s3cret", e.nonce, &cn)).find("rank 4"),
            std::string::npos);
  EXPECT_NE(rejected(connector_hello(hello_from(2, 2), "s3cret", e.nonce, &cn)).find("channel"),
            std::string::npos);
  Hello other = hello_from(2, 0);
  other.comm_id = 78;
  EXPECT_NE(rejected(connector_hello(other, "s3cret", e.nonce, &cn)).find("another communicator"),
            std::string::npos);
  other = hello_from(2, 0);
  other.world_size = 5;
  EXPECT_NE(rejected(connector_hello(other, "s3cret", e.nonce, &cn)).find("world size"),
            std::string::npos);
  EXPECT_NE(rejected(std::vector<uint8_t>(96, 'x')).find("bad magic"), std::string::npos);
  // A token proof offered to an acceptor without a token.
  const HelloExpect plain = expect_for("");
  HelloReader r(&plain);
  feed(r, connector_hello(hello_from(2, 0), "s3cret", e.nonce, &cn), 96);
  EXPECT_EQ(r.state(), HelloReader::State::rejected);
  EXPECT_NE(r.why().find("not set here"), std::string::npos) << r.why();
}

TEST(Handshake, TheReaderNeverTakesMoreThanTheHello) {
  const HelloExpect e = expect_for("s3cret");
  HelloReader r(&e);
  EXPECT_EQ(r.want(), sizeof(Hello));
  std::vector<uint8_t> big(200, 0);
  EXPECT_EQ(r.feed(big.data(), big.size()), HelloReader::State::rejected);
}

}  // namespace
