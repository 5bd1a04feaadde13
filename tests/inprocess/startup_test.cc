// Start-up that goes wrong ends on every rank at once, with one message naming the ranks and
// the values (rendezvous/join.h): world sizes or settings that differ, a rank started twice, a
// store that still holds an earlier job, a rank whose own setting is bad. Every case runs with a
// 60 s timeout and must end well before it: the failure is found, not waited out.
#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <thread>

#include "harness.h"
#include "rendezvous/join.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using Clock = std::chrono::steady_clock;

struct Outcome {
  std::string error;  // empty: started
  ringreduce::ErrorCode code = ringreduce::ErrorCode::internal;
  double seconds = 0;
};

// Starts one communicator per Options, each in its own thread, and runs one allreduce on those
// that start; every rank's outcome.
std::vector<Outcome> start(const std::vector<ringreduce::Options>& ranks) {
  std::vector<Outcome> out(ranks.size());
  std::vector<std::thread> threads;
  const auto t0 = Clock::now();
  for (size_t i = 0; i < ranks.size(); ++i)
    threads.emplace_back([&, i] {
      try {
        Communicator comm(ranks[i]);
        float x = 1;
        comm.allreduce(&x, &x, 1, DataType::f32, ReduceOp::sum);
      } catch (const ringreduce::Error& e) {
        out[i].error = e.what();
        out[i].code = e.code();
      }
      out[i].seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    });
  for (auto& t : threads) t.join();
  return out;
}

ringreduce::Options rank(int r, int size, std::shared_ptr<ringreduce::Store> store,
                         const std::string& prefix,
                         std::map<std::string, std::string> settings = {}) {
  return rank_options(r, size, std::move(store), 60s, std::move(settings), prefix);
}

// Every rank failed within `limit` seconds, its message naming its own rank and containing
// every one of `parts`.
void expect_all_failed(const std::vector<Outcome>& out, const std::vector<int>& ranks,
                       const std::vector<std::string>& parts, double limit = 10) {
  for (size_t i = 0; i < out.size(); ++i) {
    SCOPED_TRACE("process " + std::to_string(i) + ": " + out[i].error);
    ASSERT_FALSE(out[i].error.empty()) << "started";
    EXPECT_LT(out[i].seconds, limit) << "waited instead of failing";
    EXPECT_EQ(out[i].error.rfind("rank " + std::to_string(ranks[i]) + ": start-up: ", 0), 0u);
    for (const auto& p : parts) EXPECT_NE(out[i].error.find(p), std::string::npos) << p;
  }
}

TEST(StartUp, WorldSizesThatDifferFailEveryRank) {
  auto store = ringreduce::make_memory_store();
  const std::string p = unique_prefix();
  // Rank 0 thinks the world has 3 ranks (and would wait for rank 2 until its timeout).
  auto out = start({rank(0, 3, store, p), rank(1, 2, store, p)});
  expect_all_failed(out, {0, 1}, {"ranks disagree on the world size: rank 0", "has 3", "has 2"});
  EXPECT_EQ(out[0].code, ringreduce::ErrorCode::aborted) << "rank 0 learns it from rank 1's mark";
  EXPECT_EQ(out[1].code, ringreduce::ErrorCode::mismatch);
}

TEST(StartUp, SettingsThatMustAgreeFailEveryRank) {
  auto store = ringreduce::make_memory_store();
  const std::string p = unique_prefix();
  auto out = start({rank(0, 3, store, p), rank(1, 3, store, p),
                    rank(2, 3, store, p, {{"RINGREDUCE_CHANNELS", "2"}})});
  expect_all_failed(out, {0, 1, 2}, {"RINGREDUCE_CHANNELS: rank 0", "has 1", "rank 2", "has 2"});
}

TEST(StartUp, RankStartedTwiceFailsEveryRank) {
  auto store = ringreduce::make_memory_store();
  const std::string p = unique_prefix();
  // Two processes believe they are rank 1 of 3; rank 2 never comes.
  auto out = start({rank(0, 3, store, p), rank(1, 3, store, p), rank(1, 3, store, p)});
  expect_all_failed(out, {0, 1, 1}, {"rank 1 was claimed twice"});
}

TEST(StartUp, AReusedStoreNeedsAJobIdOfItsOwn) {
  auto store = ringreduce::make_memory_store();
  const std::string p = unique_prefix();
  auto first = start({rank(0, 2, store, p), rank(1, 2, store, p)});
  ASSERT_TRUE(first[0].error.empty()) << first[0].error;
  ASSERT_TRUE(first[1].error.empty()) << first[1].error;
  // A second job on the same store and keys: its ranks find the first's claims.
  auto second = start({rank(0, 2, store, p), rank(1, 2, store, p)});
  expect_all_failed(second, {0, 1}, {"RINGREDUCE_JOB_ID"});
}

// Under torchrun the store outlives the worker groups (torch 2.x keeps one for every elastic
// round): each group joins under the first generation no group has started or failed in, so a
// group of 2 after a group of 3 (a node left), one that failed at start-up, and a group of 3
// again (it came back) all start on the same store and keys.
TEST(StartUp, GroupsOfATorchrunJobTakeTheNextGenerationOfTheStore) {
  struct Env {
    Env() { ::setenv("TORCHELASTIC_RUN_ID", "rounds", 1); }
    ~Env() { ::unsetenv("TORCHELASTIC_RUN_ID"); }
  } torchrun;
  auto store = ringreduce::make_memory_store();
  const std::string p = unique_prefix();
  auto ok = [](const std::vector<Outcome>& out) {
    for (const auto& o : out) EXPECT_TRUE(o.error.empty()) << o.error;
  };
  ok(start({rank(0, 3, store, p), rank(1, 3, store, p), rank(2, 3, store, p)}));
  ok(start({rank(0, 2, store, p), rank(1, 2, store, p)}));
  // A group whose ranks disagree fails at start-up and marks its generation failed.
  auto bad = start({rank(0, 2, store, p, {{"RINGREDUCE_CHANNELS", "2"}}), rank(1, 2, store, p)});
  EXPECT_FALSE(bad[0].error.empty());
  EXPECT_FALSE(bad[1].error.empty());
  ok(start({rank(0, 3, store, p), rank(1, 3, store, p), rank(2, 3, store, p)}));
  EXPECT_TRUE(store->check({p + "/gen3/table"}));
  EXPECT_FALSE(store->check({p + "/gen4/table"}));
}

TEST(StartUp, ABadSettingOnOneRankFailsTheOthersAtOnce) {
  auto store = ringreduce::make_memory_store();
  const std::string p = unique_prefix();
  auto out = start({rank(0, 3, store, p), rank(1, 3, store, p, {{"RINGREDUCE_NSOCKS", "99"}}),
                    rank(2, 3, store, p)});
  expect_all_failed(out, {0, 1, 2}, {"RINGREDUCE_NSOCKS=99 is not in 1..16"});
  EXPECT_EQ(out[0].error, "rank 0: start-up: rank 1 failed: RINGREDUCE_NSOCKS=99 is not in 1..16");
}

// A rank that fails after the join, while making its links (its interface filter matches nothing;
// not a setting that must agree), fails the others waiting in their links' accepts, over TCP and
// over shared memory alike, rather than leaving them to the timeout.
TEST(StartUp, ARankThatFailsMakingItsLinksFailsThePeersWaitingForIt) {
  for (const std::string shm : {"0", "1"}) {
    SCOPED_TRACE("RINGREDUCE_SHM=" + shm);
    auto store = ringreduce::make_memory_store();
    const std::string p = unique_prefix();
    const std::map<std::string, std::string> ok = {{"RINGREDUCE_SHM", shm}};
    // Over shared memory, rank 2 is on a host of its own: TCP links it to the others.
    std::map<std::string, std::string> bad = {{"RINGREDUCE_SHM", shm},
                                              {"RINGREDUCE_SOCKET_IFNAME", "=nosuchif0"}};
    std::map<std::string, std::string> same = ok, other = bad;
    if (shm == "1") {
      same["RINGREDUCE_HOST_ID"] = "a";
      other["RINGREDUCE_HOST_ID"] = "b";
    }
    auto out = start(
        {rank(0, 3, store, p, same), rank(1, 3, store, p, same), rank(2, 3, store, p, other)});
    expect_all_failed(out, {0, 1, 2}, {"nosuchif0"});
    EXPECT_EQ(out[0].code, ringreduce::ErrorCode::aborted) << out[0].error;
    EXPECT_NE(out[0].error.find("rank 2 failed"), std::string::npos) << out[0].error;
  }
}

// The failure mark ends any start-up wait in the store, not only the join's.
TEST(StartUp, FailFastStoreEndsAWaitWhenTheJobIsMarkedFailed) {
  auto store = ringreduce::make_memory_store();
  ringreduce::rendezvous::FailFastStore fast(store, 20ms);
  std::thread marker([&] {
    std::this_thread::sleep_for(100ms);
    ringreduce::rendezvous::mark_failed(*store, "rank 7: start-up: it broke");
  });
  const auto t0 = Clock::now();
  try {
    fast.get("never", 60s);
    ADD_FAILURE() << "the wait returned";
  } catch (const ringreduce::Error& e) {
    EXPECT_EQ(std::string(e.what()), "rank 7 failed: it broke");
  }
  marker.join();
  EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 10.0);
  // Without a mark, a wait times out naming the keys it waited for and its whole timeout.
  auto quiet = ringreduce::make_memory_store();
  ringreduce::rendezvous::FailFastStore slow(quiet, 20ms);
  try {
    slow.wait({"a", "b"}, 100ms);
    ADD_FAILURE() << "the wait returned";
  } catch (const ringreduce::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("'a', 'b'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("100 ms"), std::string::npos) << e.what();
  }
}

// A host's ranks meet through its first rank (the default) or every pair connecting (the mesh,
// where pidfds cannot watch the peers): both carry collectives, point-to-point and a token.
TEST(StartUp, SharedMemoryPeersMeetThroughTheFirstRankOrInAMesh) {
  for (const std::string how : {"first", "mesh"}) {
    SCOPED_TRACE("RINGREDUCE_SHM_CONNECT=" + how);
    run_ranks(
        5,
        [](Communicator& comm) {
          const int n = comm.size(), me = comm.rank();
          int64_t sum = me;
          comm.allreduce(&sum, &sum, 1, ringreduce::DataType::i64, ringreduce::ReduceOp::sum);
          EXPECT_EQ(sum, n * (n - 1) / 2);
          std::vector<int32_t> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), -1);
          for (int j = 0; j < n; ++j) in[static_cast<size_t>(j)] = me * n + j;
          comm.alltoall(in.data(), out.data(), 1, ringreduce::DataType::i32);
          for (int i = 0; i < n; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i * n + me);
          int32_t token = me, got = -1;
          comm.send(&token, 1, ringreduce::DataType::i32, (me + 1) % n);
          comm.recv(&got, 1, ringreduce::DataType::i32, (me + n - 1) % n);
          EXPECT_EQ(got, (me + n - 1) % n);
        },
        {{"RINGREDUCE_SHM_CONNECT", how}, {"RINGREDUCE_TOKEN", "t"}}, 30s);
  }
}

// A peer whose communicator is destroyed while its process lives on (here a thread) is named at
// once: through the first rank no socket closes, its flag on the board says so.
TEST(StartUp, APeerWhoseCommunicatorIsDestroyedIsNamedAtOnce) {
  for (const std::string how : {"first", "mesh"}) {
    SCOPED_TRACE("RINGREDUCE_SHM_CONNECT=" + how);
    run_ranks(
        2,
        [](Communicator& comm) {
          comm.barrier();
          if (comm.rank() == 1) return;
          std::this_thread::sleep_for(100ms);
          std::vector<float> buf(1 << 16, 1.0f);
          const auto t0 = Clock::now();
          try {
            comm.allreduce(buf.data(), buf.data(), buf.size(), ringreduce::DataType::f32,
                           ringreduce::ReduceOp::sum, {.timeout = 10s});
            ADD_FAILURE() << "the allreduce with a departed peer returned";
          } catch (const ringreduce::PeerError& e) {
            EXPECT_EQ(e.peer(), 1) << e.what();
            EXPECT_NE(std::string(e.what()).find("rank 1 is gone"), std::string::npos) << e.what();
          }
          EXPECT_LT(std::chrono::duration<double>(Clock::now() - t0).count(), 2.0);
        },
        {{"RINGREDUCE_SHM_CONNECT", how}}, 30s);
  }
}

// The shared-memory segments of this process's communicators ("memfd:ringreduce-shm" in
// /proc/self/maps; the ranks here are threads, so all of theirs).
size_t shm_mappings() {
  std::ifstream maps("/proc/self/maps");
  size_t n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("ringreduce-shm") != std::string::npos ? 1 : 0;
  return n;
}

// Small collectives (barriers, a 1-element allreduce), then an alltoall, each checked; rank 0
// takes count() after each part, every rank waiting for it before going on.
void small_ops_then_alltoall(Communicator& comm, size_t (*count)(),
                             std::atomic<size_t>* after_small, std::atomic<size_t>* after_all) {
  const int n = comm.size(), me = comm.rank();
  comm.barrier();
  int64_t sum = me;
  comm.allreduce(&sum, &sum, 1, ringreduce::DataType::i64, ringreduce::ReduceOp::sum);
  EXPECT_EQ(sum, n * (n - 1) / 2);
  comm.barrier();
  if (me == 0) *after_small = count();
  comm.barrier();
  std::vector<int32_t> in(static_cast<size_t>(n)), out(static_cast<size_t>(n), -1);
  for (int j = 0; j < n; ++j) in[static_cast<size_t>(j)] = me * n + j;
  comm.alltoall(in.data(), out.data(), 1, ringreduce::DataType::i32);
  for (int i = 0; i < n; ++i) EXPECT_EQ(out[static_cast<size_t>(i)], i * n + me);
  comm.barrier();
  if (me == 0) *after_all = count();
  comm.barrier();  // nobody closes (or unmaps) before rank 0 has counted
}

// A rank maps a peer's segment when it first sends to it (or reads its window region), not at
// start-up: small collectives go through the host's board, and an alltoall then maps them all
// and still comes out right. (Mapping every segment at start-up took seconds at 256 ranks.)
TEST(StartUp, SegmentsAreMappedOnFirstUse) {
  constexpr int kRanks = 16;
  for (const std::string how : {"first", "mesh"}) {
    SCOPED_TRACE("RINGREDUCE_SHM_CONNECT=" + how);
    std::atomic<size_t> after_small{0}, after_all{0};
    run_ranks(
        kRanks,
        [&](Communicator& comm) {
          small_ops_then_alltoall(comm, shm_mappings, &after_small, &after_all);
        },
        {{"RINGREDUCE_SHM_CONNECT", how}}, 60s);
    EXPECT_EQ(after_all.load(), static_cast<size_t>(kRanks * kRanks));
    // Each rank's own, the first rank's (the board), and the peers of the start-up probe's
    // recursive doubling and ring (lg N + 1): at most N (lg N + 3), against N^2 = 256 at start-up
    // before.
    EXPECT_LE(after_small.load(), static_cast<size_t>(kRanks * (4 + 3)));
    EXPECT_GT(after_small.load(), static_cast<size_t>(kRanks));
  }
}

// TCP connections between this process's ranks (threads here, so both ends of each are ours):
// sockets of this process that are ESTABLISHED in /proc/net/tcp{,6}, halved. A connection given up
// when two attempts crossed is closed by one end at once and leaves ESTABLISHED; one still being
// settled may be counted.
size_t tcp_connections() {
  std::set<std::string> ours;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const std::string target = std::filesystem::read_symlink(e.path(), ec).string();
    if (!ec && target.rfind("socket:[", 0) == 0) ours.insert(target.substr(8, target.size() - 9));
  }
  size_t established = 0;
  for (const char* table : {"/proc/self/net/tcp", "/proc/self/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream f(line);
      std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
      f >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
      established += state == "01" && ours.count(inode) ? 1 : 0;
    }
  }
  return established / 2;
}

// A TCP link is connected when a message first has to cross it, by the sender (tcp/connector.h):
// small collectives connect a few partners per rank, and an alltoall, in which every pair sends
// both ways at once (so their attempts cross), leaves one connection per pair and comes out
// right. (A mesh at start-up was N (N - 1) / 2 connections per channel, 917,504 sockets at 1,024
// ranks over 8 hosts.)
TEST(StartUp, TcpConnectsOnFirstUseAndCrossingAttemptsLeaveOnePerPair) {
  constexpr int kRanks = 16;
  constexpr size_t kPairs = kRanks * (kRanks - 1) / 2;
  std::atomic<size_t> after_small{0}, after_all{0};
  run_ranks(
      kRanks,
      [&](Communicator& comm) {
        small_ops_then_alltoall(comm, tcp_connections, &after_small, &after_all);
      },
      {{"RINGREDUCE_SHM", "0"}}, 60s);
  // The start-up probe (recursive doubling, the ring, Rabenseifner), the barriers (dissemination)
  // and the allreduce: partners at distances 2^k, at most N lg N = 64 pairs (56 here); against
  // the mesh's 120.
  EXPECT_LE(after_small.load(), size_t{kRanks * 4});
  EXPECT_GT(after_small.load(), size_t{0});
  // Every pair once, and no more than a few crossings still being settled.
  EXPECT_GE(after_all.load(), kPairs);
  EXPECT_LE(after_all.load(), kPairs + 4);
}

// An unknown way of connecting is this rank's own bad setting, named before any wait.
TEST(StartUp, AnUnknownShmConnectIsNamed) {
  try {
    run_ranks(
        1, [](Communicator&) {}, {{"RINGREDUCE_SHM_CONNECT", "star"}}, 10s);
    ADD_FAILURE() << "RINGREDUCE_SHM_CONNECT=star was accepted";
  } catch (const ringreduce::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RINGREDUCE_SHM_CONNECT='star'"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace rrtest
