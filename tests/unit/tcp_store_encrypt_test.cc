// The TCP store's encrypted connections (RINGREDUCE_ENCRYPT=psk and tls, issue 45): every request
// and response travels in sealed records (rendezvous/store_records.h) after the hello; what a
// relay on the way sees holds none of the values; a record altered or replayed on the way is
// named and never used; modes that differ, and certificates refused either way, are said at
// once, not after a timeout.
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>

#include <atomic>
#include <functional>

#include "../test_certs.h"
#include "store_test_util.h"

namespace ringreduce::rendezvous {
namespace {

using namespace store_testing;
using rrtest::TestCerts;

constexpr const char* kToken = "the store's token";

core::Security psk() {
  return core::Security{kToken, core::Encrypt::psk, {}};
}
core::Security tls(const std::string& leaf) {
  return core::Security{
      "",
      core::Encrypt::tls,
      {TestCerts::path(leaf + ".key"), TestCerts::path(leaf + ".crt"), TestCerts::path("ca.crt")}};
}

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// Every op through the store, with a value of several records (3 MiB) whose bytes are checked.
void every_op(Store& store) {
  std::vector<uint8_t> big(size_t{3} << 20);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i * 7 + (i >> 13));
  store.set("big", big);
  EXPECT_EQ(store.get("big", 2s), big);
  store.set("small", bytes("a secret value"));
  EXPECT_EQ(store.get("small", 2s), bytes("a secret value"));
  EXPECT_EQ(store.add("counter", 5), 5);
  EXPECT_EQ(store.add("counter", -2), 3);
  store.wait({"big", "small"}, 2s);
  EXPECT_TRUE(store.check({"big", "counter"}));
  EXPECT_FALSE(store.check({"missing"}));
  EXPECT_EQ(store.get_unless("missing", "small", 2s), std::nullopt);
  EXPECT_THROW(store.get("missing", 100ms), TimeoutError);
  EXPECT_EQ(store.get("small", 2s), bytes("a secret value"));  // in step after the timeout
}

// A relay between a client and the store that passes bytes both ways and, past `skip` bytes of
// hello in one direction, reads that direction as records (12-byte header: plaintext length u32,
// sequence u64; ciphertext; 16-byte tag) and alters, replays or only records record `k`. What
// passed each way is kept, to show that none of it is plaintext.
class Relay {
 public:
  enum class Mode { pass, flip, replay };
  Relay(int server_port, bool to_client, size_t skip, size_t k, Mode mode)
      : server_port_(server_port), to_client_(to_client), skip_(skip), k_(k), mode_(mode) {
    listen_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (::bind(listen_.get(), reinterpret_cast<sockaddr*>(&a), len) != 0 ||
        ::listen(listen_.get(), 8) != 0 ||
        ::getsockname(listen_.get(), reinterpret_cast<sockaddr*>(&a), &len) != 0)
      throw std::runtime_error("relay: cannot listen");
    port_ = ntohs(a.sin_port);
    thread_ = std::jthread([this] { run(); });
  }
  int port() const { return port_; }
  bool tampered() const { return tampered_; }
  // Waits until both directions have ended (the client closed its end); bounded by the sockets'
  // 10 s receive timeouts.
  void join() { thread_.join(); }
  // What passed toward the client and toward the server (after join()).
  const std::vector<uint8_t>& seen(bool to_client) const { return to_client ? down_ : up_; }

 private:
  void run() {
    // Only the first connection (the client's pooled one) is relayed; bounded by 10 s.
    pollfd p{listen_.get(), POLLIN, 0};
    if (::poll(&p, 1, 10000) <= 0) return;
    client_.reset(::accept4(listen_.get(), nullptr, nullptr, SOCK_CLOEXEC));
    server_.reset(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(server_port_));
    if (!client_.valid() ||
        ::connect(server_.get(), reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
      return;
    for (auto* fd : {&client_, &server_}) {
      timeval tv{10, 0};
      ::setsockopt(fd->get(), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    }
    std::jthread up([this] { pump(server_.get(), client_.get(), false); });
    pump(client_.get(), server_.get(), true);
  }

  // Bytes from `from` to `to` until either ends (or 10 s pass without any).
  void pump(int to, int from, bool to_client) {
    std::vector<uint8_t>& seen = to_client ? down_ : up_;
    const bool tamper = to_client == to_client_ && mode_ != Mode::pass;
    std::vector<uint8_t> pending;  // this direction's bytes not yet passed on (tamper only)
    size_t record = 0;
    uint8_t buf[65536];
    // Bounded: it ends when either side closes, or after 10 s without a byte.
    for (;;) {
      const ssize_t n = ::recv(from, buf, sizeof buf, 0);
      if (n <= 0) break;
      seen.insert(seen.end(), buf, buf + n);
      if (!tamper) {
        if (!send_all(to, buf, static_cast<size_t>(n))) break;
        continue;
      }
      pending.insert(pending.end(), buf, buf + n);
      // The hello passes as it is; then whole records, one at a time.
      size_t hello = std::min(pending.size(), skip_ - std::min(skip_, passed_));
      if (hello > 0 && !send_all(to, pending.data(), hello)) break;
      passed_ += hello;
      pending.erase(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(hello));
      while (passed_ >= skip_ && pending.size() >= 12) {
        const size_t bytes = 12 + wire::load32(pending.data()) + 16;
        if (pending.size() < bytes) break;
        std::vector<uint8_t> r(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(bytes));
        pending.erase(pending.begin(), pending.begin() + static_cast<ptrdiff_t>(bytes));
        if (record++ == k_) {
          tampered_ = true;
          if (mode_ == Mode::flip) r[12 + (bytes - 28) / 2] ^= 0x10;
          if (mode_ == Mode::replay && !send_all(to, r.data(), r.size())) return;
        }
        if (!send_all(to, r.data(), r.size())) return;
      }
    }
    ::shutdown(to, SHUT_WR);
  }

  static bool send_all(int fd, const uint8_t* p, size_t n) {
    while (n > 0) {
      const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
      if (w <= 0) return false;
      p += w;
      n -= static_cast<size_t>(w);
    }
    return true;
  }

  const int server_port_;
  const bool to_client_;
  const size_t skip_, k_;
  const Mode mode_;
  core::Fd listen_, client_, server_;
  int port_ = 0;
  size_t passed_ = 0;
  std::atomic<bool> tampered_{false};
  std::vector<uint8_t> down_, up_;
  std::jthread thread_;  // last: joined before the rest goes
};

// The plaintext that precedes the records with psk: toward the server, the hello with its nonce
// (12 + 32) and the proof (32); toward the client, the hello with its challenge (12 + 65) and the
// verdict (1).
constexpr size_t kPskHelloUp = 12 + 32 + 32;
constexpr size_t kPskHelloDown = 12 + 65 + 1;

bool holds(const std::vector<uint8_t>& stream, const std::string& text) {
  return std::search(stream.begin(), stream.end(), text.begin(), text.end()) != stream.end();
}

TEST(TcpStoreEncrypt, PskEveryOpExact) {
  TcpStoreServer server("127.0.0.1", 0, psk());
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s, psk());
  every_op(*store);
}

TEST(TcpStoreEncrypt, PskRelayedStreamHoldsNoValueNorKey) {
  TcpStoreServer server("127.0.0.1", 0, psk());
  Relay relay(server.port(), true, 0, 0, Relay::Mode::pass);
  auto store = connect_tcp_store("127.0.0.1", relay.port(), 5s, psk());
  store->set("a key in the clear?", bytes("a secret value"));
  EXPECT_EQ(store->get("a key in the clear?", 2s), bytes("a secret value"));
  store.reset();  // the client closes: the relay's two directions end
  relay.join();
  for (bool down : {true, false}) {
    EXPECT_FALSE(holds(relay.seen(down), "a secret value")) << (down ? "toward the client" : "up");
    EXPECT_FALSE(holds(relay.seen(down), "a key in the clear?"));
    EXPECT_FALSE(holds(relay.seen(down), kToken));
  }
  EXPECT_GT(relay.seen(false).size(), kPskHelloUp + 2 * 12);
}

class TcpStoreTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!TestCerts::have_openssl()) return;
    ASSERT_TRUE(TestCerts::make());
  }
  static void TearDownTestSuite() { TestCerts::remove(); }
  void SetUp() override {
    if (!TestCerts::have_openssl()) GTEST_SKIP() << "needs the openssl CLI to make certificates";
  }
};

TEST_F(TcpStoreTls, EveryOpExactAndNothingInTheClear) {
  TcpStoreServer server("127.0.0.1", 0, tls("server"));
  Relay relay(server.port(), true, 0, 0, Relay::Mode::pass);
  auto store = connect_tcp_store("127.0.0.1", relay.port(), 5s, tls("client"));
  every_op(*store);
  store->set("a key in the clear?", bytes("a secret value"));
  store.reset();
  relay.join();
  for (bool down : {true, false}) {
    EXPECT_FALSE(holds(relay.seen(down), "a secret value"));
    EXPECT_FALSE(holds(relay.seen(down), "a key in the clear?"));
  }
  // A second client, and several connections of one client (the pool), each its own handshake.
  auto a = connect_tcp_store("127.0.0.1", server.port(), 5s, tls("rank"));
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] { a->set("t" + std::to_string(t), bytes("v")); });
  for (auto& t : threads) t.join();
  EXPECT_TRUE(a->check({"t0", "t1", "t2", "t3"}));
}

TEST_F(TcpStoreTls, UntrustedOrExpiredCertificatesAreRefusedAtOnceBothWays) {
  TcpStoreServer server("127.0.0.1", 0, tls("server"));
  for (const char* leaf : {"stranger", "expired"}) {
    const auto t0 = Clock::now();
    try {
      connect_tcp_store("127.0.0.1", server.port(), 10s, tls(leaf));
      ADD_FAILURE() << leaf << ": connected";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << leaf << ": a timeout, not a refusal: " << e.what();
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), "RINGREDUCE_ENCRYPT=tls: TLS handshake failed")) << e.what();
    }
    EXPECT_LT(seconds_since(t0), 5.0) << leaf;
  }
  // The server's certificate is checked too.
  TcpStoreServer expired("127.0.0.1", 0, tls("expired"));
  try {
    connect_tcp_store("127.0.0.1", expired.port(), 10s, tls("client"));
    ADD_FAILURE() << "connected to a server with an expired certificate";
  } catch (const TimeoutError& e) {
    ADD_FAILURE() << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "expired")) << e.what();
  }
  // A client of the good server still works after the refusals.
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s, tls("client"));
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 2s), bytes("v"));
}

// A TLS hello as a client sends it, by hand.
std::vector<uint8_t> tls_hello() {
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::tls_aes);
  return h;
}

TEST_F(TcpStoreTls, BytesAfterTheHelloAreNeverServedUnsealed) {
  // Someone on the path appends a plaintext request to a client's TLS hello, hoping it is served
  // once the real client's handshake succeeds.
  TcpStoreServer server("127.0.0.1", 0, tls("server"));
  ::testing::internal::CaptureStderr();
  RawClient raw("127.0.0.1", server.port());
  std::vector<uint8_t> msg = tls_hello();
  std::vector<uint8_t> set;
  wire::Writer w(&set);
  w.str("injected");
  w.str("evil");
  const std::vector<uint8_t> f = frame(wire::Op::set, set);
  msg.insert(msg.end(), f.begin(), f.end());
  raw.send(msg);
  EXPECT_TRUE(raw.closed_by_server(5s));
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "bytes after its TLS hello, before the server's answer")) << log;
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s, tls("client"));
  EXPECT_FALSE(store->check({"injected"}));
}

TEST_F(TcpStoreTls, SilentStrangersHoldNoHandshakeThread) {
  // Forty connections that say a TLS hello and then nothing: more than the store has handshake
  // threads. A rank's client still gets through at once.
  TcpStoreServer server("127.0.0.1", 0, tls("server"));
  std::vector<std::unique_ptr<RawClient>> strangers;
  for (int i = 0; i < 40; ++i) {
    strangers.push_back(std::make_unique<RawClient>("127.0.0.1", server.port()));
    strangers.back()->send(tls_hello());
  }
  const auto t0 = Clock::now();
  auto store = connect_tcp_store("127.0.0.1", server.port(), 5s, tls("client"));
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 2s), bytes("v"));
  EXPECT_LT(seconds_since(t0), 2.0);
}

TEST_F(TcpStoreTls, ModesThatDifferAreSaidOnTheClient) {
  struct Case {
    core::Security server, client;
    const char* says;
  };
  const Case cases[] = {
      {psk(), core::Security{kToken, core::Encrypt::off, {}},
       "RINGREDUCE_ENCRYPT=psk and this process's off"},
      {core::Security{kToken, core::Encrypt::off, {}}, psk(),
       "RINGREDUCE_ENCRYPT=off and this process's psk"},
      {tls("server"), psk(), "RINGREDUCE_ENCRYPT=tls and this process's psk"},
      {core::Security{}, tls("client"), "RINGREDUCE_ENCRYPT=off and this process's tls"},
  };
  for (const auto& c : cases) {
    TcpStoreServer server("127.0.0.1", 0, c.server);
    const auto t0 = Clock::now();
    try {
      connect_tcp_store("127.0.0.1", server.port(), 10s, c.client);
      ADD_FAILURE() << c.says << ": connected";
    } catch (const TimeoutError& e) {
      ADD_FAILURE() << e.what();
    } catch (const Error& e) {
      EXPECT_TRUE(contains(e.what(), c.says)) << e.what();
    }
    EXPECT_LT(seconds_since(t0), 5.0);
  }
}

TEST(TcpStoreEncrypt, RecordAlteredTowardTheClientIsNamedNotUsed) {
  TcpStoreServer server("127.0.0.1", 0, psk());
  Relay relay(server.port(), true, kPskHelloDown, 0, Relay::Mode::flip);
  auto store = connect_tcp_store("127.0.0.1", relay.port(), 5s, psk());
  try {
    store->set("k", bytes("v"));
    ADD_FAILURE() << "an altered response was taken";
  } catch (const PeerError& e) {
    EXPECT_TRUE(contains(e.what(), "set response failed its integrity check (RINGREDUCE_ENCRYPT)"))
        << e.what();
    EXPECT_TRUE(contains(e.what(), "altered")) << e.what();
  }
  EXPECT_TRUE(relay.tampered());
}

TEST(TcpStoreEncrypt, RecordReplayedTowardTheClientIsNamedNotUsed) {
  TcpStoreServer server("127.0.0.1", 0, psk());
  Relay relay(server.port(), true, kPskHelloDown, 0, Relay::Mode::replay);
  auto store = connect_tcp_store("127.0.0.1", relay.port(), 5s, psk());
  store->set("k", bytes("v"));  // its response arrives twice: the copy waits for the next request
  try {
    store->get("k", 2s);
    ADD_FAILURE() << "a replayed response was taken";
  } catch (const PeerError& e) {
    EXPECT_TRUE(contains(e.what(), "get response failed its integrity check")) << e.what();
    EXPECT_TRUE(contains(e.what(), "replayed")) << e.what();
  }
}

TEST(TcpStoreEncrypt, RecordAlteredTowardTheServerDropsTheClientSayingWhy) {
  TcpStoreServer server("127.0.0.1", 0, psk());
  Relay relay(server.port(), false, kPskHelloUp, 0, Relay::Mode::flip);
  auto store = connect_tcp_store("127.0.0.1", relay.port(), 5s, psk());
  ::testing::internal::CaptureStderr();
  EXPECT_THROW(store->set("k", bytes("v")), PeerError);
  std::this_thread::sleep_for(100ms);
  const std::string log = ::testing::internal::GetCapturedStderr();
  EXPECT_TRUE(contains(log, "a sealed record failed its check (RINGREDUCE_ENCRYPT)")) << log;
  EXPECT_TRUE(contains(log, "altered")) << log;
  // Nothing of the altered request was stored.
  auto direct = connect_tcp_store("127.0.0.1", server.port(), 5s, psk());
  EXPECT_FALSE(direct->check({"k"}));
}

}  // namespace
}  // namespace ringreduce::rendezvous
