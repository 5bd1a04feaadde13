// The TCP store's token authentication (the mutual HMAC-SHA256 proof of tcp_store_wire.h), its
// handshake deadline, and TcpStoreProtocol, the server's state machine without sockets.
#include "store_test_util.h"

namespace ringreduce::rendezvous {
namespace {

using namespace store_testing;

// ---------------------------------------------------------------------------------------------
// Token authentication (RINGREDUCE_TOKEN): the mutual HMAC-SHA256 proof of tcp_store_wire.h.

constexpr const char* kToken = "the job's token";

// The client half of the token handshake, done by hand so that tests can break it on purpose.
struct RawChallenge {
  core::auth::Nonce server_nonce{};
  core::auth::Proof server_proof{};
};

// Sends an HMAC hello carrying `nonce`; the server's challenge, or nullopt if it sent none.
std::optional<RawChallenge> raw_auth_hello(RawClient& raw, const core::auth::Nonce& nonce) {
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                            nonce.size());
  raw.send(h);
  auto reply = raw.read(wire::kHelloBytes, 2s);
  if (!reply || wire::load16(reply->data() + 6) != 0 ||
      wire::load32(reply->data() + 8) != wire::kChallengeBytes)
    return std::nullopt;
  auto challenge = raw.read(wire::kChallengeBytes, 2s);
  if (!challenge) return std::nullopt;
  RawChallenge c;
  std::copy_n(challenge->begin(), c.server_nonce.size(), c.server_nonce.begin());
  std::copy_n(challenge->begin() + c.server_nonce.size(), c.server_proof.size(),
              c.server_proof.begin());
  return c;
}

core::auth::Proof client_proof(const std::string& token, const RawChallenge& c,
                               const core::auth::Nonce& client_nonce) {
  return core::auth::make_proof(token, wire::kClientProofLabel,
                                wire::auth_context(wire::kVersion, wire::Auth::hmac_sha256),
                                c.server_nonce, client_nonce);
}

std::vector<uint8_t> to_vector(const core::auth::Proof& p) {
  return std::vector<uint8_t>(p.begin(), p.end());
}

// Captures what the server logs (its warnings go to stderr) for the scope's duration.
class CapturedLog {
 public:
  CapturedLog() { ::testing::internal::CaptureStderr(); }
  ~CapturedLog() {
    if (!taken_) ::testing::internal::GetCapturedStderr();
  }
  CapturedLog(const CapturedLog&) = delete;
  CapturedLog& operator=(const CapturedLog&) = delete;
  std::string take() {
    taken_ = true;
    return ::testing::internal::GetCapturedStderr();
  }

 private:
  bool taken_ = false;
};

bool contains(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

class TcpStoreAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0, kToken);
    port_ = server_->port();
    store_ = connect_tcp_store("127.0.0.1", port_, 5s, kToken);
  }

  // A client with the right token keeps being served, and new ones still get in.
  void job_unharmed(const std::string& tag) {
    for (int i = 0; i < 20; ++i) {
      std::string key = tag + "/" + std::to_string(i);
      store_->set(key, bytes("v"));
      ASSERT_EQ(store_->get(key, 2s), bytes("v"));
    }
    auto fresh = connect_tcp_store("127.0.0.1", port_, 2s, kToken);
    fresh->set(tag + "/fresh", bytes("ok"));
    EXPECT_EQ(store_->get(tag + "/fresh", 1s), bytes("ok"));
  }

  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  std::shared_ptr<Store> store_;
};

TEST_F(TcpStoreAuthTest, RightTokenIsServed) {
  auto other = connect_tcp_store("127.0.0.1", port_, 5s, kToken);
  other->set("k", bytes("v"));
  EXPECT_EQ(store_->get("k", 1s), bytes("v"));
  EXPECT_EQ(other->add("n", 2), 2);
  job_unharmed("right");
}

TEST_F(TcpStoreAuthTest, WrongTokenFailsAtOnceAndIsLogged) {
  CapturedLog log;
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", port_, 5s, "another job's token");
    FAIL() << "a client with the wrong token got in";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once, not retry until the timeout: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "does not know this process's RINGREDUCE_TOKEN")) << e.what();
    EXPECT_TRUE(contains(e.what(), "127.0.0.1:" + std::to_string(port_))) << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
  job_unharmed("wrong");  // also gives the server time to see the client leave
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "closed the connection without proving it knows RINGREDUCE_TOKEN"))
      << text;
}

TEST_F(TcpStoreAuthTest, WrongProofIsDeniedDroppedAndLogged) {
  CapturedLog log;
  RawClient raw("127.0.0.1", port_);
  auto nonce = core::auth::random_nonce();
  auto challenge = raw_auth_hello(raw, nonce);
  ASSERT_TRUE(challenge);
  raw.send(to_vector(client_proof("a guess", *challenge, nonce)));
  auto verdict = raw.read(1, 2s);
  ASSERT_TRUE(verdict);
  EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::denied));
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("proof");
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "WARN")) << text;
  EXPECT_TRUE(contains(
      text, "dropping client " + raw.local_address() + ": its proof of RINGREDUCE_TOKEN is wrong"))
      << text;
}

TEST_F(TcpStoreAuthTest, RightProofByHandIsAccepted) {
  // The hand-made handshake the other tests break is the real one: done right, it is served.
  RawClient raw("127.0.0.1", port_);
  auto nonce = core::auth::random_nonce();
  auto challenge = raw_auth_hello(raw, nonce);
  ASSERT_TRUE(challenge);
  // The server proved it holds the token.
  EXPECT_TRUE(core::auth::proofs_equal(
      challenge->server_proof,
      core::auth::make_proof(kToken, wire::kServerProofLabel,
                             wire::auth_context(wire::kVersion, wire::Auth::hmac_sha256), nonce,
                             challenge->server_nonce)));
  auto msg = to_vector(client_proof(kToken, *challenge, nonce));
  auto req = set_request("by hand", "ok");
  msg.insert(msg.end(), req.begin(), req.end());
  raw.send(msg);
  auto verdict = raw.read(1 + wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(verdict);
  EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::ok));
  EXPECT_EQ((*verdict)[1], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(store_->get("by hand", 1s), bytes("ok"));
}

TEST_F(TcpStoreAuthTest, ReplayedOrReflectedProofIsRejected) {
  // A proof recorded from an earlier, successful connection...
  auto nonce = core::auth::random_nonce();
  core::auth::Proof recorded{};
  {
    RawClient first("127.0.0.1", port_);
    auto challenge = raw_auth_hello(first, nonce);
    ASSERT_TRUE(challenge);
    recorded = client_proof(kToken, *challenge, nonce);
    first.send(to_vector(recorded));
    auto verdict = first.read(1, 2s);
    ASSERT_TRUE(verdict);
    ASSERT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::ok));
  }
  // ... replayed with the same hello on a new one is worthless: the server's nonce is new.
  {
    RawClient replay("127.0.0.1", port_);
    auto challenge = raw_auth_hello(replay, nonce);
    ASSERT_TRUE(challenge);
    replay.send(to_vector(recorded));
    auto verdict = replay.read(1, 2s);
    ASSERT_TRUE(verdict);
    EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::denied));
    EXPECT_TRUE(replay.closed_by_server(2s));
  }
  // The server's own proof sent back as the client's is worthless too (the role labels differ).
  {
    RawClient reflect("127.0.0.1", port_);
    auto challenge = raw_auth_hello(reflect, nonce);
    ASSERT_TRUE(challenge);
    reflect.send(to_vector(challenge->server_proof));
    auto verdict = reflect.read(1, 2s);
    ASSERT_TRUE(verdict);
    EXPECT_EQ((*verdict)[0], static_cast<uint8_t>(wire::AuthStatus::denied));
    EXPECT_TRUE(reflect.closed_by_server(2s));
  }
  job_unharmed("replay");
}

TEST_F(TcpStoreAuthTest, ClientWithoutTokenIsToldToSetIt) {
  CapturedLog log;
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", port_, 5s);
    FAIL() << "a client without the token got in";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "the store requires a token and this process has none: set "
                         "RINGREDUCE_TOKEN"))
        << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
  // A raw client without a token gets the auth_required status, then the server closes.
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> h;
  wire::append_client_hello(&h);
  raw.send(h);
  auto reply = raw.read(wire::kHelloBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ(wire::load16(reply->data() + 6),
            static_cast<uint16_t>(wire::HelloStatus::auth_required));
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("none");
  std::string text = log.take();
  EXPECT_TRUE(contains(
      text, "refusing client " + raw.local_address() + ": it sent no proof of RINGREDUCE_TOKEN"))
      << text;
}

TEST(TcpStoreAuth, ClientWithTokenAgainstAStoreWithoutOne) {
  TcpStoreServer server("127.0.0.1", 0);
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", server.port(), 5s, kToken);
    FAIL() << "connected with a token to a store without one";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once: " << e.what();
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(),
                         "RINGREDUCE_TOKEN is set in this process, but the store was "
                         "started without one"))
        << e.what();
  }
  EXPECT_LT(seconds_since(start), 1.0);
  // Both without a token: served, exactly as before tokens existed.
  auto plain = connect_tcp_store("127.0.0.1", server.port(), 5s);
  plain->set("k", bytes("v"));
  EXPECT_EQ(plain->get("k", 1s), bytes("v"));
}

TEST(TcpStoreAuth, ClientNeverSendsItsProofToAStoreThatDidNotProveItself) {
  // An impostor answers the hello with a challenge whose proof is random bytes.
  core::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  std::atomic<size_t> received_after_hello{0};
  JoiningThread impostor([&] {
    core::Fd c(::accept(listener.get(), nullptr, nullptr));
    std::vector<uint8_t> hello(wire::kHelloBytes + core::auth::kNonceBytes);
    if (::recv(c.get(), hello.data(), hello.size(), MSG_WAITALL) != ssize_t(hello.size())) return;
    auto nonce = core::auth::random_nonce();
    auto fake = core::auth::random_nonce();
    std::vector<uint8_t> challenge(nonce.begin(), nonce.end());
    challenge.insert(challenge.end(), fake.begin(), fake.end());
    std::vector<uint8_t> reply;
    wire::append_server_hello(&reply, wire::HelloStatus::ok, challenge.data(), challenge.size());
    ssize_t ignored = ::send(c.get(), reply.data(), reply.size(), MSG_NOSIGNAL);
    (void)ignored;
    // Whatever the client sends now would be its proof; it must send nothing and close.
    uint8_t buf[64];
    pollfd p{c.get(), POLLIN, 0};
    while (::poll(&p, 1, 2000) > 0) {
      ssize_t n = ::recv(c.get(), buf, sizeof(buf), 0);
      if (n <= 0) break;
      received_after_hello += static_cast<size_t>(n);
    }
  });
  try {
    connect_tcp_store("127.0.0.1", ntohs(a.sin_port), 2s, kToken);
    FAIL() << "accepted a store that does not know the token";
  } catch (const Error& e) {
    EXPECT_TRUE(contains(e.what(), "does not know this process's RINGREDUCE_TOKEN")) << e.what();
  }
  impostor.join();
  EXPECT_EQ(received_after_hello.load(), 0u);
}

TEST_F(TcpStoreAuthTest, GarbageIsDroppedAndLogged) {
  CapturedLog log;
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> junk(300);
  std::mt19937 rng(11);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  junk[0] = 0x00;  // make sure the magic is wrong
  raw.send(junk);
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("garbage");
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "dropping client " + raw.local_address() + ": bad magic")) << text;
}

TEST_F(TcpStoreAuthTest, FloodBeforeTheProofIsDropped) {
  CapturedLog log;
  RawClient raw("127.0.0.1", port_);
  auto nonce = core::auth::random_nonce();
  ASSERT_TRUE(raw_auth_hello(raw, nonce));
  raw.send(std::vector<uint8_t>(64 * 1024, 0x55));  // far more than a proof
  EXPECT_TRUE(raw.closed_by_server(2s));
  job_unharmed("flood");
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "before proving it knows RINGREDUCE_TOKEN")) << text;
}

// With RINGREDUCE_TIMEOUT=1 the handshake deadline is one second instead of ten.
class TcpStoreDeadlineTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    token_ = GetParam() ? kToken : "";
    ScopedEnv timeout("RINGREDUCE_TIMEOUT", "1");
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0, token_);
    port_ = server_->port();
    store_ = connect_tcp_store("127.0.0.1", port_, 5s, token_);
  }
  std::string token_;
  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  std::shared_ptr<Store> store_;
};

TEST_P(TcpStoreDeadlineTest, HalfOpenConnectionIsDroppedAtTheDeadline) {
  CapturedLog log;
  RawClient silent("127.0.0.1", port_);  // connects and never sends a byte
  auto start = Clock::now();
  store_->set("during", bytes("ok"));
  EXPECT_TRUE(silent.closed_by_server(4s));
  double took = seconds_since(start);
  EXPECT_GE(took, 0.8);
  EXPECT_LT(took, 2.5);
  EXPECT_EQ(store_->get("during", 1s), bytes("ok"));
  std::string text = log.take();
  EXPECT_TRUE(contains(text, "dropping client " + silent.local_address() +
                                 ": sent nothing within 1000 ms of connecting (a half-open"))
      << text;
}

TEST_P(TcpStoreDeadlineTest, SlowTrickleIsDroppedAtTheDeadline) {
  CapturedLog log;
  RawClient trickle("127.0.0.1", port_);
  // A well-formed hello (with a nonce when the store has a token), one byte every 100 ms: bytes
  // keep moving, so no stall is ever seen, but the whole would take 1.2 s (4.4 s with a nonce).
  std::vector<uint8_t> hello;
  auto nonce = core::auth::random_nonce();
  if (token_.empty())
    wire::append_client_hello(&hello);
  else
    wire::append_client_hello(&hello, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                              nonce.size());
  std::atomic<bool> stop{false};
  auto start = Clock::now();
  JoiningThread sender([&] {
    for (size_t i = 0; i < hello.size() && !stop; ++i) {
      trickle.send({hello[i]});
      std::this_thread::sleep_for(100ms);
    }
  });
  // Others are served at full speed meanwhile.
  for (int i = 0; i < 20; ++i) store_->set("n" + std::to_string(i), bytes("v"));
  EXPECT_TRUE(trickle.closed_by_server(4s));
  double took = seconds_since(start);
  stop = true;
  sender.join();
  EXPECT_GE(took, 0.8);
  EXPECT_LT(took, 2.5);
  EXPECT_EQ(store_->get("n19", 1s), bytes("v"));
  std::string text = log.take();
  EXPECT_TRUE(
      contains(text, "dropping client " + trickle.local_address() + ": did not finish its hello"))
      << text;
  EXPECT_TRUE(contains(text, "a slow trickle")) << text;
}

TEST_P(TcpStoreDeadlineTest, AuthenticatedIdleClientsAreKeptPastTheDeadline) {
  std::this_thread::sleep_for(1500ms);
  store_->set("still", bytes("here"));
  EXPECT_EQ(store_->get("still", 1s), bytes("here"));
}

INSTANTIATE_TEST_SUITE_P(WithAndWithoutToken, TcpStoreDeadlineTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& info) {
                           return std::string(info.param ? "token" : "no_token");
                         });

// ---------------------------------------------------------------------------------------------
// TcpStoreProtocol: the server's state machine without sockets (what the fuzzer drives).

std::vector<uint8_t> hello_bytes() {
  std::vector<uint8_t> h;
  wire::append_client_hello(&h);
  return h;
}

TEST(TcpStoreProtocol, ServesRequestsLikeTheServer) {
  TcpStoreProtocol p;
  uint64_t a = p.connect();
  uint64_t b = p.connect();
  auto h = hello_bytes();
  ASSERT_TRUE(p.receive(a, h.data(), h.size()));
  ASSERT_TRUE(p.receive(b, h.data(), h.size()));
  EXPECT_EQ(p.take_output(a).size(), wire::kHelloBytes);
  EXPECT_EQ(p.take_output(b).size(), wire::kHelloBytes);
  // b parks in a get for a key that a sets later.
  std::vector<uint8_t> get_payload;
  wire::Writer w(&get_payload);
  w.u64(5000);
  w.str("k");
  auto get = frame(wire::Op::get, get_payload);
  ASSERT_TRUE(p.receive(b, get.data(), get.size()));
  EXPECT_TRUE(p.take_output(b).empty());
  auto set = set_request("k", "v");
  ASSERT_TRUE(p.receive(a, set.data(), set.size()));
  EXPECT_EQ(p.take_output(a).size(), wire::kFrameHeaderBytes);
  auto got = p.take_output(b);
  ASSERT_EQ(got.size(), wire::kFrameHeaderBytes + 4 + 1);
  EXPECT_EQ(got[0], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(got.back(), 'v');
  // A get that times out on the server's clock.
  std::vector<uint8_t> miss_payload;
  wire::Writer m(&miss_payload);
  m.u64(1000);
  m.str("missing");
  auto miss = frame(wire::Op::get, miss_payload);
  ASSERT_TRUE(p.receive(b, miss.data(), miss.size()));
  p.advance(999ms);
  EXPECT_TRUE(p.take_output(b).empty());
  p.advance(1ms);
  auto timeout = p.take_output(b);
  ASSERT_FALSE(timeout.empty());
  EXPECT_EQ(timeout[0], static_cast<uint8_t>(wire::Status::timeout));
}

TEST(TcpStoreProtocol, HandshakeDeadlineHoldsWhateverTrickles) {
  TcpStoreProtocol p(kToken);
  uint64_t trickle = p.connect();
  uint64_t silent = p.connect();
  auto nonce = core::auth::random_nonce();
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                            nonce.size());
  for (size_t i = 0; i + 1 < h.size() && i < 99; ++i) {
    ASSERT_TRUE(p.receive(trickle, &h[i], 1)) << "dropped after " << i * 100 << " ms";
    p.advance(100ms);  // 4.3 s for the hello's first 43 bytes
  }
  EXPECT_TRUE(p.is_open(trickle));
  EXPECT_TRUE(p.is_open(silent));
  p.advance(10000ms - 4300ms - 1ms);
  EXPECT_TRUE(p.is_open(trickle));
  p.advance(1ms);  // 10 s after accept
  EXPECT_FALSE(p.is_open(trickle));
  EXPECT_FALSE(p.is_open(silent));
}

TEST(TcpStoreProtocol, TokenHandshakeThenRequests) {
  TcpStoreProtocol p(kToken);
  uint64_t c = p.connect();
  auto nonce = core::auth::random_nonce();
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, wire::kVersion, wire::Auth::hmac_sha256, nonce.data(),
                            nonce.size());
  ASSERT_TRUE(p.receive(c, h.data(), h.size()));
  auto reply = p.take_output(c);
  ASSERT_EQ(reply.size(), wire::kHelloBytes + wire::kChallengeBytes);
  RawChallenge ch;
  std::copy_n(reply.begin() + wire::kHelloBytes, ch.server_nonce.size(), ch.server_nonce.begin());
  auto proof = to_vector(client_proof(kToken, ch, nonce));
  ASSERT_TRUE(p.receive(c, proof.data(), proof.size()));
  EXPECT_EQ(p.take_output(c), std::vector<uint8_t>{0});
  auto set = set_request("k", "v");
  ASSERT_TRUE(p.receive(c, set.data(), set.size()));
  EXPECT_EQ(p.take_output(c).size(), wire::kFrameHeaderBytes);
  p.advance(std::chrono::hours(1));  // an authenticated idle client is never dropped
  EXPECT_TRUE(p.is_open(c));
}

}  // namespace
}  // namespace ringreduce::rendezvous
