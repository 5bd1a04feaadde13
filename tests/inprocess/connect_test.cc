// Data connections: IPv6, a congestion control the kernel lacks, the interface chosen by name;
// strangers at a rank's listener, and RINGREDUCE_TOKEN on every kind of link, on one rank only,
// or different on one rank. (Split from comm_test.cc; the tests keep the suite name Comm.)
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/config.h"
#include "harness.h"
#include "transport/tcp/handshake.h"
#include "transport/tcp/socket.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using Clock = std::chrono::steady_clock;

TEST(Comm, Ipv6DataConnections) {
  {
    ringreduce::transport::tcp::SockAddr probe;
    ringreduce::transport::tcp::parse_numeric("::1", 0, &probe);
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    bool ok = fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&probe.storage), probe.len) == 0;
    if (fd >= 0) close(fd);
    if (!ok) GTEST_SKIP() << "no IPv6 loopback on this machine";
  }
  run_ranks(3,
            [](Communicator& comm) {
              std::vector<int64_t> buf(1000, comm.rank());
              comm.allreduce(std::span<int64_t>(buf), ReduceOp::sum);
              EXPECT_EQ(buf[0], 3);
            },
            {{"RINGREDUCE_SOCKET_FAMILY", "AF_INET6"}, {"RINGREDUCE_SHM", "0"}});
}

TEST(Comm, CongestionControlThatTheKernelLacksKeepsTheDefault) {
  // RINGREDUCE_SOCKET_CC is a preference: a name the kernel does not know is logged, not fatal.
  for (const char* cc : {"nosuchcc", "system", "cubic"})
    run_ranks(2,
              [](Communicator& comm) {
                std::vector<float> buf(1 << 16, 1.0f);
                comm.allreduce(std::span<float>(buf), ReduceOp::sum);
                EXPECT_EQ(buf[0], 2.0f);
              },
              {{"RINGREDUCE_SOCKET_CC", cc}, {"RINGREDUCE_SHM", "0"}});
}

TEST(Comm, InterfaceByName) {
  run_ranks(2,
            [](Communicator& comm) {
              std::vector<float> buf(10, 1.0f);
              comm.allreduce(std::span<float>(buf), ReduceOp::sum);
              EXPECT_EQ(buf[0], 2.0f);
            },
            {{"RINGREDUCE_SOCKET_IFNAME", "=lo"},
             {"RINGREDUCE_SOCKET_FAMILY", "AF_INET"},
             {"RINGREDUCE_SHM", "0"}});
  // Checked at start-up even when there is nobody to connect to.
  EXPECT_THROW(run_ranks(1, [](Communicator&) {}, {{"RINGREDUCE_SOCKET_IFNAME", "=nosuchif0"}}),
               ringreduce::InvalidArgument);
}

TEST(Comm, StrangersAtStartUpAreDroppedAndTheJobConnects) {
  // Rank 0 listens before it joins and publishes its address in its join record; before rank 1
  // starts, strangers connect to it: one sends garbage, one a hello with another communicator id,
  // one says nothing at all, one sends five bytes of a hello and stops; once the table exists,
  // one poses as rank 1 without the token. Rank 0's first op meets them all in its connector.
  auto store = ringreduce::make_memory_store();
  std::vector<std::exception_ptr> errors(2);
  const std::map<std::string, std::string> settings = {
      {"RINGREDUCE_SHM", "0"},
      {"RINGREDUCE_HOST_ID", "strangers-test"},
      {"RINGREDUCE_TOKEN", "strangers-test-token"}};
  std::atomic<bool> strangers_in{false};
  std::thread rank0([&] {
    try {
      ringreduce::Options o;
      o.rank = 0;
      o.world_size = 2;
      o.store = store;
      o.timeout = 30s;
      o.settings = settings;
      Communicator comm(o);
      for (int i = 0; i < 1000 && !strangers_in; ++i) std::this_thread::sleep_for(10ms);
      std::vector<float> buf(100, 1.0f);
      comm.allreduce(std::span<float>(buf), ReduceOp::sum);
      EXPECT_EQ(buf[0], 2.0f);
    } catch (...) {
      errors[0] = std::current_exception();
    }
  });
  // The last line of rank 0's join record says how to reach it (rendezvous/join.h):
  // "tcp=<host>|<port>|<nonce>".
  auto raw = store->get("rr/join/0", 10s);
  std::string record(raw.begin(), raw.end());
  const size_t at = record.find("tcp=");
  ASSERT_NE(at, std::string::npos) << record;
  const std::string addr = record.substr(at + 4, record.find_first_of(";\n", at) - at - 4);
  auto a = addr.find('|'), b = addr.find('|', a + 1);
  ringreduce::transport::tcp::SockAddr sa;
  ASSERT_TRUE(ringreduce::transport::tcp::parse_numeric(
      addr.substr(0, a), std::stoi(addr.substr(a + 1, b - a - 1)), &sa));
  auto deadline = ringreduce::core::Deadline::after(5s);
  auto garbage = ringreduce::transport::tcp::connect_to(sa, deadline);
  ASSERT_EQ(write(garbage.get(), "GET / HTTP/1.0\r\n\r\n-----------------", 36), 36);
  auto wrong = ringreduce::transport::tcp::connect_to(sa, deadline);
  uint32_t hello[8] = {0x31485252, 2, 12345, 0, 1, 0, 2, 0};  // right magic, wrong communicator
  ASSERT_EQ(write(wrong.get(), hello, sizeof hello), static_cast<ssize_t>(sizeof hello));
  auto silent = ringreduce::transport::tcp::connect_to(sa, deadline);
  // A trickler: the first bytes of a hello, the rest never (its reader waits, the job does not).
  auto trickle = ringreduce::transport::tcp::connect_to(sa, deadline);
  ASSERT_EQ(write(trickle.get(), hello, 5), 5);
  std::thread rank1([&] {
    try {
      ringreduce::Options o;
      o.rank = 1;
      o.world_size = 2;
      o.store = store;
      o.timeout = 30s;
      o.settings = settings;
      Communicator comm(o);
      std::vector<float> buf(100, 1.0f);
      comm.allreduce(std::span<float>(buf), ReduceOp::sum);
    } catch (...) {
      errors[1] = std::current_exception();
    }
  });
  // One that knows everything but the token: the right communicator, claiming rank 1, with a
  // made-up proof. It must be dropped, and the real rank 1 must still get in.
  auto impostor = ringreduce::transport::tcp::connect_to(sa, deadline);
  {
    auto table = store->get("rr/table", 10s);  // the communicator id is its first line
    ringreduce::transport::tcp::Hello h;
    h.comm_id = std::stoull(std::string(table.begin(), table.end()));
    h.rank = 1;
    h.world_size = 2;
    h.auth = ringreduce::transport::tcp::kHelloAuthHmac;
    std::vector<uint8_t> msg(sizeof h + ringreduce::transport::tcp::kConnectorAuthBytes, 0x5a);
    std::memcpy(msg.data(), &h, sizeof h);
    ASSERT_EQ(write(impostor.get(), msg.data(), msg.size()), static_cast<ssize_t>(msg.size()));
  }
  strangers_in = true;
  rank0.join();
  rank1.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(Comm, TokenAuthenticatesSharedMemoryTcpAndMixedLinks) {
  for (const auto& extra : std::vector<std::map<std::string, std::string>>{
           {}, {{"RINGREDUCE_SHM", "0"}}, {{"TEST_HOSTS", "2"}}}) {
    auto settings = extra;
    settings["RINGREDUCE_TOKEN"] = "a shared secret";
    run_ranks(
        4,
        [](Communicator& comm) {
          std::vector<float> buf(100000, 1.0f);
          comm.allreduce(std::span<float>(buf), ReduceOp::sum);
          EXPECT_EQ(buf[0], 4.0f);
          EXPECT_EQ(buf.back(), 4.0f);
        },
        settings, 30s);
  }
}

// Starts `size` ranks, rank r with settings[r]; returns each rank's error message ("" if its
// communicator came up) and how long each took.
std::vector<std::string> start_ranks(
    int size, const std::vector<std::map<std::string, std::string>>& settings,
    std::chrono::milliseconds timeout, std::vector<double>* took) {
  auto store = ringreduce::make_memory_store();
  std::vector<std::string> errors(static_cast<size_t>(size));
  took->assign(static_cast<size_t>(size), 0);
  std::vector<std::thread> threads;
  const auto start = Clock::now();
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator comm(rank_options(r, size, store, timeout, settings[static_cast<size_t>(r)]));
      } catch (const std::exception& e) {
        errors[static_cast<size_t>(r)] = e.what();
      }
      (*took)[static_cast<size_t>(r)] = seconds_since(start);
    });
  for (auto& t : threads) t.join();
  return errors;
}

TEST(Comm, ATokenOnOneRankOnlyIsNamedAtStartUp) {
  for (const std::string shm : {"0", "1"}) {
    std::vector<std::map<std::string, std::string>> s(2, {{"RINGREDUCE_SHM", shm}});
    s[1]["RINGREDUCE_TOKEN"] = "only rank 1 has it";
    std::vector<double> took;
    auto errors = start_ranks(2, s, 2s, &took);
    // Rank 1 reads rank 0's published "no token" and says so at once; rank 0, left waiting,
    // fails at its deadline.
    EXPECT_NE(errors[1].find("RINGREDUCE_TOKEN is set here but not on rank 0"), std::string::npos)
        << errors[1];
    EXPECT_LT(took[1], 1.0);
    EXPECT_FALSE(errors[0].empty());
    EXPECT_LT(took[0], 2.0 + 1.0);
  }
}

TEST(Comm, AWrongTokenIsDroppedLikeAStrangerAndNamedAtTheTimeout) {
  for (const std::string shm : {"0", "1"}) {
    std::vector<std::map<std::string, std::string>> s(
        2, {{"RINGREDUCE_SHM", shm}, {"RINGREDUCE_TOKEN", "right"}});
    s[1]["RINGREDUCE_TOKEN"] = "wrong";
    std::vector<double> took;
    auto errors = start_ranks(2, s, 2s, &took);
    // Rank 0 drops the connection with the bad proof (failing at once would let any stranger
    // fail the job) and names it when its wait ends: at its deadline, or when rank 1, which
    // holds the store's token (a stranger does not), marks the job failed. Over TCP its own
    // connection to rank 1 may be dropped first, by rank 1: that names the token too.
    EXPECT_TRUE(errors[0].find("timed out waiting for") != std::string::npos ||
                errors[0].find("rank 1 failed") != std::string::npos ||
                errors[0].find("rank 1 closed our data connection before answering its hello") !=
                    std::string::npos)
        << errors[0];
    if (shm == "0") {
      EXPECT_TRUE(errors[0].find("wrong proof of the token") != std::string::npos ||
                  errors[0].find("a different RINGREDUCE_TOKEN there?") != std::string::npos)
          << errors[0];
    }
    EXPECT_NE(errors[1].find("RINGREDUCE_TOKEN"), std::string::npos) << errors[1];
    EXPECT_EQ(errors[1].rfind("rank 1: ", 0), 0u) << errors[1];
    for (double t : took) EXPECT_LT(t, 2.0 + 1.0);
  }
}

}  // namespace
}  // namespace rrtest
