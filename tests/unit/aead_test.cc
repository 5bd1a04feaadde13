// The per-frame AEAD of issue 45 (core/aead.h): keys derived per direction, frames that round-trip
// in place with both ciphers, and every way a frame can be tampered with on the way (a bit
// flipped anywhere, a frame replayed, dropped or two swapped, another key) refused in words that
// say which. AeadSpeed prints the single-core throughput quoted in aead.cc (no timed assertion).
#include "core/aead.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace {

using namespace ringreduce::core::aead;
namespace auth = ringreduce::core::auth;

std::string hex(const uint8_t* p, size_t n) {
  std::string s;
  char b[3];
  for (size_t i = 0; i < n; ++i) {
    std::snprintf(b, sizeof b, "%02x", p[i]);
    s += b;
  }
  return s;
}

const std::vector<uint8_t> kContext = {1, 2, 3};

// Both ends of one connection: what the connector and the acceptor derive from the same inputs.
struct Pair {
  SessionKeys connector, acceptor;
};

Pair psk_pair(Cipher c, const std::string& token = "the token") {
  const auth::Nonce a = auth::random_nonce(), b = auth::random_nonce();
  return {derive_keys(token, "ringreduce test", kContext, a, b, Side::connector, c),
          derive_keys(token, "ringreduce test", kContext, a, b, Side::acceptor, c)};
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(seed + i * 131 + (i >> 8));
  return v;
}

// A sealed frame as a link would carry it: header (the aad, carrying seq), payload, tag.
struct Frame {
  uint64_t seq = 0;
  std::vector<uint8_t> header;
  std::vector<uint8_t> payload;
  Tag tag{};
};

Frame seal_frame(Sealer& s, std::vector<uint8_t> payload, const std::string& header = "hdr") {
  Frame f;
  f.header.assign(header.begin(), header.end());
  f.payload = std::move(payload);
  f.seq = s.seal(f.header, f.payload, f.tag);
  return f;
}

void open_frame(Opener& o, Frame f) {  // by value: opening decrypts in place
  o.open(f.seq, f.header, f.payload, f.tag);
}

// The message of the FrameError `fn` throws, checking its kind.
template <typename Fn>
std::string frame_error(Fn fn, FrameError::Kind kind) {
  try {
    fn();
  } catch (const FrameError& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    EXPECT_EQ(e.code(), ringreduce::ErrorCode::peer);
    return e.what();
  }
  ADD_FAILURE() << "no FrameError";
  return "";
}

class AeadTest : public ::testing::TestWithParam<Cipher> {};

INSTANTIATE_TEST_SUITE_P(BothCiphers, AeadTest,
                         ::testing::Values(Cipher::aes_256_gcm, Cipher::chacha20_poly1305),
                         [](const auto& info) {
                           return info.param == Cipher::aes_256_gcm ? std::string("AesGcm")
                                                                    : std::string("ChaCha20");
                         });

TEST(AeadCipher, PreferredFollowsTheCpuAndBothAreThere) {
#if defined(__x86_64__)
  const bool hw = __builtin_cpu_supports("aes") && __builtin_cpu_supports("pclmul");
  EXPECT_EQ(preferred_cipher(), hw ? Cipher::aes_256_gcm : Cipher::chacha20_poly1305);
#endif
  EXPECT_TRUE(cipher_available(Cipher::aes_256_gcm));
  EXPECT_TRUE(cipher_available(Cipher::chacha20_poly1305));
  EXPECT_STREQ(cipher_name(Cipher::aes_256_gcm), "AES-256-GCM");
  EXPECT_STREQ(cipher_name(Cipher::chacha20_poly1305), "ChaCha20-Poly1305");
}

TEST_P(AeadTest, SidesMirrorAndTheTwoDirectionsDiffer) {
  const Pair p = psk_pair(GetParam());
  EXPECT_EQ(p.connector.cipher, GetParam());
  EXPECT_EQ(p.connector.send.key, p.acceptor.recv.key);
  EXPECT_EQ(p.connector.send.iv, p.acceptor.recv.iv);
  EXPECT_EQ(p.connector.recv.key, p.acceptor.send.key);
  EXPECT_EQ(p.connector.recv.iv, p.acceptor.send.iv);
  EXPECT_NE(p.connector.send.key, p.connector.recv.key);
  EXPECT_NE(p.connector.send.iv, p.connector.recv.iv);
}

TEST(AeadKeys, EveryInputChangesTheKeys) {
  const auth::Nonce a = auth::random_nonce(), b = auth::random_nonce();
  const auto key = [&](const std::string& token, const std::string& label,
                       const std::vector<uint8_t>& ctx, const auth::Nonce& x, const auth::Nonce& y,
                       Cipher c) {
    return derive_keys(token, label, ctx, x, y, Side::connector, c).send.key;
  };
  const auto base = key("tok", "label", kContext, a, b, Cipher::aes_256_gcm);
  EXPECT_EQ(base, key("tok", "label", kContext, a, b, Cipher::aes_256_gcm));
  EXPECT_NE(base, key("tok2", "label", kContext, a, b, Cipher::aes_256_gcm));
  EXPECT_NE(base, key("tok", "label2", kContext, a, b, Cipher::aes_256_gcm));
  EXPECT_NE(base, key("tok", "label", {1, 2}, a, b, Cipher::aes_256_gcm));
  EXPECT_NE(base, key("tok", "label", kContext, b, a, Cipher::aes_256_gcm));
  EXPECT_NE(base, key("tok", "label", kContext, a, auth::random_nonce(), Cipher::aes_256_gcm));
  EXPECT_NE(base, key("tok", "label", kContext, a, b, Cipher::chacha20_poly1305));
  EXPECT_THROW(key("", "label", kContext, a, b, Cipher::aes_256_gcm), ringreduce::InvalidArgument);
}

// The derivation and the frame format are OpenSSL's HKDF-SHA256 and AEADs and nothing of our own:
// these values are Python's `cryptography` (HKDF with info = label | 0 | cipher | context; the
// frame's nonce the IV base XOR the sequence number in its last 8 bytes, big-end first). Two
// builds that disagree on any of it could not talk.
TEST(AeadKeys, KnownAnswers) {
  std::vector<uint8_t> secret(32);
  for (size_t i = 0; i < secret.size(); ++i) secret[i] = static_cast<uint8_t>(i);
  const struct {
    Cipher c;
    const char* okm8;
    const char* frame1;  // "hello" under aad "hdr" as frame 1: ciphertext then tag
  } cases[] = {
      {Cipher::aes_256_gcm, "1cb5e47bbd217122", "3ad5cb3872357e157f6cc2472d7c60bd693f20ed34"},
      {Cipher::chacha20_poly1305, "183bf6a0da4ab483", "bb16607edfe91b285cb786963532b68b3b3477ccd4"},
  };
  for (const auto& k : cases) {
    SCOPED_TRACE(cipher_name(k.c));
    const SessionKeys keys =
        derive_keys_from_secret(secret, "ringreduce test", kContext, Side::connector, k.c);
    EXPECT_EQ(hex(keys.send.key.data(), 8), k.okm8);
    Sealer s(keys);
    seal_frame(s, pattern(7, 0));
    Frame f = seal_frame(s, {'h', 'e', 'l', 'l', 'o'});
    EXPECT_EQ(f.seq, 1u);
    EXPECT_EQ(hex(f.payload.data(), f.payload.size()) + hex(f.tag.data(), f.tag.size()), k.frame1);
  }
  // The pre-shared-key form: the token as key, the connector's then the acceptor's nonce as salt.
  auth::Nonce a, b;
  a.fill(0x11);
  b.fill(0x22);
  const SessionKeys psk =
      derive_keys("tok", "ringreduce test", kContext, a, b, Side::connector, Cipher::aes_256_gcm);
  EXPECT_EQ(hex(psk.send.key.data(), 8), "2e4c53dbd97c6686");
  EXPECT_EQ(hex(psk.recv.key.data(), 8), "74efe7922e1d66bf");
}

TEST_P(AeadTest, RoundTripInPlace) {
  const Pair p = psk_pair(GetParam());
  Sealer to_acceptor(p.connector);
  Opener at_acceptor(p.acceptor);
  Sealer to_connector(p.acceptor);
  Opener at_connector(p.connector);
  uint64_t expect_seq = 0;
  for (size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{1} << 20}) {
    SCOPED_TRACE(n);
    const std::vector<uint8_t> plain = pattern(n, static_cast<uint8_t>(n));
    for (int dir = 0; dir < 2; ++dir) {
      Sealer& s = dir ? to_connector : to_acceptor;
      Opener& o = dir ? at_connector : at_acceptor;
      std::vector<uint8_t> buf = plain;
      const uint8_t* where = buf.data();
      Tag tag{};
      const std::vector<uint8_t> header = {9, 8, 7, static_cast<uint8_t>(n)};
      const uint64_t seq = s.seal(header, buf, tag);
      EXPECT_EQ(seq, expect_seq);
      EXPECT_EQ(buf.data(), where);  // in place
      if (n >= 16) {
        EXPECT_NE(buf, plain);
      }
      o.open(seq, header, buf, tag);
      EXPECT_EQ(buf, plain);
      EXPECT_EQ(o.expected_sequence(), seq + 1);
    }
    ++expect_seq;
  }
}

TEST_P(AeadTest, WrongTokenFailsToOpen) {
  const Pair right = psk_pair(GetParam(), "the token");
  const auth::Nonce a = auth::random_nonce(), b = auth::random_nonce();
  const SessionKeys wrong =
      derive_keys("not the token", "ringreduce test", kContext, a, b, Side::acceptor, GetParam());
  Sealer s(right.connector);
  Opener o(wrong);
  const std::string msg = frame_error([&] { open_frame(o, seal_frame(s, pattern(100, 1))); },
                                      FrameError::Kind::altered);
  EXPECT_NE(msg.find("altered: frame 0 failed its"), std::string::npos) << msg;
  EXPECT_NE(msg.find(cipher_name(GetParam())), std::string::npos) << msg;
}

// A frame reflected back to its sender, or opened under the other cipher, is not data either.
TEST_P(AeadTest, OwnFrameReflectedOrOtherCipherFails) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener own(p.connector);  // opens what the acceptor seals
  frame_error([&] { open_frame(own, seal_frame(s, pattern(64, 2))); }, FrameError::Kind::altered);
  SessionKeys other = p.acceptor;
  other.cipher =
      GetParam() == Cipher::aes_256_gcm ? Cipher::chacha20_poly1305 : Cipher::aes_256_gcm;
  Opener crossed(other);
  Sealer s2(p.connector);
  frame_error([&] { open_frame(crossed, seal_frame(s2, pattern(64, 2))); },
              FrameError::Kind::altered);
}

TEST_P(AeadTest, FlippedBitAnywhereIsAltered) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener o(p.acceptor);
  const std::vector<uint8_t> plain = pattern(4095, 3);
  const Frame f = seal_frame(s, plain, "header of frame 0");
  std::vector<Frame> tampered;
  for (size_t byte : {size_t{0}, size_t{1000}, plain.size() - 1}) {
    Frame t = f;
    t.payload[byte] ^= 0x10;
    tampered.push_back(t);
  }
  for (size_t byte : {size_t{0}, f.header.size() - 1}) {
    Frame t = f;
    t.header[byte] ^= 0x01;
    tampered.push_back(t);
  }
  for (size_t byte : {size_t{0}, kTagBytes - 1}) {
    Frame t = f;
    t.tag[byte] ^= 0x80;
    tampered.push_back(t);
  }
  {
    Frame t = f;  // a frame cut short
    t.payload.pop_back();
    tampered.push_back(t);
  }
  for (size_t i = 0; i < tampered.size(); ++i) {
    SCOPED_TRACE(i);
    Frame t = tampered[i];
    try {
      o.open(t.seq, t.header, t.payload, t.tag);
      ADD_FAILURE() << "opened";
    } catch (const FrameError& e) {
      EXPECT_EQ(e.kind(), FrameError::Kind::altered);
      EXPECT_EQ(std::string(e.what()).rfind("altered: frame 0", 0), 0u) << e.what();
    }
    // What the failed open left in the buffer is not the plaintext, nor anything else.
    EXPECT_EQ(t.payload, std::vector<uint8_t>(t.payload.size(), 0));
    EXPECT_EQ(o.expected_sequence(), 0u);
  }
  // The untouched frame still opens: a refused one does not move the count.
  Frame good = f;
  o.open(good.seq, good.header, good.payload, good.tag);
  EXPECT_EQ(good.payload, plain);
}

TEST_P(AeadTest, ReplayedFrameIsNamed) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener o(p.acceptor);
  const Frame f0 = seal_frame(s, pattern(10, 0)), f1 = seal_frame(s, pattern(10, 1));
  open_frame(o, f0);
  open_frame(o, f1);
  const std::string msg = frame_error([&] { open_frame(o, f0); }, FrameError::Kind::replayed);
  EXPECT_EQ(msg, "replayed: frame 0 arrived again, frame 2 expected");
  frame_error([&] { open_frame(o, f1); }, FrameError::Kind::replayed);
  EXPECT_EQ(o.expected_sequence(), 2u);
}

TEST_P(AeadTest, DroppedFrameIsNamed) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener o(p.acceptor);
  const Frame f0 = seal_frame(s, pattern(10, 0));
  seal_frame(s, pattern(10, 1));  // lost on the way
  const Frame f2 = seal_frame(s, pattern(10, 2));
  const Frame f3 = seal_frame(s, pattern(10, 3));
  open_frame(o, f0);
  FrameError::Kind kind = FrameError::Kind::dropped_or_reordered;
  EXPECT_EQ(frame_error([&] { open_frame(o, f2); }, kind),
            "dropped or reordered: frame 1 expected, 2 arrived");
  EXPECT_EQ(frame_error([&] { open_frame(o, f3); }, kind),
            "dropped or reordered: frame 1 expected, 3 arrived");
}

TEST_P(AeadTest, SwappedFramesAreNamed) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener o(p.acceptor);
  const Frame f0 = seal_frame(s, pattern(10, 0)), f1 = seal_frame(s, pattern(10, 1));
  try {
    open_frame(o, f1);
    ADD_FAILURE() << "frame 1 opened first";
  } catch (const FrameError& e) {
    EXPECT_EQ(e.kind(), FrameError::Kind::dropped_or_reordered);
    EXPECT_EQ(e.expected(), 0u);
    EXPECT_EQ(e.arrived(), 1u);
    EXPECT_STREQ(e.what(), "dropped or reordered: frame 0 expected, 1 arrived");
  }
}

// A relay that rewrites a later frame's header to carry the expected number gets past the count,
// not the tag: the number is in the nonce.
TEST_P(AeadTest, RenumberedFrameIsAltered) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener o(p.acceptor);
  seal_frame(s, pattern(10, 0));
  Frame f1 = seal_frame(s, pattern(10, 1));
  f1.seq = 0;
  EXPECT_EQ(frame_error([&] { open_frame(o, f1); }, FrameError::Kind::altered)
                .rfind("altered: frame 0", 0),
            0u);
}

TEST_P(AeadTest, MovedSealerAndOpenerGoOn) {
  const Pair p = psk_pair(GetParam());
  Sealer s(p.connector);
  Opener o(p.acceptor);
  open_frame(o, seal_frame(s, pattern(10, 0)));
  Sealer s2 = std::move(s);
  Opener o2 = std::move(o);
  const Frame f = seal_frame(s2, pattern(10, 1));
  EXPECT_EQ(f.seq, 1u);
  open_frame(o2, f);
  EXPECT_EQ(o2.expected_sequence(), 2u);
}

// Single-core throughput of seal and open, in place, for the frame sizes the links use: printed
// for aead.cc's table, never asserted (a loaded machine must not fail a unit test).
TEST(AeadSpeed, SealAndOpenThroughput) {
  using Clock = std::chrono::steady_clock;
  std::printf("%-18s %8s %10s %10s\n", "cipher", "frame", "seal GB/s", "open GB/s");
  for (Cipher c : {Cipher::aes_256_gcm, Cipher::chacha20_poly1305}) {
    for (size_t size : {size_t{64} << 10, size_t{1} << 20, size_t{4} << 20}) {
      const Pair p = psk_pair(c);
      Sealer s(p.connector);
      Opener o(p.acceptor);
      const std::vector<uint8_t> plain = pattern(size, 5);
      std::vector<uint8_t> buf = plain;
      const std::vector<uint8_t> header(16, 1);
      const size_t frames = std::max<size_t>(4, (size_t{48} << 20) / size);  // 48 MiB a round
      double best_seal = 0, best_open = 0;
      for (int round = 0; round < 3; ++round) {
        // Each frame sealed then opened in the same buffer, which opening leaves as it was: the
        // cipher's cost on data in cache, as a link's staged segment is.
        Clock::duration seal_t{}, open_t{};
        for (size_t i = 0; i < frames; ++i) {
          Tag tag{};
          const auto t0 = Clock::now();
          const uint64_t seq = s.seal(header, buf, tag);
          const auto t1 = Clock::now();
          o.open(seq, header, buf, tag);
          open_t += Clock::now() - t1;
          seal_t += t1 - t0;
        }
        const double bytes = static_cast<double>(frames * size);
        best_seal = std::max(best_seal, bytes / std::chrono::duration<double>(seal_t).count());
        best_open = std::max(best_open, bytes / std::chrono::duration<double>(open_t).count());
      }
      EXPECT_EQ(buf, plain);
      std::printf("%-18s %4zu KiB %10.2f %10.2f\n", cipher_name(c), size >> 10, best_seal / 1e9,
                  best_open / 1e9);
    }
  }
}

}  // namespace
