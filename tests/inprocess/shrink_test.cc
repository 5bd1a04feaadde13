// Communicator::agree and Communicator::shrink with ranks as threads, over shared memory, TCP and
// two emulated hosts. A rank "dies" by destroying its communicator (its peers see it gone, as
// they see a process exit: the closed flag on shared memory, closed sockets on TCP and on the
// control plane). Process deaths (SIGKILL) are launch.shrink-*'s (tests/multiprocess).
#include <set>
#include <thread>

#include "harness.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/ringreduce.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;
using ringreduce::ShrinkFlags;

class Shrink : public OverEachTransport {};

// An allreduce whose result is exact: every rank adds rank + 1 (its rank in `comm`).
void check_allreduce(Communicator& comm, size_t count = 50000) {
  std::vector<int64_t> v(count, comm.rank() + 1);
  comm.allreduce(std::span<int64_t>(v), ReduceOp::sum);
  const int64_t want = static_cast<int64_t>(comm.size()) * (comm.size() + 1) / 2;
  ASSERT_EQ(v.front(), want);
  ASSERT_EQ(v.back(), want);
}

// Calls allreduce until it fails (a peer went away); bounded.
std::string until_failure(Communicator& comm) {
  std::vector<int64_t> v(1000, 1);
  for (int i = 0; i < 10000; ++i) {
    try {
      comm.allreduce(std::span<int64_t>(v), ReduceOp::sum);
    } catch (const ringreduce::Error& e) {
      return e.what();
    }
  }
  return "";
}

TEST_P(Shrink, AgreeIsTheAndOfTheFlagsOnEveryRank) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        check_allreduce(comm);
        ringreduce::Agreement a = comm.agree(comm.rank() != 2);
        EXPECT_FALSE(a.flag);
        EXPECT_TRUE(a.failed.empty());
        EXPECT_EQ(a.completed_min, a.completed_max);
        ringreduce::Agreement b = comm.agree(true);
        EXPECT_TRUE(b.flag);
        // The communicator is untouched.
        check_allreduce(comm);
      },
      transport());
}

TEST_P(Shrink, SurvivorsOfAGoneRankShrinkAndGoOnExactly) {
  const int n = 5, gone = 2;
  run_ranks(
      n,
      [&](Communicator& comm) {
        check_allreduce(comm);
        if (comm.rank() == gone) return;  // its communicator is destroyed: gone
        const std::string what = until_failure(comm);
        ASSERT_NE(what, "");
        EXPECT_NE(what.find("rank 2"), std::string::npos) << what;
        const auto t0 = std::chrono::steady_clock::now();
        Communicator small = comm.shrink();
        const double took =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        EXPECT_LT(took, 5.0);
        ASSERT_EQ(small.size(), n - 1);
        EXPECT_EQ(small.rank(), comm.rank() < gone ? comm.rank() : comm.rank() - 1);
        EXPECT_EQ(small.parent_ranks(), (std::vector<int>{0, 1, 3, 4}));
        for (int i = 0; i < 5; ++i) check_allreduce(small, i % 2 ? 1 << 20 : 7);
        // The parent is aborted by the shrink.
        EXPECT_NE(comm.error(), nullptr);
        // Point to point and a second shrink on the survivors' communicator.
        std::vector<int32_t> x(4, small.rank()), y(4);
        ringreduce::Work s =
            small.send_async(x.data(), 4, DataType::i32, (small.rank() + 1) % small.size(), 9);
        small.recv(y.data(), 4, DataType::i32, (small.rank() + small.size() - 1) % small.size(), 9);
        s.wait();
        EXPECT_EQ(y[0], (small.rank() + small.size() - 1) % small.size());
        if (small.rank() == 0) return;  // the old rank 0 goes too, cleanly this time
        until_failure(small);
        Communicator smaller = small.shrink();
        ASSERT_EQ(smaller.size(), n - 2);
        EXPECT_EQ(smaller.parent_ranks(), (std::vector<int>{1, 2, 3}));
        check_allreduce(smaller);
      },
      transport(), std::chrono::seconds(20));
}

TEST_P(Shrink, TwoGoneAtOnceAndRankZeroAmongThem) {
  run_ranks(
      6,
      [&](Communicator& comm) {
        check_allreduce(comm);
        if (comm.rank() == 0 || comm.rank() == 3) return;
        until_failure(comm);
        Communicator small = comm.shrink();
        ASSERT_EQ(small.size(), 4);
        EXPECT_EQ(small.parent_ranks(), (std::vector<int>{1, 2, 4, 5}));
        check_allreduce(small, 100000);
        ringreduce::Agreement a = small.agree();
        EXPECT_TRUE(a.flag);
        EXPECT_TRUE(a.failed.empty());
      },
      transport(), std::chrono::seconds(20));
}

TEST_P(Shrink, AgreeNamesTheRanksThatAreGone) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        check_allreduce(comm);
        if (comm.rank() == 1) return;
        ringreduce::Agreement a = comm.agree(true);
        EXPECT_TRUE(a.flag);
        EXPECT_EQ(a.failed, std::vector<int>{1});
      },
      transport(), std::chrono::seconds(20));
}

TEST_P(Shrink, AnExcludedRankThatGoesOnCallingFailsAtOnceNamingTheShrink) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        check_allreduce(comm);
        const int excluded = 3;
        if (comm.rank() == excluded) {
          const auto t0 = std::chrono::steady_clock::now();
          const std::string what = until_failure(comm);
          const double took =
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          EXPECT_NE(what.find("shrink"), std::string::npos) << what;
          EXPECT_LT(took, 5.0) << what;
          // And a shrink of its own is refused: it is not among the ranks that remain.
          const int me[1] = {excluded};
          EXPECT_THROW(comm.shrink(me), ringreduce::InvalidArgument);
          return;
        }
        const int ex[1] = {excluded};
        Communicator small = comm.shrink(ex);
        ASSERT_EQ(small.size(), 3);
        check_allreduce(small);
      },
      transport(), std::chrono::seconds(20));
}

// Bad input: an InvalidArgument on every rank at once, naming the rank and the call.
TEST_P(Shrink, BadExcludeListsFailEveryRankAtOnce) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        check_allreduce(comm);
        const int me = comm.rank();
        auto expect_invalid = [&](std::span<const int> ex, const std::string& says,
                                  ShrinkFlags flags = ShrinkFlags::none) {
          const auto t0 = std::chrono::steady_clock::now();
          try {
            comm.shrink(ex, flags);
            ADD_FAILURE() << "rank " << me << ": shrink succeeded; expected: " << says;
          } catch (const ringreduce::InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(me) + ": shrink"),
                      std::string::npos)
                << e.what();
            EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
          }
          EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                    5.0);
        };
        const int out_of_range[1] = {7};
        expect_invalid(out_of_range, "not a rank of this communicator");
        const int twice[2] = {1, 1};
        expect_invalid(twice, "twice");
        // Lists that differ among ranks that remain: rank 3 goes, ranks 0 and 1 exclude it,
        // rank 2 passes none (so counts it among the survivors until it finds it gone).
        if (me == 3) return;
        const int three[1] = {3};
        if (me == 2)
          expect_invalid({}, "different exclude lists");
        else
          expect_invalid(three, "different exclude lists");
      },
      transport(), std::chrono::seconds(20));
}

// An excluded rank that calls shrink with a list of its own (here one excluding rank 2 instead)
// is told it is excluded; the others are not disturbed.
TEST_P(Shrink, AnExcludedRankWithAListOfItsOwnIsToldAndTheOthersGoOn) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        check_allreduce(comm);
        const int me = comm.rank();
        const int two[1] = {2}, three[1] = {3};
        if (me == 3) {
          try {
            comm.shrink(two);
            ADD_FAILURE() << "the excluded rank's shrink succeeded";
          } catch (const ringreduce::Error& e) {
            EXPECT_NE(std::string(e.what()).find("goes on without this rank"), std::string::npos)
                << e.what();
          }
          return;
        }
        Communicator small = comm.shrink(three);
        ASSERT_EQ(small.size(), 3);
        check_allreduce(small);
      },
      transport(), std::chrono::seconds(20));
}

TEST_P(Shrink, AnOpOutstandingIsRefusedUnlessTheAbortFlagIsGiven) {
  run_ranks(
      3,
      [&](Communicator& comm) {
        check_allreduce(comm);
        std::vector<float> big(1 << 20, 1.0f);
        ringreduce::Work w;
        // Rank 1 has an allreduce outstanding that the others never join.
        if (comm.rank() == 1) w = comm.allreduce_async(std::span<float>(big), ReduceOp::sum);
        try {
          comm.shrink();
          ADD_FAILURE() << "shrink with an op outstanding on rank 1 succeeded";
        } catch (const ringreduce::InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("outstanding"), std::string::npos) << e.what();
          if (comm.rank() != 1) {
            EXPECT_NE(std::string(e.what()).find("rank 1 refused"), std::string::npos) << e.what();
          }
        }
        // Every rank is past its first allreduce (the abort below would fail a peer still in
        // it): agree() is a barrier that needs no healthy links.
        EXPECT_TRUE(comm.agree().flag);
        // With the abort flag the op fails and the shrink goes through.
        Communicator same = comm.shrink({}, ShrinkFlags::abort);
        if (comm.rank() == 1) {
          EXPECT_THROW(w.wait(), ringreduce::Error);
        }
        ASSERT_EQ(same.size(), 3);
        check_allreduce(same);
      },
      transport(), std::chrono::seconds(20));
}

TEST_P(Shrink, AbortFromAnotherThreadEndsABlockedCallAndDestructionNeverWaits) {
  run_ranks(
      3,
      [&](Communicator& comm) {
        check_allreduce(comm);
        // The abort hook runs once, with the error, on every rank: the one that aborts and the
        // ones whose op fails with its notice.
        std::atomic<int> hooked{0};
        std::string hooked_with;
        comm.on_abort([&](std::exception_ptr e) {
          ++hooked;
          try {
            std::rethrow_exception(e);
          } catch (const ringreduce::Error& x) {
            hooked_with = x.what();
          }
        });
        if (comm.rank() != 0) {
          // Ranks 1 and 2 wait in a call that rank 0 never makes; rank 0's abort reaches them.
          std::vector<float> v(1000, 1.0f);
          EXPECT_THROW(comm.allreduce(std::span<float>(v), ReduceOp::sum), ringreduce::Error);
          EXPECT_NE(comm.error(), nullptr);
          // With the error that aborted it: rank 0's reason, or, where rank 0's communicator was
          // gone before its notice was read, that it is gone.
          EXPECT_EQ(hooked.load(), 1);
          try {
            std::rethrow_exception(comm.error());
          } catch (const ringreduce::Error& e) {
            EXPECT_EQ(hooked_with, e.what());
          }
          return;
        }
        std::vector<float> v(1000, 1.0f);
        std::thread t([&] {
          std::this_thread::sleep_for(std::chrono::milliseconds(200));
          comm.abort("the trainer gave up");
        });
        const auto t0 = std::chrono::steady_clock::now();
        // Rank 0 waits for a receive from rank 1 that never comes.
        EXPECT_THROW(comm.recv(v.data(), 10, DataType::f32, 1, 77), ringreduce::Error);
        t.join();
        EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                  2.0);
        ASSERT_NE(comm.error(), nullptr);
        EXPECT_EQ(hooked.load(), 1);
        try {
          std::rethrow_exception(comm.error());
        } catch (const ringreduce::Error& e) {
          EXPECT_NE(std::string(e.what()).find("the trainer gave up"), std::string::npos);
        }
      },
      transport(), std::chrono::seconds(20));
}

INSTANTIATE_TEST_SUITE_P(Transports, Shrink, ::testing::ValuesIn(rrtest::transports()));

// The C ABI: agree, shrink after a rank is gone, the error and the timeout, bad input as codes.
TEST(ShrinkCApi, AgreeShrinkErrorAndTimeoutThroughTheCAbi) {
  ringreduce::rendezvous::TcpStoreServer server("127.0.0.1", 0);
  setenv("RINGREDUCE_STORE_SERVER", "0", 1);
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  setenv("RINGREDUCE_ADDR", addr.c_str(), 1);  // for the newcomer's rr_comm_join
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      rr_comm_t* comm = nullptr;
      ASSERT_EQ(rr_comm_init(&comm, r, 3, addr.c_str(), nullptr, 20), RR_OK)
          << rr_last_error(nullptr);
      EXPECT_EQ(rr_comm_set_timeout(comm, 0), RR_ERR_INVALID_ARGUMENT);
      EXPECT_EQ(rr_comm_set_timeout(comm, 15), RR_OK);
      EXPECT_EQ(rr_comm_get_error(comm), RR_OK);
      int flag = r != 1;
      int failed[4] = {-1, -1, -1, -1};
      size_t n_failed = 99;
      ASSERT_EQ(rr_comm_agree(comm, &flag, failed, 4, &n_failed), RR_OK) << rr_last_error(comm);
      EXPECT_EQ(flag, 0);
      EXPECT_EQ(n_failed, 0u);
      if (r == 1) {  // gone
        rr_comm_destroy(comm);
        return;
      }
      std::vector<float> v(1000, 1.0f);
      while (rr_allreduce(comm, v.data(), v.data(), v.size(), RR_F32, RR_SUM) == RR_OK) {
      }
      EXPECT_EQ(rr_comm_get_error(comm), RR_ERR_PEER) << rr_last_error(comm);
      const int bad[1] = {5};
      rr_comm_t* small = nullptr;
      EXPECT_EQ(rr_comm_shrink(comm, bad, 1, RR_SHRINK_DEFAULT, &small), RR_ERR_INVALID_ARGUMENT);
      EXPECT_NE(std::string(rr_last_error(comm)).find("not a rank"), std::string::npos);
      flag = 1;
      ASSERT_EQ(rr_comm_agree(comm, &flag, failed, 4, &n_failed), RR_OK) << rr_last_error(comm);
      EXPECT_EQ(n_failed, 1u);
      EXPECT_EQ(failed[0], 1);
      ASSERT_EQ(rr_comm_shrink(comm, nullptr, 0, RR_SHRINK_DEFAULT, &small), RR_OK)
          << rr_last_error(comm);
      rr_comm_destroy(comm);
      ASSERT_NE(small, nullptr);
      EXPECT_EQ(rr_comm_size(small), 2);
      float x = 1;
      EXPECT_EQ(rr_allreduce(small, &x, &x, 1, RR_F32, RR_SUM), RR_OK) << rr_last_error(small);
      EXPECT_EQ(x, 2.0f);
      // A replacement joins (the thread below): three again.
      rr_comm_t* grown = nullptr;
      ASSERT_EQ(rr_comm_grow(small, "c-replace", 1, &grown), RR_OK) << rr_last_error(small);
      rr_comm_destroy(small);
      x = 1;
      EXPECT_EQ(rr_allreduce(grown, &x, &x, 1, RR_F32, RR_SUM), RR_OK) << rr_last_error(grown);
      EXPECT_EQ(x, 3.0f);
      rr_comm_destroy(grown);
    });
  }
  threads.emplace_back([&] {
    // The newcomer finds the job's store through the environment, as a launched process would.
    rr_comm_t* joined = nullptr;
    ASSERT_EQ(rr_comm_join("c-replace", &joined), RR_OK) << rr_last_error(nullptr);
    EXPECT_EQ(rr_comm_rank(joined), 2);
    float x = 1;
    EXPECT_EQ(rr_allreduce(joined, &x, &x, 1, RR_F32, RR_SUM), RR_OK) << rr_last_error(joined);
    EXPECT_EQ(x, 3.0f);
    rr_comm_destroy(joined);
  });
  for (auto& t : threads) t.join();
  unsetenv("RINGREDUCE_STORE_SERVER");
  unsetenv("RINGREDUCE_ADDR");
}

}  // namespace
}  // namespace rrtest
