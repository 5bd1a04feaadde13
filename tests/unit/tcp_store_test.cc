// The TCP store server's robustness against broken and hostile clients (a raw socket plays
// them), and the client's connecting, limits and errors.
#include "store_test_util.h"

namespace ringreduce::rendezvous {
namespace {

using namespace store_testing;

// ---------------------------------------------------------------------------------------------
// TCP store: robustness. A raw socket plays the broken client.

class TcpStoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
    port_ = server_->port();
    store_ = connect_tcp_store("127.0.0.1", port_, 5s);
  }

  // The well-behaved client does a round of work; fails the test if anything goes wrong.
  void normal_client_works(const std::string& tag, int rounds = 20) {
    for (int i = 0; i < rounds; ++i) {
      std::string key = tag + "/" + std::to_string(i);
      store_->set(key, bytes("v" + std::to_string(i)));
      ASSERT_EQ(store_->get(key, 2s), bytes("v" + std::to_string(i)));
    }
    ASSERT_EQ(store_->add(tag + "/n", 1), 1);
  }

  // The server still accepts new clients.
  void server_still_accepts() {
    auto fresh = connect_tcp_store("127.0.0.1", port_, 2s);
    fresh->set("fresh", bytes("ok"));
    EXPECT_EQ(store_->get("fresh", 1s), bytes("ok"));
  }

  std::unique_ptr<TcpStoreServer> server_;
  int port_ = 0;
  std::shared_ptr<Store> store_;
};

TEST_F(TcpStoreTest, GarbageBytesAreDropped) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> junk(64);
  std::mt19937 rng(7);
  for (auto& b : junk) b = static_cast<uint8_t>(rng());
  junk[0] = 0x00;  // make sure the magic is wrong
  raw.send(junk);
  normal_client_works("garbage");
  EXPECT_TRUE(raw.closed_by_server(2s));
  server_still_accepts();
}

TEST_F(TcpStoreTest, WrongMagicIsDropped) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> h;
  wire::Writer w(&h);
  w.u32(0xdeadbeef);
  w.u16(wire::kVersion);
  w.u16(0);
  w.u32(0);
  raw.send(h);
  EXPECT_TRUE(raw.closed_by_server(2s));
  normal_client_works("magic");
  server_still_accepts();
}

TEST_F(TcpStoreTest, WrongVersionIsRefusedWithTheServersVersion) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> h;
  wire::append_client_hello(&h, /*version=*/99);
  raw.send(h);
  auto reply = raw.read(wire::kHelloBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ(wire::load32(reply->data()), wire::kMagic);
  EXPECT_EQ(wire::load16(reply->data() + 4), wire::kVersion);
  EXPECT_EQ(wire::load16(reply->data() + 6), static_cast<uint16_t>(wire::HelloStatus::bad_version));
  EXPECT_TRUE(raw.closed_by_server(2s));
  normal_client_works("version");
}

TEST_F(TcpStoreTest, OversizedFrameLengthIsDropped) {
  RawClient raw("127.0.0.1", port_);
  ASSERT_TRUE(raw.hello());
  // A set frame that claims almost 4 GiB: rejected from its header, before any buffering.
  raw.send({static_cast<uint8_t>(wire::Op::set), 0xff, 0xff, 0xff, 0xf0, 1, 2, 3});
  EXPECT_TRUE(raw.closed_by_server(2s));
  normal_client_works("oversized");
  server_still_accepts();
}

TEST_F(TcpStoreTest, OversizedLengthsInsideAFrameAreDropped) {
  {
    // A key length over the 4 KiB limit inside a frame whose own length is acceptable.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(5000);
    w.raw(std::string(5000, 'k').data(), 5000);
    w.u32(0);
    raw.send(frame(wire::Op::set, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // A key length larger than what the frame holds.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u64(0);
    w.u32(4000);
    w.raw("abc", 3);
    raw.send(frame(wire::Op::get, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // A key count over the limit.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(100000);
    raw.send(frame(wire::Op::check, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // Trailing bytes after a well-formed payload.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload;
    wire::Writer w(&payload);
    w.u32(0);
    w.u8(9);
    raw.send(frame(wire::Op::check, payload));
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  {
    // An unknown op.
    RawClient raw("127.0.0.1", port_);
    ASSERT_TRUE(raw.hello());
    raw.send({99, 0, 0, 0, 0});
    EXPECT_TRUE(raw.closed_by_server(2s));
  }
  normal_client_works("inner");
  server_still_accepts();
}

TEST_F(TcpStoreTest, SilentAndHalfSentClientsDoNotBlockOthers) {
  std::vector<std::unique_ptr<RawClient>> silent;
  for (int i = 0; i < 5; ++i) silent.push_back(std::make_unique<RawClient>("127.0.0.1", port_));
  // Half a hello.
  auto half_hello = std::make_unique<RawClient>("127.0.0.1", port_);
  half_hello->send({0x52, 0x52});
  // A complete hello, then half a request.
  auto half_request = std::make_unique<RawClient>("127.0.0.1", port_);
  ASSERT_TRUE(half_request->hello());
  auto req = set_request("half", "never completed");
  req.resize(req.size() / 2);
  half_request->send(req);

  auto start = Clock::now();
  normal_client_works("silent", 100);
  EXPECT_LT(seconds_since(start), 3.0);
  EXPECT_FALSE(store_->check({"half"}));
  server_still_accepts();
}

TEST(TcpStoreStall, StalledClientsAreDroppedButIdleOnesAreKept) {
  // The server drops a client stuck mid-message after RINGREDUCE_TIMEOUT; one second here.
  std::unique_ptr<TcpStoreServer> server;
  {
    ScopedEnv timeout("RINGREDUCE_TIMEOUT", "1");
    server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  }
  int port = server->port();
  auto store = connect_tcp_store("127.0.0.1", port, 5s);

  RawClient no_hello("127.0.0.1", port);
  RawClient half_request("127.0.0.1", port);
  ASSERT_TRUE(half_request.hello());
  auto req = set_request("half", "never completed");
  req.resize(req.size() - 3);
  half_request.send(req);
  RawClient idle("127.0.0.1", port);
  ASSERT_TRUE(idle.hello());  // then nothing: a legitimate idle connection

  auto start = Clock::now();
  store->set("during", bytes("ok"));
  EXPECT_TRUE(half_request.closed_by_server(4s));
  EXPECT_TRUE(no_hello.closed_by_server(4s));
  EXPECT_GE(seconds_since(start), 0.5);
  // The idle client survives past the stall timeout and is still served.
  std::this_thread::sleep_for(500ms);
  idle.send(set_request("idle", "still here"));
  auto reply = idle.read(wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ((*reply)[0], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(store->get("idle", 1s), bytes("still here"));
  // So is the well-behaved store client, idle all that time.
  EXPECT_EQ(store->get("during", 1s), bytes("ok"));
}

TEST_F(TcpStoreTest, SlowTrickleClientIsServedWhileOthersWork) {
  RawClient trickle("127.0.0.1", port_);
  ASSERT_TRUE(trickle.hello());
  auto req = set_request("trickle", "slowly");
  std::atomic<bool> sent{false};
  JoiningThread sender([&] {
    for (uint8_t b : req) {
      trickle.send({b});
      std::this_thread::sleep_for(10ms);
    }
    sent = true;
  });
  // While the request dribbles in, others are served at full speed.
  auto start = Clock::now();
  normal_client_works("trickle-neighbour", 50);
  EXPECT_LT(seconds_since(start), 2.0);
  sender.join();
  ASSERT_TRUE(sent);
  auto reply = trickle.read(wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(reply);
  EXPECT_EQ((*reply)[0], static_cast<uint8_t>(wire::Status::ok));
  EXPECT_EQ(store_->get("trickle", 1s), bytes("slowly"));
}

TEST_F(TcpStoreTest, PipelinedRequestsAreAnsweredInOrder) {
  RawClient raw("127.0.0.1", port_);
  std::vector<uint8_t> all;
  wire::append_client_hello(&all);
  auto s = set_request("p", "1");
  all.insert(all.end(), s.begin(), s.end());
  std::vector<uint8_t> get_payload;
  wire::Writer w(&get_payload);
  w.u64(1000);
  w.str("p");
  auto g = frame(wire::Op::get, get_payload);
  all.insert(all.end(), g.begin(), g.end());
  raw.send(all);  // hello and two requests in one write
  auto hello = raw.read(wire::kHelloBytes, 2s);
  ASSERT_TRUE(hello);
  auto set_reply = raw.read(wire::kFrameHeaderBytes, 2s);
  ASSERT_TRUE(set_reply);
  EXPECT_EQ((*set_reply)[0], 0);
  auto get_reply = raw.read(wire::kFrameHeaderBytes + 4 + 1, 2s);
  ASSERT_TRUE(get_reply);
  EXPECT_EQ((*get_reply)[0], 0);
  EXPECT_EQ(get_reply->back(), '1');
}

TEST_F(TcpStoreTest, ClientSideLimitsAreInvalidArgument) {
  EXPECT_THROW(store_->set(std::string(wire::kMaxKeyBytes + 1, 'k'), bytes("v")), InvalidArgument);
  EXPECT_THROW(store_->set("k", std::vector<uint8_t>(wire::kMaxValueBytes + 1)), InvalidArgument);
  EXPECT_THROW(store_->check(std::vector<std::string>(wire::kMaxKeys + 1, "k")), InvalidArgument);
  normal_client_works("limits");
}

TEST_F(TcpStoreTest, ManyClientsRendezvous) {
  constexpr int kRanks = 32;
  std::atomic<int> failures{0};
  {
    std::vector<std::unique_ptr<JoiningThread>> ranks;
    for (int r = 0; r < kRanks; ++r) {
      ranks.push_back(std::make_unique<JoiningThread>([&, r] {
        try {
          auto s = connect_tcp_store("127.0.0.1", port_, 5s);
          s->set("addr/" + std::to_string(r), bytes("rank" + std::to_string(r)));
          s->add("arrived", 1);
          std::vector<std::string> keys;
          for (int i = 0; i < kRanks; ++i) keys.push_back("addr/" + std::to_string(i));
          s->wait(keys, 10s);
          for (int i = 0; i < kRanks; ++i)
            if (s->get(keys[i], 1s) != bytes("rank" + std::to_string(i))) ++failures;
        } catch (const std::exception& e) {
          ADD_FAILURE() << "rank " << r << ": " << e.what();
          ++failures;
        }
      }));
    }
  }
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(store_->add("arrived", 0), kRanks);
}

TEST(TcpStore, ClientConnectingBeforeTheServerStartsRetries) {
  int port = free_port();
  std::unique_ptr<TcpStoreServer> server;
  JoiningThread starter([&] {
    std::this_thread::sleep_for(300ms);
    server = std::make_unique<TcpStoreServer>("127.0.0.1", port);
  });
  auto start = Clock::now();
  auto store = connect_tcp_store("127.0.0.1", port, 10s);
  EXPECT_GE(seconds_since(start), 0.2);
  starter.join();
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 1s), bytes("v"));
}

TEST(TcpStore, ConnectTimeoutNamesTheAddress) {
  int port = free_port();
  auto start = Clock::now();
  try {
    connect_tcp_store("127.0.0.1", port, 300ms);
    FAIL() << "connected to a port nobody listens on";
  } catch (const TimeoutError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("127.0.0.1:" + std::to_string(port)), std::string::npos) << what;
  }
  double took = seconds_since(start);
  EXPECT_GE(took, 0.29);
  EXPECT_LE(took, 1.5);
}

TEST(TcpStore, ConnectingToSomethingElseFailsClearly) {
  // A "server" that answers with bytes that are not a store hello.
  core::Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(a);
  ASSERT_EQ(::bind(listener.get(), reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  ASSERT_EQ(::listen(listener.get(), 4), 0);
  ASSERT_EQ(::getsockname(listener.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  JoiningThread impostor([&] {
    core::Fd c(::accept(listener.get(), nullptr, nullptr));
    const char reply[] = "HTTP/1.0 400 Bad\r\n";
    ssize_t ignored = ::send(c.get(), reply, sizeof(reply), MSG_NOSIGNAL);
    (void)ignored;
    std::this_thread::sleep_for(200ms);
  });
  try {
    connect_tcp_store("127.0.0.1", ntohs(a.sin_port), 2s);
    FAIL() << "accepted a non-store service";
  } catch (const TimeoutError& e) {
    FAIL() << "should fail at once, not time out: " << e.what();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not a ringreduce store"), std::string::npos) << e.what();
  }
}

TEST(TcpStore, ServerDestructorReturnsPromptlyWithClientsConnected) {
  auto server = std::make_unique<TcpStoreServer>("127.0.0.1", 0);
  int port = server->port();
  auto a = connect_tcp_store("127.0.0.1", port, 5s);
  auto b = connect_tcp_store("127.0.0.1", port, 5s);
  RawClient silent("127.0.0.1", port);
  RawClient half("127.0.0.1", port);
  half.send({0x52});
  std::atomic<bool> get_failed{false};
  std::atomic<double> get_ended_at{0};
  auto start = Clock::now();
  JoiningThread waiter([&] {
    try {
      b->get("never", 20s);
    } catch (const Error&) {
      get_failed = true;
    }
    get_ended_at = seconds_since(start);
  });
  a->set("x", bytes("1"));
  std::this_thread::sleep_for(100ms);  // let the get park on the server
  auto destroy_start = Clock::now();
  server.reset();
  EXPECT_LT(seconds_since(destroy_start), 1.0);
  waiter.join();
  EXPECT_TRUE(get_failed);
  EXPECT_LT(get_ended_at.load(), 2.0);
  EXPECT_TRUE(silent.closed_by_server(1s));
  EXPECT_THROW(a->set("y", bytes("2")), Error);
}

TEST(TcpStore, ResolvesLocalhost) {
  TcpStoreServer server("127.0.0.1", 0);
  // "localhost" may resolve to ::1 first; the client falls through to 127.0.0.1.
  auto store = connect_tcp_store("localhost", server.port(), 5s);
  store->set("k", bytes("v"));
  EXPECT_EQ(store->get("k", 1s), bytes("v"));
}

TEST(TcpStore, DualStackServerAcceptsIPv4Clients) {
  if (!ipv6_loopback_available()) GTEST_SKIP() << "IPv6 loopback (::1) is not available";
  TcpStoreServer server("::", 0);
  auto v4 = connect_tcp_store("127.0.0.1", server.port(), 5s);
  auto v6 = connect_tcp_store("::1", server.port(), 5s);
  v4->set("k", bytes("v"));
  EXPECT_EQ(v6->get("k", 1s), bytes("v"));
}

TEST(TcpStore, BadArgumentsAreInvalidArgument) {
  EXPECT_THROW(TcpStoreServer("127.0.0.1", 70000), InvalidArgument);
  EXPECT_THROW(connect_tcp_store("127.0.0.1", 0, 100ms), InvalidArgument);
  EXPECT_THROW(connect_tcp_store("", 1234, 100ms), InvalidArgument);
  // A port in use is an Error that names the address.
  TcpStoreServer first("127.0.0.1", 0);
  try {
    TcpStoreServer second("127.0.0.1", first.port());
    FAIL() << "two servers on one port";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(std::to_string(first.port())), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ringreduce::rendezvous
