// The encrypted record layer of TCP data connections (transport/tcp/secure_channel.h): what goes
// in comes out, in any pieces; and a man in the middle that alters, replays, drops or reorders a
// record is caught, said as what it did, and never delivers the record's bytes.
#include "transport/tcp/secure_channel.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/fd.h"

namespace ringreduce::transport::tcp {
namespace {

using core::aead::FrameError;

struct Pair {
  core::Fd a, b;
  Pair() {
    int fds[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, fds), 0);
    a.reset(fds[0]);
    b.reset(fds[1]);
  }
};

core::aead::SessionKeys keys(core::aead::Side side, const std::string& token = "secret") {
  core::auth::Nonce c{}, s{};
  c[0] = 1;
  s[0] = 2;
  const uint8_t ctx[] = {'t', 'e', 's', 't'};
  return core::aead::derive_keys(token, "ringreduce test", ctx, c, s, side);
}

std::vector<uint8_t> pattern(size_t n, uint8_t seed) {
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 131 + seed);
  return v;
}

// Sends all of `data` through `tx` on fd (the socket pair's buffer is drained by `pump`).
void send_all(SecureChannel& tx, int fd, const std::vector<uint8_t>& data,
              const std::function<void()>& pump) {
  size_t sent = 0;
  for (int spins = 0; sent < data.size() && spins < 100000; ++spins) {
    iovec iov{const_cast<uint8_t*>(data.data()) + sent, data.size() - sent};
    const ssize_t w = tx.send(fd, &iov, 1);
    if (w > 0) sent += static_cast<size_t>(w);
    pump();
  }
  for (int spins = 0; tx.pending() && spins < 100000; ++spins) {
    tx.flush(fd);
    pump();
  }
  ASSERT_EQ(sent, data.size());
  ASSERT_FALSE(tx.pending());
}

TEST(SecureChannel, WhatGoesInComesOutInAnyPieces) {
  Pair p;
  SecureChannel tx(keys(core::aead::Side::connector)), rx(keys(core::aead::Side::acceptor));
  const auto data = pattern((3 << 20) + 17, 7);
  std::vector<uint8_t> got;
  std::vector<uint8_t> room(SecureChannel::kRecordBytes);
  auto pump = [&] {
    for (;;) {
      const ssize_t r = rx.recv(p.b.get(), room.data(), room.size());
      if (r <= 0) break;
      got.insert(got.end(), room.begin(), room.begin() + r);
    }
  };
  send_all(tx, p.a.get(), data, pump);
  pump();
  EXPECT_EQ(got, data);
  // Too little room for the next record: nothing is taken until there is.
  std::vector<uint8_t> more = pattern(1000, 3);
  send_all(tx, p.a.get(), more, [] {});
  uint8_t small[10];
  EXPECT_EQ(rx.recv(p.b.get(), small, sizeof small), -1);
  EXPECT_EQ(errno, EAGAIN);
  EXPECT_EQ(rx.next_record_bytes(), 1000u);
  EXPECT_EQ(rx.recv(p.b.get(), room.data(), room.size()), 1000);
  EXPECT_EQ(std::memcmp(room.data(), more.data(), 1000), 0);
}

// The records one send of `data` makes, as the wire carries them.
std::vector<std::vector<uint8_t>> records_of(const std::vector<uint8_t>& data) {
  Pair p;
  SecureChannel tx(keys(core::aead::Side::connector));
  std::vector<uint8_t> wire;
  auto pump = [&] {
    uint8_t buf[1 << 16];
    ssize_t r;
    while ((r = ::recv(p.b.get(), buf, sizeof buf, MSG_DONTWAIT)) > 0)
      wire.insert(wire.end(), buf, buf + r);
  };
  send_all(tx, p.a.get(), data, pump);
  pump();
  std::vector<std::vector<uint8_t>> out;
  for (size_t at = 0; at < wire.size();) {
    RecordHeader h;
    std::memcpy(&h, wire.data() + at, sizeof h);
    const size_t n = SecureChannel::kOverhead + h.bytes;
    out.emplace_back(wire.begin() + long(at), wire.begin() + long(at + n));
    at += n;
  }
  return out;
}

// Feeds the records to a receiver as a relay would pass them on; returns the error it raised (or
// "" after delivering everything) and the bytes it delivered.
std::string receive(const std::vector<std::vector<uint8_t>>& records, std::vector<uint8_t>* got,
                    FrameError::Kind* kind = nullptr, const std::string& token = "secret") {
  Pair p;
  SecureChannel rx(keys(core::aead::Side::acceptor, token));
  std::vector<uint8_t> room(SecureChannel::kRecordBytes);
  try {
    for (const auto& r : records) {
      EXPECT_EQ(::send(p.a.get(), r.data(), r.size(), 0), ssize_t(r.size()));
      for (;;) {
        const ssize_t n = rx.recv(p.b.get(), room.data(), room.size());
        if (n <= 0) break;
        got->insert(got->end(), room.begin(), room.begin() + n);
      }
    }
  } catch (const FrameError& e) {
    if (kind) *kind = e.kind();
    return e.what();
  }
  return "";
}

TEST(SecureChannel, RelayTamperingIsCaughtAndNamed) {
  const auto data = pattern(5 * SecureChannel::kRecordBytes, 11);
  const auto recs = records_of(data);
  ASSERT_EQ(recs.size(), 5u);
  {  // untouched: delivered whole
    std::vector<uint8_t> got;
    EXPECT_EQ(receive(recs, &got), "");
    EXPECT_EQ(got, data);
  }
  struct Case {
    const char* name;
    std::function<void(std::vector<std::vector<uint8_t>>&)> tamper;
    FrameError::Kind kind;
    const char* says;
    size_t delivered_records;  // before the bad one
  };
  const Case cases[] = {
      {"bit flipped in the ciphertext", [](auto& r) { r[2][100] ^= 0x10; },
       FrameError::Kind::altered, "altered", 2},
      {"bit flipped in the tag", [](auto& r) { r[1].back() ^= 1; }, FrameError::Kind::altered,
       "altered", 1},
      {"sequence number changed", [](auto& r) { r[3][8] ^= 4; },
       FrameError::Kind::dropped_or_reordered, "", 3},
      {"record replayed", [](auto& r) { r.insert(r.begin() + 2, r[1]); },
       FrameError::Kind::replayed, "replayed", 2},
      {"record dropped", [](auto& r) { r.erase(r.begin() + 1); },
       FrameError::Kind::dropped_or_reordered, "", 1},
      {"two records swapped", [](auto& r) { std::swap(r[2], r[3]); },
       FrameError::Kind::dropped_or_reordered, "", 2},
  };
  for (const Case& c : cases) {
    auto r = recs;
    c.tamper(r);
    std::vector<uint8_t> got;
    FrameError::Kind kind{};
    const std::string what = receive(r, &got, &kind);
    EXPECT_FALSE(what.empty()) << c.name << ": delivered";
    EXPECT_EQ(int(kind), int(c.kind)) << c.name << ": " << what;
    EXPECT_NE(what.find(c.says), std::string::npos) << c.name << ": " << what;
    // What came before the bad record, and nothing of it or after.
    EXPECT_EQ(got.size(), c.delivered_records * SecureChannel::kRecordBytes) << c.name;
    EXPECT_TRUE(std::equal(got.begin(), got.end(), data.begin())) << c.name;
  }
  // Another token: nothing opens.
  std::vector<uint8_t> got;
  FrameError::Kind kind{};
  EXPECT_FALSE(receive(recs, &got, &kind, "another").empty());
  EXPECT_EQ(int(kind), int(FrameError::Kind::altered));
  EXPECT_TRUE(got.empty());
}

// A peer that sends plaintext (no encryption) is refused on its first bytes, not read as data.
TEST(SecureChannel, PlaintextPeerRefused) {
  Pair p;
  SecureChannel rx(keys(core::aead::Side::acceptor));
  const std::string hello(64, 'x');
  ASSERT_EQ(::send(p.a.get(), hello.data(), hello.size(), 0), ssize_t(hello.size()));
  uint8_t room[SecureChannel::kRecordBytes];
  EXPECT_THROW(rx.recv(p.b.get(), room, sizeof room), FrameError);
}

}  // namespace
}  // namespace ringreduce::transport::tcp
