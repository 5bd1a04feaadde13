// The TLS 1.3 certificate mode's key agreement (core/tls_keys.h): two sides with certificates from
// one CA agree on the same keying material and leave the socket clean for their own frames; an
// untrusted, expired or missing certificate, a peer that speaks no TLS, one that closes and one
// that never answers are each refused in words that say which, within the deadline. Certificates
// are made per test process with the openssl CLI in a temporary directory, removed afterwards.
#include "core/tls_keys.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "../test_certs.h"
#include "core/fd.h"

namespace {

using namespace std::chrono_literals;
using ringreduce::core::Deadline;
using ringreduce::core::Fd;
namespace aead = ringreduce::core::aead;
namespace tls = ringreduce::core::tls;
using Reason = tls::TlsError::Reason;

using rrtest::kOpenssl;
using rrtest::TestCerts;

class TlsKeysTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ok_ = TestCerts::make(); }
  static void TearDownTestSuite() { TestCerts::remove(); }

  void SetUp() override {
    if (!TestCerts::have_openssl()) GTEST_SKIP() << kOpenssl << " is missing: no certificates";
    ASSERT_TRUE(ok_) << "making the test certificates failed (see the openssl output above)";
  }

  static bool openssl(const std::string& args) { return TestCerts::openssl(args); }
  static std::string path(const std::string& f) { return TestCerts::path(f); }
  // `name`'s key and certificate, trusting `ca`'s certificates.
  static tls::Files files(const std::string& name, const std::string& ca = "ca") {
    return {path(name + ".key"), path(name + ".crt"), path(ca + ".crt")};
  }

  static inline bool ok_ = false;
};

// One side's result.
struct Outcome {
  std::optional<tls::Secret> secret;
  std::string error;
  std::optional<Reason> reason;
  bool timed_out = false;
  double seconds = 0;
  std::string exchanged;  // exchange()'s result, where asked for
};

bool write_all(int fd, const std::vector<uint8_t>& b) {
  size_t off = 0;
  while (off < b.size()) {
    const ssize_t w = ::send(fd, b.data() + off, b.size() - off, MSG_NOSIGNAL);
    if (w <= 0) return false;
    off += static_cast<size_t>(w);
  }
  return true;
}

// `n` bytes, or none where the peer closed or 5 s passed first (bytes TLS swallowed never come).
std::vector<uint8_t> read_exactly(int fd, size_t n) {
  std::vector<uint8_t> b(n);
  size_t off = 0;
  const Deadline deadline = Deadline::after(5s);
  while (off < n) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, deadline.remaining_ms()) <= 0) break;
    const ssize_t r = ::recv(fd, b.data() + off, n - off, 0);
    if (r <= 0) break;
    off += static_cast<size_t>(r);
  }
  if (off < n) b.clear();
  return b;
}

// Right after its handshake, each side seals a frame to the other with keys derived from its
// Secret and sends it, then reads the other's and opens it: "" where that worked. The peer may
// still be reading our close_notify when our frame lands behind it, so this checks that TLS takes
// nothing of what follows it from the socket.
std::string exchange(int fd, const tls::Secret& secret, aead::Side side) {
  const std::vector<uint8_t> ctx = {7};
  const aead::SessionKeys keys =
      aead::derive_keys_from_secret(secret.bytes, "test data", ctx, side);
  aead::Sealer sealer(keys);
  aead::Opener opener(keys);
  const auto frame_of = [](aead::Side s) {
    return std::vector<uint8_t>{'f', 'r', 'o', 'm', ' ', static_cast<uint8_t>(s)};
  };
  std::vector<uint8_t> wire = frame_of(side);
  const size_t n = wire.size();
  aead::Tag tag{};
  const uint64_t seq = sealer.seal({}, wire, tag);
  wire.insert(wire.end(), tag.begin(), tag.end());
  if (!write_all(fd, wire)) return "send failed";
  std::vector<uint8_t> got = read_exactly(fd, wire.size());
  if (got.size() != wire.size()) return "the peer's frame did not arrive whole";
  aead::Tag got_tag{};
  std::memcpy(got_tag.data(), got.data() + n, aead::kTagBytes);
  const std::span<uint8_t> payload(got.data(), n);
  try {
    opener.open(seq, {}, payload, got_tag);
  } catch (const std::exception& e) {
    return e.what();
  }
  const aead::Side other =
      side == aead::Side::connector ? aead::Side::acceptor : aead::Side::connector;
  return std::vector<uint8_t>(payload.begin(), payload.end()) == frame_of(other)
             ? ""
             : "the peer's frame opened to something else";
}

Outcome run_side(const tls::Files& f, int fd, aead::Side side, std::string context,
                 std::chrono::milliseconds limit = 10s, bool then_exchange = false) {
  Outcome o;
  const auto t0 = std::chrono::steady_clock::now();
  try {
    tls::Context ctx(f);
    const std::vector<uint8_t> c(context.begin(), context.end());
    o.secret = ctx.handshake(fd, side, c, Deadline::after(limit));
    if (then_exchange) o.exchanged = exchange(fd, *o.secret, side);
  } catch (const tls::TlsError& e) {
    o.error = e.what();
    o.reason = e.reason();
  } catch (const ringreduce::TimeoutError& e) {
    o.error = e.what();
    o.timed_out = true;
  } catch (const std::exception& e) {
    o.error = e.what();
  }
  o.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (!o.error.empty())  // the words a user would see, in the test's log
    std::printf("  %s: %s\n", side == aead::Side::connector ? "client" : "server", o.error.c_str());
  return o;
}

std::pair<Fd, Fd> socket_pair() {
  int sv[2];
  EXPECT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
  return {Fd(sv[0]), Fd(sv[1])};
}

// Client and server at once, each in its own thread, on a connected pair; both sockets stay
// open until both sides are done, so that neither's failure hides the other's words.
std::pair<Outcome, Outcome> handshake_pair(const tls::Files& client, const tls::Files& server,
                                           int client_fd, int server_fd,
                                           const std::string& client_ctx = "ctx",
                                           const std::string& server_ctx = "ctx",
                                           bool then_exchange = false) {
  Outcome s;
  std::thread t([&] {
    s = run_side(server, server_fd, aead::Side::acceptor, server_ctx, 10s, then_exchange);
  });
  Outcome c = run_side(client, client_fd, aead::Side::connector, client_ctx, 10s, then_exchange);
  t.join();
  return {c, s};
}

TEST_F(TlsKeysTest, MutualHandshakeAgreesAndLeavesTheSocketToUs) {
  auto [a, b] = socket_pair();
  auto [c, s] =
      handshake_pair(files("client"), files("server"), a.get(), b.get(), "ctx", "ctx", true);
  ASSERT_TRUE(c.secret) << c.error;
  ASSERT_TRUE(s.secret) << s.error;
  EXPECT_EQ(c.secret->bytes, s.secret->bytes);
  EXPECT_NE(c.secret->bytes, tls::Secret().bytes);
  EXPECT_EQ(c.exchanged, "");
  EXPECT_EQ(s.exchanged, "");
}

TEST_F(TlsKeysTest, OverLoopbackTcpAndEachConnectionHasItsOwnKeys) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  std::vector<tls::Secret> secrets;
  for (int round = 0; round < 2; ++round) {
    Fd client(::socket(AF_INET, SOCK_STREAM, 0));
    ASSERT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    Fd server(::accept(listener.get(), nullptr, nullptr));
    ASSERT_TRUE(server.valid());
    auto [c, s] = handshake_pair(files("client"), files("server"), client.get(), server.get(),
                                 "ctx", "ctx", true);
    ASSERT_TRUE(c.secret) << c.error;
    ASSERT_TRUE(s.secret) << s.error;
    EXPECT_EQ(c.secret->bytes, s.secret->bytes);
    EXPECT_EQ(c.exchanged, "");
    EXPECT_EQ(s.exchanged, "");
    secrets.push_back(*c.secret);
  }
  EXPECT_NE(secrets[0].bytes, secrets[1].bytes);
}

// Carries bytes between two socket pairs: one way at once, the other in batches, each held 50 ms
// to gather whatever else follows it. The server's close_notify and the frame it sends right after
// its handshake then reach the client in one write: TLS must read the first and leave the second.
class BatchingRelay {
 public:
  BatchingRelay() {
    std::tie(client_, relay_c_) = socket_pair();
    std::tie(relay_s_, server_) = socket_pair();
    threads_.emplace_back([this] { pump(relay_c_.get(), relay_s_.get(), 0ms); });
    threads_.emplace_back([this] { pump(relay_s_.get(), relay_c_.get(), 50ms); });
  }
  ~BatchingRelay() {
    stop_ = true;
    for (auto& t : threads_) t.join();
  }
  int client() const { return client_.get(); }
  int server() const { return server_.get(); }

 private:
  void pump(int from, int to, std::chrono::milliseconds hold) {
    std::vector<uint8_t> buf(1 << 16);
    while (!stop_) {
      pollfd p{from, POLLIN, 0};
      if (::poll(&p, 1, 20) <= 0) continue;
      std::this_thread::sleep_for(hold);
      const ssize_t r = ::recv(from, buf.data(), buf.size(), MSG_DONTWAIT);
      if (r <= 0) return;
      if (!write_all(to, std::vector<uint8_t>(buf.begin(), buf.begin() + r))) return;
    }
  }

  Fd client_, relay_c_, relay_s_, server_;
  std::atomic<bool> stop_{false};
  std::vector<std::thread> threads_;
};

TEST_F(TlsKeysTest, DataRightBehindTheCloseNotifyIsLeftForUs) {
  BatchingRelay relay;
  auto [c, s] = handshake_pair(files("client"), files("server"), relay.client(), relay.server(),
                               "ctx", "ctx", true);
  ASSERT_TRUE(c.secret) << c.error;
  ASSERT_TRUE(s.secret) << s.error;
  EXPECT_EQ(c.exchanged, "");
  EXPECT_EQ(s.exchanged, "");
}

// The caller's context is bound into the export: two sides that disagree on the connection's
// parameters get different keys (their first frame would fail as "altered").
TEST_F(TlsKeysTest, ContextIsBoundIntoTheKeys) {
  auto [a, b] = socket_pair();
  auto [c, s] =
      handshake_pair(files("client"), files("server"), a.get(), b.get(), "rank 1", "rank 2");
  ASSERT_TRUE(c.secret && s.secret) << c.error << " / " << s.error;
  EXPECT_NE(c.secret->bytes, s.secret->bytes);
}

TEST_F(TlsKeysTest, ClientSignedByAnotherCaIsRefusedOnBothSides) {
  auto [a, b] = socket_pair();
  auto [c, s] = handshake_pair(files("stranger"), files("server"), a.get(), b.get());
  EXPECT_EQ(s.reason, Reason::untrusted) << s.error;
  EXPECT_NE(s.error.find("the peer's certificate is not trusted: unable to get local issuer "
                         "certificate (checked against the CA in " +
                         path("ca.crt") + ")"),
            std::string::npos)
      << s.error;
  // In TLS 1.3 the client has finished by then: it learns the refusal at the close.
  EXPECT_EQ(c.reason, Reason::refused_by_peer) << c.error;
  EXPECT_NE(c.error.find("the peer refused this side's certificate (its alert: unknown CA)"),
            std::string::npos)
      << c.error;
  EXPECT_FALSE(c.secret);
}

// Over TCP, with a server that closes as soon as it has refused: the client, which had finished
// its part, may lose the alert to the reset; it still fails, and says what most likely happened.
TEST_F(TlsKeysTest, RefusingServerThatClosesAtOnceStillFailsTheClient) {
  Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::listen(listener.get(), 1), 0);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
  Fd client(::socket(AF_INET, SOCK_STREAM, 0));
  ASSERT_EQ(::connect(client.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  Outcome s;
  std::thread t([&] {
    Fd server(::accept(listener.get(), nullptr, nullptr));
    s = run_side(files("server"), server.get(), aead::Side::acceptor, "ctx");
  });
  Outcome c = run_side(files("stranger"), client.get(), aead::Side::connector, "ctx");
  t.join();
  EXPECT_EQ(s.reason, Reason::untrusted) << s.error;
  EXPECT_FALSE(c.secret);
  EXPECT_TRUE(c.reason == Reason::refused_by_peer || c.reason == Reason::closed) << c.error;
  EXPECT_NE(c.error.find("this side's certificate"), std::string::npos) << c.error;
}

TEST_F(TlsKeysTest, ServerSignedByAnotherCaIsRefusedOnBothSides) {
  auto [a, b] = socket_pair();
  auto [c, s] = handshake_pair(files("client"), files("stranger"), a.get(), b.get());
  EXPECT_EQ(c.reason, Reason::untrusted) << c.error;
  EXPECT_NE(c.error.find("not trusted: unable to get local issuer certificate"), std::string::npos)
      << c.error;
  EXPECT_EQ(s.reason, Reason::refused_by_peer) << s.error;
  EXPECT_NE(s.error.find("unknown CA"), std::string::npos) << s.error;
}

TEST_F(TlsKeysTest, ExpiredCertificateIsRefused) {
  auto [a, b] = socket_pair();
  auto [c, s] = handshake_pair(files("expired"), files("server"), a.get(), b.get());
  EXPECT_EQ(s.reason, Reason::untrusted) << s.error;
  EXPECT_NE(s.error.find("the peer's certificate is not trusted: certificate has expired"),
            std::string::npos)
      << s.error;
  EXPECT_EQ(c.reason, Reason::refused_by_peer) << c.error;
  EXPECT_NE(c.error.find("certificate expired"), std::string::npos) << c.error;
}

// The openssl CLI as the client: without a certificate it is refused for it; with one, it exports
// the same keying material as our server (TLS 1.3's exporter, RFC 8446 7.5, with an empty
// context, which 1.3 does not tell from none): our keys are the standard exporter's.
TEST_F(TlsKeysTest, OpensslCliClientWithoutAndWithACertificate) {
  for (bool with_cert : {false, true}) {
    SCOPED_TRACE(with_cert);
    Fd listener(::socket(AF_INET, SOCK_STREAM, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::listen(listener.get(), 1), 0);
    socklen_t len = sizeof addr;
    ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&addr), &len), 0);
    const std::string log = path("s_client.log");
    const std::string cmd =
        std::string("timeout 20 ") + kOpenssl +
        " s_client -connect 127.0.0.1:" + std::to_string(ntohs(addr.sin_port)) +
        " -tls1_3 -CAfile " + path("ca.crt") +
        (with_cert ? " -cert " + path("client.crt") + " -key " + path("client.key")
                   : std::string()) +
        " -keymatexport '" + tls::kExporterLabel + "' -keymatexportlen 32 < /dev/null > " + log +
        " 2>&1";
    std::thread client([&] { (void)std::system(cmd.c_str()); });
    Fd server(::accept(listener.get(), nullptr, nullptr));
    Outcome s = run_side(files("server"), server.get(), aead::Side::acceptor, "");
    server.reset();
    client.join();
    std::stringstream out;
    out << std::ifstream(log).rdbuf();
    if (!with_cert) {
      EXPECT_EQ(s.reason, Reason::no_certificate) << s.error;
      EXPECT_NE(s.error.find("the peer presented no certificate"), std::string::npos) << s.error;
      continue;
    }
    ASSERT_TRUE(s.secret) << s.error << "\n" << out.str();
    std::string hex;
    for (uint8_t x : s.secret->bytes) {
      char h[3];
      std::snprintf(h, sizeof h, "%02X", x);
      hex += h;
    }
    EXPECT_NE(out.str().find("Keying material: " + hex), std::string::npos) << out.str();
  }
}

// Garbage from the peer, whichever side we are, and whether or not it looks like an SSLv2 hello
// (a high first bit, which a server would otherwise wait on for its "length" of bytes).
TEST_F(TlsKeysTest, PeerThatDoesNotSpeakTlsIsNamed) {
  const std::vector<std::vector<uint8_t>> garbage = {
      {'h', 'e', 'l', 'l', 'o', ',', ' ', 'I', ' ', 's', 'p', 'e', 'a', 'k', '\n'},
      {0xff, 0xff, 0x01, 0x03, 0x03, 0x00, 0x00}};
  for (aead::Side side : {aead::Side::acceptor, aead::Side::connector}) {
    for (const auto& g : garbage) {
      auto [ours, theirs] = socket_pair();
      write_all(theirs.get(), g);
      Outcome o = run_side(files(side == aead::Side::acceptor ? "server" : "client"), ours.get(),
                           side, "ctx", 5s);
      EXPECT_EQ(o.reason, Reason::not_tls) << o.error;
      EXPECT_NE(
          o.error.find("TLS handshake failed: the peer does not speak TLS (its first bytes: " +
                       std::string(g[0] == 'h' ? "68 65 6c" : "ff ff")),
          std::string::npos)
          << o.error;
      EXPECT_LT(o.seconds, 2.0);
    }
  }
}

TEST_F(TlsKeysTest, PeerThatNeverAnswersTimesOut) {
  for (aead::Side side : {aead::Side::acceptor, aead::Side::connector}) {
    auto [ours, theirs] = socket_pair();  // theirs stays open and silent
    Outcome o = run_side(files("server"), ours.get(), side, "ctx", 300ms);
    EXPECT_TRUE(o.timed_out) << o.error;
    EXPECT_NE(o.error.find("TLS handshake timed out after 0."), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("the peer sent nothing"), std::string::npos) << o.error;
    EXPECT_GE(o.seconds, 0.25);
    EXPECT_LT(o.seconds, 3.0);
  }
}

TEST_F(TlsKeysTest, PeerThatClosesIsNamed) {
  for (aead::Side side : {aead::Side::acceptor, aead::Side::connector}) {
    auto [ours, theirs] = socket_pair();
    theirs.reset();
    Outcome o = run_side(files("server"), ours.get(), side, "ctx", 5s);
    EXPECT_EQ(o.reason, Reason::closed) << o.error;
    EXPECT_NE(o.error.find("the peer closed the connection"), std::string::npos) << o.error;
  }
}

TEST_F(TlsKeysTest, UnusableFilesAreNamedAtOnce) {
  const auto refused = [](const tls::Files& f) -> std::string {
    try {
      tls::Context ctx(f);
    } catch (const tls::TlsError& e) {
      EXPECT_EQ(e.reason(), Reason::files);
      return e.what();
    }
    return "accepted";
  };
  tls::Files f = files("client");
  f.cert = path("no-such.crt");
  EXPECT_EQ(refused(f), "TLS: the certificate file " + path("no-such.crt") +
                            " (RINGREDUCE_TLS_CERT) cannot be read: No such file or directory");
  f = files("client");
  f.key = path("server.key");
  EXPECT_NE(
      refused(f).find("TLS: the private key in " + path("server.key") +
                      " (RINGREDUCE_TLS_KEY) is not the certificate's in " + path("client.crt")),
      std::string::npos);
  f = files("client");
  f.ca = path("openssl.cnf");
  EXPECT_NE(refused(f).find("TLS: the CA certificate file " + path("openssl.cnf") +
                            " (RINGREDUCE_TLS_CA) is not a usable PEM CA certificate"),
            std::string::npos);
  f = files("client");
  f.key.clear();
  EXPECT_EQ(refused(f), "TLS: no private key file given (RINGREDUCE_TLS_KEY)");
}

}  // namespace
