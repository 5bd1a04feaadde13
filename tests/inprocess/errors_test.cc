// Failures that name what went wrong: a timeout names the rank waited on, the op and its
// sequence; a call that differs between ranks (every forced algorithm) raises a MismatchError on
// every rank; a dead peer never stretches a wait past its deadline; bad arguments name the rank
// and the call; stall warnings name the ranks that have not reached an op. (Split from
// comm_test.cc; the tests keep the suite name Comm.)
#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <string>
#include <thread>

#include "harness.h"

namespace rrtest {
namespace {

using namespace std::chrono_literals;
using ringreduce::Communicator;
using Clock = std::chrono::steady_clock;

TEST(Comm, TimeoutNamesTheRankWaitedOnOpAndSequence) {
  // Rank 2 never calls the second allreduce. Rank 3 receives from rank 2 in the ring: it times
  // out naming rank 2, and its notice fails ranks 0 and 1; all name the op and its sequence.
  std::vector<std::string> messages(4);
  run_ranks(
      4,
      [&](Communicator& comm) {
        std::vector<float> buf(1024, 1.0f);
        comm.allreduce(std::span<float>(buf), ReduceOp::sum);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(2500ms);  // outlive the others' deadline, then leave
          return;
        }
        auto start = Clock::now();
        try {
          // Rank 3 has the shortest deadline, so it is the one that reports first.
          comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32, ReduceOp::sum,
                         {.timeout = comm.rank() == 3 ? 500ms : 1500ms});
          ADD_FAILURE() << "no timeout on rank " << comm.rank();
        } catch (const ringreduce::TimeoutError& e) {
          EXPECT_LT(seconds_since(start), 1.0);
          messages[static_cast<size_t>(comm.rank())] = e.what();
        } catch (const ringreduce::Error& e) {
          // A rank whose neighbour timed out first may get that rank's notice instead.
          messages[static_cast<size_t>(comm.rank())] = e.what();
        }
        // After a failure every later op fails fast with the same cause.
        auto t = Clock::now();
        EXPECT_THROW(comm.barrier(), ringreduce::Error);
        EXPECT_LT(seconds_since(t), 0.5);
      },
      {}, 30s);
  EXPECT_NE(
      messages[3].find("rank 3: allreduce #2 (float x 1024, sum): timed out waiting for rank 2"),
      std::string::npos)
      << messages[3];
  for (int r : {0, 1})
    EXPECT_NE(messages[static_cast<size_t>(r)].find("allreduce #2"), std::string::npos)
        << messages[static_cast<size_t>(r)];
}

TEST(Comm, MismatchedDtypeOpRootAndKindAreNamedOnEveryRank) {
  struct Case {
    const char* name;
    std::function<void(Communicator&)> call;
    std::map<std::string, std::string> settings = {};
  };
  std::vector<Case> cases = {
      {"dtype",
       [](Communicator& c) {
         std::vector<double> d(64);
         c.allreduce(d.data(), d.data(), 64, c.rank() == 1 ? DataType::f32 : DataType::f64,
                     ReduceOp::sum);
       }},
      {"op",
       [](Communicator& c) {
         std::vector<float> d(64);
         c.allreduce(d.data(), d.data(), 64, DataType::f32,
                     c.rank() == 0 ? ReduceOp::max : ReduceOp::sum);
       }},
      {"root",
       [](Communicator& c) {
         std::vector<float> d(64);
         c.broadcast(d.data(), 64, DataType::f32, c.rank() == 2 ? 1 : 0);
       }},
      {"count, flat against ring",
       [](Communicator& c) {
         // Rank 2's call is large enough for the ring; the others' take the flat algorithm on
         // shared memory (or recursive doubling on TCP): different algorithms, one op.
         std::vector<float> d(1 << 20);
         c.allreduce(d.data(), d.data(), c.rank() == 2 ? d.size() : 64, DataType::f32,
                     ReduceOp::sum);
       }},
      {"count, both flat",
       [](Communicator& c) {
         std::vector<float> d(64);
         c.allreduce(d.data(), d.data(), c.rank() == 0 ? 63 : 64, DataType::f32, ReduceOp::sum);
       }},
      {"count, both direct",
       [](Communicator& c) {
         // Several rounds on rank 1, one on the others: the first stage stamp's fingerprint.
         std::vector<float> d(1 << 20);
         c.allreduce(d.data(), d.data(), c.rank() == 1 ? d.size() : 1000, DataType::f32,
                     ReduceOp::sum);
       },
       {{"RINGREDUCE_ALGO", "allreduce:direct"}}},
      {"count, striped over 3 TCP connections",
       [](Communicator& c) {
         // Different lengths cut into different stripes: whatever frame meets whatever receive,
         // every rank must hear of the mismatch, not hang on a stripe that never comes.
         std::vector<float> d(1 << 20);
         c.allreduce(d.data(), d.data(), c.rank() == 0 ? d.size() - 1000 : d.size(), DataType::f32,
                     ReduceOp::sum);
       },
       {{"RINGREDUCE_SHM", "0"}, {"RINGREDUCE_NSOCKS", "3"}}},
      {"kind",
       [](Communicator& c) {
         std::vector<float> d(64 * 3);
         if (c.rank() == 1)
           c.allgather(d.data(), d.data(), 64, DataType::f32);
         else
           c.allreduce(d.data(), d.data(), 64 * 3, DataType::f32, ReduceOp::sum);
       }},
  };
  for (auto& cs : cases) {
    std::atomic<int> mismatches{0};
    run_ranks(
        3,
        [&](Communicator& comm) {
          auto start = Clock::now();
          try {
            cs.call(comm);
            // A rank that only sends in this op cannot see the mismatch without an extra round
            // trip; it learns of it, from the rank that did, on its next call.
            comm.barrier();
            ADD_FAILURE() << cs.name << ": rank " << comm.rank() << " saw no error";
          } catch (const ringreduce::MismatchError& e) {
            EXPECT_LT(seconds_since(start), 5.0);
            EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.rank()) + ": "),
                      std::string::npos);
            ++mismatches;
          }
        },
        cs.settings, 20s);
    EXPECT_EQ(mismatches.load(), 3) << cs.name;
  }
}

// Every algorithm the tuner can pick, forced, on each transport it runs on: rank 1 issues a call
// that differs in count, dtype, op or root. Every rank must raise a MismatchError naming itself
// (a rank that only sends in the op hears of it on its next call, from the rank that saw it),
// within seconds, never a hang or a wrong result. The fingerprint rides on each op's first
// message (the frame header or the FIFO slot's tag), so there is no extra round trip to time.
struct ForcedMismatch {
  std::string algo;  // RINGREDUCE_ALGO
  std::string how;   // which field differs
  std::map<std::string, std::string> where;
};

void call_with_mismatch(Communicator& c, const ForcedMismatch& m) {
  const bool odd = c.rank() == 1;
  const size_t n = m.how == "count" && odd ? 3001 : 3000;
  const DataType t = m.how == "dtype" && odd ? DataType::i32 : DataType::f32;
  const ReduceOp op = m.how == "op" && odd ? ReduceOp::max : ReduceOp::sum;
  const int root = m.how == "root" && odd ? 2 : 0;
  const size_t blocks = static_cast<size_t>(c.size());
  std::vector<float> a(3001 * blocks, 1.0f), b(3001 * blocks, 0.0f);
  const std::string coll = m.algo.substr(0, m.algo.find(':'));
  if (coll == "allreduce")
    c.allreduce(a.data(), b.data(), n, t, op);
  else if (coll == "broadcast")
    c.broadcast(a.data(), n, t, root);
  else if (coll == "reduce")
    c.reduce(a.data(), b.data(), n, t, op, root);
  else if (coll == "reduce_scatter")
    c.reduce_scatter(a.data(), b.data(), n, t, op);
  else if (coll == "allgather")
    c.allgather(a.data(), b.data(), n, t);
  else if (coll == "alltoall")
    c.alltoall(a.data(), b.data(), n, t);
}

TEST(Comm, EveryForcedAlgorithmReportsAMismatchOnEveryRank) {
  const std::map<std::string, std::string> shm = {}, tcp = {{"RINGREDUCE_SHM", "0"}},
                                           hosts = {{"TEST_HOSTS", "2"}};
  std::vector<ForcedMismatch> cases;
  for (const char* a : {"allreduce:ring", "allreduce:rd", "allreduce:rabenseifner",
                        "allreduce:tree", "allreduce:star"})
    for (const char* how : {"count", "dtype", "op"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const char* a : {"allreduce:flat", "allreduce:direct"})
    for (const char* how : {"count", "dtype", "op"}) cases.push_back({a, how, shm});
  for (const char* how : {"count", "dtype", "op"})
    cases.push_back({"allreduce:hierarchical", how, hosts});
  for (const char* a : {"broadcast:chain", "broadcast:binomial"})
    for (const char* how : {"count", "dtype", "root"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const char* a : {"reduce:chain", "reduce:binomial"})
    for (const char* how : {"count", "op", "root"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const char* a : {"reduce_scatter:ring", "allgather:ring", "alltoall:pairwise"})
    for (const char* how : {"count", "dtype"})
      for (const auto& w : {shm, tcp}) cases.push_back({a, how, w});
  for (const auto& m : cases) {
    const std::string name = m.algo + " " + m.how + " " + (m.where.empty() ? "shm" : "tcp/mix");
    auto settings = m.where;
    settings["RINGREDUCE_ALGO"] = m.algo;
    std::atomic<int> mismatches{0};
    auto store = ringreduce::make_memory_store();
    std::vector<std::thread> threads;
    for (int r = 0; r < 4; ++r)
      threads.emplace_back([&, r] {
        auto start = Clock::now();
        try {
          const ringreduce::Options o = rank_options(r, 4, store, 10s, settings);
          // Inside the try: a rank still finishing its start-up (rank 0 passes the measured
          // costs around last) may hear of the others' mismatch there, and must report it too.
          Communicator comm(o);
          start = Clock::now();
          call_with_mismatch(comm, m);
          comm.barrier();
          ADD_FAILURE() << name << ": rank " << r << " saw no error";
        } catch (const ringreduce::MismatchError& e) {
          EXPECT_LT(seconds_since(start), 5.0) << name;
          EXPECT_EQ(std::string(e.what()).rfind("rank " + std::to_string(r) + ": ", 0), 0u)
              << name << ": " << e.what();
          EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
          ++mismatches;
        } catch (const std::exception& e) {
          ADD_FAILURE() << name << ": rank " << r << ": " << e.what();
        }
      });
    for (auto& t : threads) t.join();
    EXPECT_EQ(mismatches.load(), 4) << name;
  }
}

TEST(Comm, DeadPeerNeverStretchesAWaitPastItsDeadline) {
  // Rank 1 leaves. Rank 0 sends to it (broadcast from 0), which draws a reset, then waits on
  // rank 2, which stays silent for 3 s: every call of rank 0 must end by its 1 s deadline, not
  // spin on the dead link's events.
  run_ranks(
      3,
      [](Communicator& comm) {
        comm.barrier();
        if (comm.rank() == 1) return;
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(3000ms);
          return;
        }
        std::vector<float> buf(1000, 1.0f), out(1000);
        std::this_thread::sleep_for(200ms);  // let rank 1's close arrive
        try {
          // Fails if the close has been seen; otherwise the kernel takes the data and the reset
          // comes back afterwards.
          comm.broadcast(buf.data(), buf.size(), DataType::f32, 0);
        } catch (const ringreduce::PeerError&) {
          return;  // the communicator is aborted now; nothing further to test
        }
        std::this_thread::sleep_for(100ms);  // let the reset arrive
        auto start = Clock::now();
        EXPECT_THROW(comm.reduce(buf.data(), out.data(), buf.size(), DataType::f32, ReduceOp::sum,
                                 0, {.timeout = 1000ms}),
                     ringreduce::Error);
        EXPECT_LT(seconds_since(start), 1.5);
      },
      {}, 30s);
}

TEST(Comm, BadArgumentsNameRankAndCallAndDoNotAbort) {
  run_ranks(2, [](Communicator& comm) {
    std::vector<float> buf(16);
    try {
      comm.broadcast(buf.data(), buf.size(), DataType::f32, 5);
      ADD_FAILURE();
    } catch (const ringreduce::InvalidArgument& e) {
      EXPECT_NE(
          std::string(e.what()).find("rank " + std::to_string(comm.rank()) + ": broadcast #1"),
          std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("root 5"), std::string::npos) << e.what();
    }
    EXPECT_THROW(comm.allreduce(nullptr, nullptr, 4, DataType::f32, ReduceOp::sum),
                 ringreduce::InvalidArgument);
    EXPECT_THROW(comm.alltoall(buf.data(), buf.data(), 8, DataType::f32),
                 ringreduce::InvalidArgument);
    // The communicator is still good, and sequence numbers stayed aligned.
    comm.allreduce(std::span<float>(buf), ReduceOp::sum);
  });
}

TEST(Comm, StallWarningNamesTheRanksThatHaveNotReachedTheOpOnceAndAgainAtTheTimeout) {
  // Rank 2 reaches the second allreduce 1.5 s late, and never reaches the third. With
  // RINGREDUCE_STALL_WARN=0.4 the others warn once per op that rank 2 has not reached it, and
  // again when the third times out. Rank 2, never waiting, never warns.
  testing::internal::CaptureStderr();
  run_ranks(
      3,
      [](Communicator& comm) {
        std::vector<float> buf(1024, 1.0f);
        comm.allreduce(std::span<float>(buf), ReduceOp::sum);
        if (comm.rank() == 2) std::this_thread::sleep_for(1500ms);
        comm.allreduce(std::span<float>(buf), ReduceOp::sum);
        EXPECT_EQ(buf[0], 9.0f);
        if (comm.rank() == 2) {
          std::this_thread::sleep_for(2500ms);  // past the others' deadline
          return;
        }
        EXPECT_THROW(comm.allreduce(buf.data(), buf.data(), buf.size(), DataType::f32,
                                    ReduceOp::sum, {.timeout = 1500ms}),
                     ringreduce::Error);
        std::this_thread::sleep_for(300ms);  // the report at the timeout is made by the monitor
      },
      {{"RINGREDUCE_STALL_WARN", "0.4"}}, 30s);
  const std::string err = testing::internal::GetCapturedStderr();
  auto count = [&](const std::string& what) {
    size_t n = 0;
    for (size_t p = err.find(what); p != std::string::npos; p = err.find(what, p + 1)) ++n;
    return n;
  };
  for (int r : {0, 1}) {
    const std::string me = "rank " + std::to_string(r) + "] WARN stall: ";
    EXPECT_EQ(count(me + "allreduce #2 (float x 1024, sum) has waited"), 1u) << err;
    EXPECT_EQ(count(me + "allreduce #3 (float x 1024, sum) has waited"), 1u) << err;
    // Again at the timeout: its own, or a peer's that failed this rank's wait first.
    EXPECT_EQ(count(me + "allreduce #3 (float x 1024, sum) timed out after 1.5 s") +
                  count(me + "allreduce #3 (float x 1024, sum) failed ("),
              1u)
        << err;
  }
  // Rank 2 came last to #2 and so never waited in it: it has never left word in the store.
  EXPECT_EQ(count("not known to have reached it: rank 2 (rank 2 never reported a wait)"), 6u)
      << err;
  EXPECT_EQ(count("rank 2] WARN stall"), 0u) << err;
}

}  // namespace
}  // namespace rrtest
