// Encrypted TCP data connections (RINGREDUCE_ENCRYPT=psk, issue 45): every collective and
// point-to-point message exact through the record layer (transport/tcp/secure_channel.h) over TCP
// alone, over mixed hosts (shared memory within a host, encrypted TCP between) and over striped
// sockets; and the settings refused clearly where they cannot work. Tampering on the way is
// tests/unit/secure_channel_test.cc's (a relay between the records).
#include <numeric>

#include "../test_certs.h"
#include "harness.h"
#include "ringreduce/ringreduce.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;
using rrtest::kOpenssl;
using rrtest::TestCerts;

std::map<std::string, std::string> encrypted(std::map<std::string, std::string> s) {
  s["RINGREDUCE_TOKEN"] = "encrypt-test-token";
  s["RINGREDUCE_ENCRYPT"] = "psk";
  return s;
}

// allreduce at sizes around a record (64 KiB) and the inbox (128 KiB) and well past both;
// reduce_scatter, allgather, broadcast, alltoall, send/recv, barrier.
void every_collective(Communicator& comm) {
  const int n = comm.size(), me = comm.rank();
  for (size_t count : {size_t{1}, size_t{16383}, size_t{16384}, size_t{40000}, size_t{1000003}}) {
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = float(me + 1) * float(i % 101);
    comm.allreduce(v.data(), v.data(), count, DataType::f32, ReduceOp::sum);
    const float ranks = float(n * (n + 1) / 2);
    for (size_t i = 0; i < count; i += 997)
      ASSERT_EQ(v[i], ranks * float(i % 101)) << "allreduce count " << count << " at " << i;
    ASSERT_EQ(v[count - 1], ranks * float((count - 1) % 101));
  }
  const size_t c = 70001;
  std::vector<int64_t> all(c * size_t(n)), block(c);
  for (size_t i = 0; i < all.size(); ++i) all[i] = me * 1000 + int64_t(i);
  comm.reduce_scatter(all.data(), block.data(), c, DataType::i64, ReduceOp::sum);
  const int64_t base = 1000 * int64_t(n * (n - 1) / 2);
  for (size_t i = 0; i < c; i += 331)
    ASSERT_EQ(block[i], base + int64_t(n) * int64_t(c * size_t(me) + i)) << "reduce_scatter";
  std::vector<int64_t> mine(c, me), gathered(c * size_t(n));
  comm.allgather(mine.data(), gathered.data(), c, DataType::i64);
  for (int r = 0; r < n; ++r) ASSERT_EQ(gathered[size_t(r) * c + 5], r) << "allgather";
  std::vector<int32_t> b(c, me == 1 ? 77 : 0);
  comm.broadcast(b.data(), c, DataType::i32, 1);
  ASSERT_EQ(b[c - 1], 77) << "broadcast";
  std::vector<int32_t> out(c * size_t(n)), in(c * size_t(n));
  for (size_t i = 0; i < out.size(); ++i) out[i] = me * 100 + int32_t(i / c);
  comm.alltoall(out.data(), in.data(), c, DataType::i32);
  for (int r = 0; r < n; ++r) ASSERT_EQ(in[size_t(r) * c], r * 100 + me) << "alltoall";
  // A ring of sends: each rank to the next, 300 KB.
  std::vector<uint8_t> msg(300000, uint8_t(me)), got(300000);
  const int next = (me + 1) % n, prev = (me + n - 1) % n;
  auto s = comm.send_async(msg.data(), msg.size(), DataType::u8, next, 7);
  comm.recv(got.data(), got.size(), DataType::u8, prev, 7);
  s.wait();
  ASSERT_EQ(got[299999], uint8_t(prev)) << "send/recv";
  comm.barrier();
}

TEST(Encrypt, EveryCollectiveExactOverTcp) {
  run_ranks(3, every_collective, encrypted({{"RINGREDUCE_SHM", "0"}}));
}

TEST(Encrypt, EveryCollectiveExactOverMixedHosts) {
  run_ranks(4, every_collective, encrypted({{"TEST_HOSTS", "2"}}));
}

TEST(Encrypt, EveryCollectiveExactOverStripedSockets) {
  run_ranks(2, every_collective, encrypted({{"RINGREDUCE_SHM", "0"}, {"RINGREDUCE_NSOCKS", "3"}}));
}

// psk without a token has nothing to derive keys from: refused at start-up on every rank, naming
// both settings.
TEST(Encrypt, PskWithoutTokenRefused) {
  std::vector<std::string> errors(2);
  try {
    run_ranks(
        2, [](Communicator&) {}, {{"RINGREDUCE_ENCRYPT", "psk"}, {"RINGREDUCE_SHM", "0"}},
        std::chrono::seconds(20));
    ADD_FAILURE() << "started";
  } catch (const ringreduce::InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("RINGREDUCE_ENCRYPT=psk needs RINGREDUCE_TOKEN"), std::string::npos)
        << what;
  }
}

// A rank that would send in the clear among ranks that encrypt: the join names the setting on
// every rank, before any data moves.
TEST(Encrypt, RanksThatDisagreeFailAtTheJoin) {
  std::vector<std::string> errors(3);
  try {
    run_ranks(
        3, [](Communicator&) {}, encrypted({{"RINGREDUCE_SHM", "0"}}), std::chrono::seconds(20),
        [](int r, std::map<std::string, std::string>& s) {
          if (r == 2) s["RINGREDUCE_ENCRYPT"] = "off";
        });
    ADD_FAILURE() << "started";
  } catch (const ringreduce::Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("RINGREDUCE_ENCRYPT"), std::string::npos) << what;
  }
}

// RINGREDUCE_ENCRYPT=tls: certificates instead of the token (made per run with the openssl CLI).
class EncryptTls : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { ok_ = TestCerts::make(); }
  static void TearDownTestSuite() { TestCerts::remove(); }
  void SetUp() override {
    if (!TestCerts::have_openssl()) GTEST_SKIP() << kOpenssl << " is missing: no certificates";
    ASSERT_TRUE(ok_) << "making the test certificates failed";
  }
  static std::map<std::string, std::string> tls(std::map<std::string, std::string> s,
                                                const std::string& who = "rank") {
    s["RINGREDUCE_ENCRYPT"] = "tls";
    s["RINGREDUCE_TLS_KEY"] = TestCerts::path(who + ".key");
    s["RINGREDUCE_TLS_CERT"] = TestCerts::path(who + ".crt");
    s["RINGREDUCE_TLS_CA"] = TestCerts::path("ca.crt");
    return s;
  }
  static inline bool ok_ = false;
};

TEST_F(EncryptTls, EveryCollectiveExactOverTcp) {
  run_ranks(3, every_collective, tls({{"RINGREDUCE_SHM", "0"}}));
}

TEST_F(EncryptTls, EveryCollectiveExactOverMixedHostsWithAToken) {
  run_ranks(4, every_collective, tls({{"TEST_HOSTS", "2"}, {"RINGREDUCE_TOKEN", "t"}}));
}

// A rank whose certificate another CA signed (or that has expired) is refused at its first
// connection, which the start-up's link probe makes: every rank fails at start-up, the ones that
// saw the handshake fail naming it.
TEST_F(EncryptTls, UntrustedOrExpiredCertificateFailsEveryRank) {
  for (const std::string who : {"stranger", "expired"}) {
    std::vector<std::string> errors(3);
    auto store = ringreduce::make_memory_store();
    const std::string prefix = unique_prefix();
    std::vector<std::thread> threads;
    for (int r = 0; r < 3; ++r)
      threads.emplace_back([&, r] {
        auto o = rank_options(r, 3, store, std::chrono::seconds(10),
                              tls({{"RINGREDUCE_SHM", "0"}}, r == 1 ? who : "rank"), prefix);
        try {
          Communicator comm(o);
          std::vector<float> v(1000, 1.0f);
          comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum);
        } catch (const ringreduce::Error& e) {
          errors[size_t(r)] = e.what();
        }
      });
    for (auto& t : threads) t.join();
    size_t named = 0;
    for (int r = 0; r < 3; ++r) {
      EXPECT_FALSE(errors[size_t(r)].empty()) << who << ": rank " << r << " went on";
      EXPECT_EQ(errors[size_t(r)].rfind("rank " + std::to_string(r) + ": ", 0), 0u)
          << errors[size_t(r)];
      if (errors[size_t(r)].find("TLS handshake with rank") != std::string::npos) ++named;
      std::cerr << who << ": " << errors[size_t(r)] << "\n";
    }
    EXPECT_GE(named, 1u) << who << ": nobody named the handshake: " << errors[0] << " | "
                         << errors[1] << " | " << errors[2];
  }
}

TEST_F(EncryptTls, MissingFilesRefusedAtStartUp) {
  try {
    run_ranks(
        2, [](Communicator&) {}, {{"RINGREDUCE_ENCRYPT", "tls"}, {"RINGREDUCE_SHM", "0"}},
        std::chrono::seconds(20));
    ADD_FAILURE() << "started";
  } catch (const ringreduce::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RINGREDUCE_ENCRYPT=tls needs RINGREDUCE_TLS_KEY"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace rrtest
