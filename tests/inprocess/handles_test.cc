// Communicator::from_handles (torch's reconfigure; how newcomers join): ranks as threads swap
// Endpoint handles in memory, make a communicator with no store, use it, make another without one
// rank (a fresh uuid and fresh endpoints), shrink it; bad handle lists are InvalidArguments.
#include <barrier>
#include <thread>

#include "harness.h"
#include "rendezvous/tcp_store.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;
using ringreduce::Endpoint;

class Handles : public OverEachTransport {
 protected:
  // Rank r's settings for this transport (TEST_HOSTS spelled out, as rank_options does).
  ringreduce::Options options(int r) const {
    ringreduce::Options o;
    o.settings = transport();
    if (auto it = o.settings.find("TEST_HOSTS"); it != o.settings.end()) {
      o.settings["RINGREDUCE_HOST_ID"] =
          "emulated-host-" + std::to_string(r % std::stoi(it->second));
      o.settings.erase("TEST_HOSTS");
    }
    o.timeout = std::chrono::seconds(20);
    return o;
  }
};

int64_t sum_of_ranks_plus_one(Communicator& c, const std::vector<int>& who) {
  std::vector<int64_t> v(10000, who[static_cast<size_t>(c.rank())] + 1);
  c.allreduce(std::span<int64_t>(v), ringreduce::ReduceOp::sum);
  return v.back();
}

TEST_P(Handles, RanksMakeACommunicatorFromHandlesAndAgainWithoutOne) {
  const int n = 3;
  std::vector<std::string> handles(n), again(n - 1);
  std::barrier sync(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Endpoint e(options(r));
        handles[static_cast<size_t>(r)] = e.handle();
        sync.arrive_and_wait();
        Communicator c = Communicator::from_handles(std::move(e), 1, handles, options(r));
        EXPECT_EQ(c.rank(), r);
        EXPECT_EQ(c.size(), n);
        EXPECT_EQ(sum_of_ranks_plus_one(c, {0, 1, 2}), 6);
        // No store: split says why.
        EXPECT_THROW(c.split(0, 0), ringreduce::InvalidArgument);
        sync.arrive_and_wait();
        if (r == 2) {
          sync.arrive_and_wait();
          return;  // leaves; the others reconfigure without it
        }
        Endpoint f(options(r));
        again[static_cast<size_t>(r)] = f.handle();
        sync.arrive_and_wait();
        Communicator d = Communicator::from_handles(std::move(f), 2, again, options(r));
        EXPECT_EQ(d.size(), 2);
        EXPECT_EQ(sum_of_ranks_plus_one(d, {0, 1}), 3);
        // It has a control plane: agree works on it.
        EXPECT_TRUE(d.agree(true).flag);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

INSTANTIATE_TEST_SUITE_P(Transports, Handles, ::testing::ValuesIn(rrtest::transports()));

TEST(HandlesBad, ListsWithoutThisRankTwiceOrNotAHandleAreInvalidArguments) {
  Endpoint a, b;
  const std::vector<std::string> without = {b.handle()};
  auto expect = [](const std::function<void()>& f, const std::string& says) {
    try {
      f();
      ADD_FAILURE() << "no error; expected: " << says;
    } catch (const ringreduce::InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  expect([&] { Communicator::from_handles(Endpoint(), 1, without); }, "not among the 1 handles");
  const std::vector<std::string> twice = {a.handle(), a.handle()};
  expect([&] { Communicator::from_handles(std::move(a), 1, twice); },
         "handles[1] is in the list twice");
  const std::vector<std::string> junk = {b.handle(), "hello"};
  expect([&] { Communicator::from_handles(std::move(b), 1, junk); }, "handles[1] is not a handle");
  // Alone: a communicator of one.
  Endpoint c;
  const std::vector<std::string> one = {c.handle()};
  Communicator solo = Communicator::from_handles(std::move(c), 9, one);
  EXPECT_EQ(solo.size(), 1);
  float x = 2;
  solo.allreduce(&x, &x, 1, ringreduce::DataType::f32, ringreduce::ReduceOp::sum);
  EXPECT_EQ(x, 2.0f);
}

}  // namespace
}  // namespace rrtest

// ---- grow: newcomers join a running communicator through the job's store ---------------------

namespace rrtest {
namespace {

TEST(Grow, NewcomersJoinAndTheGrownCommunicatorIsExact) {
  auto store = ringreduce::make_memory_store();
  const std::string prefix = unique_prefix();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(5);
  auto grown_check = [](Communicator& g) {
    EXPECT_EQ(g.size(), 5);
    std::vector<int64_t> v(20000, g.rank() + 1);
    g.allreduce(std::span<int64_t>(v), ringreduce::ReduceOp::sum);
    EXPECT_EQ(v.back(), 15);
    // The grown communicator keeps the job's store: it can grow again, and split.
    Communicator half = g.split(g.rank() % 2, 0);
    EXPECT_EQ(half.size(), g.rank() % 2 ? 2 : 3);
  };
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator c(rank_options(r, 3, store, std::chrono::seconds(20), {}, prefix));
        Communicator g = c.grow("more", 2);
        EXPECT_EQ(g.rank(), r);  // members keep their ranks
        grown_check(g);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&, i] {
      try {
        ringreduce::Options o;
        o.store = store;
        o.store_prefix = prefix;
        o.timeout = std::chrono::seconds(20);
        Communicator g = Communicator::join("more", o);
        EXPECT_GE(g.rank(), 3);
        grown_check(g);
      } catch (...) {
        errors[static_cast<size_t>(3 + i)] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(Grow, AReplacementJoinsTheSurvivorsOfAShrinkAndResultsAreExactAgain) {
  auto store = ringreduce::make_memory_store();
  const std::string prefix = unique_prefix();
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(5);
  for (int r = 0; r < 4; ++r)
    threads.emplace_back([&, r] {
      try {
        Communicator c(rank_options(r, 4, store, std::chrono::seconds(20), {}, prefix));
        std::vector<int64_t> v(1000, 1);
        c.allreduce(std::span<int64_t>(v), ringreduce::ReduceOp::sum);
        if (r == 1) return;  // gone
        try {
          for (int i = 0; i < 1000; ++i)
            c.allreduce(std::span<int64_t>(v), ringreduce::ReduceOp::sum);
        } catch (const ringreduce::Error&) {
        }
        Communicator small = c.shrink();
        ASSERT_EQ(small.size(), 3);
        Communicator again = small.grow("replace-1", 1);
        ASSERT_EQ(again.size(), 4);
        std::vector<int64_t> w(5000, again.rank() + 1);
        again.allreduce(std::span<int64_t>(w), ringreduce::ReduceOp::sum);
        EXPECT_EQ(w.back(), 10);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  threads.emplace_back([&] {
    try {
      ringreduce::Options o;
      o.store = store;
      o.store_prefix = prefix;
      o.timeout = std::chrono::seconds(20);
      Communicator g = Communicator::join("replace-1", o);
      EXPECT_EQ(g.rank(), 3);
      std::vector<int64_t> w(5000, g.rank() + 1);
      g.allreduce(std::span<int64_t>(w), ringreduce::ReduceOp::sum);
      EXPECT_EQ(w.back(), 10);
    } catch (...) {
      errors[4] = std::current_exception();
    }
  });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

TEST(Grow, MembersThatDisagreeAnExtraNewcomerAndAMissingOneAreNamed) {
  auto store = ringreduce::make_memory_store();
  const std::string prefix = unique_prefix();
  std::vector<std::thread> threads;
  std::vector<std::string> said(6);
  auto opts = [&] {
    ringreduce::Options o;
    o.store = store;
    o.store_prefix = prefix;
    o.timeout = std::chrono::milliseconds(1500);
    return o;
  };
  for (int r = 0; r < 3; ++r)
    threads.emplace_back([&, r] {
      Communicator c(rank_options(r, 3, store, std::chrono::milliseconds(1500), {}, prefix));
      // Disagreeing members: rank 2 says 2 newcomers where the others say 1.
      try {
        c.grow("bad", r == 2 ? 2 : 1);
      } catch (const ringreduce::Error& e) {
        said[static_cast<size_t>(r)] = e.what();
      }
      // Nobody joins "lonely": a timeout naming the newcomer that did not come.
      try {
        c.grow("lonely", 1);
      } catch (const ringreduce::Error& e) {
        if (r == 0) said[3] = e.what();
      }
      // One newcomer admitted, two come: the second is told.
      try {
        Communicator g = c.grow("one", 1);
        EXPECT_EQ(g.size(), 4);
      } catch (const ringreduce::Error& e) {
        ADD_FAILURE() << e.what();
      }
    });
  // The newcomer of "bad" (so that only the disagreement fails it).
  threads.emplace_back([&] {
    try {
      Communicator::join("bad", opts());
    } catch (const ringreduce::Error& e) {
      said[4] = e.what();
    }
  });
  std::atomic<int> joined{0};
  std::string extra;
  for (int i = 0; i < 2; ++i)
    threads.emplace_back([&] {
      try {
        ringreduce::Options o = opts();
        o.timeout = std::chrono::seconds(20);  // the members get to "one" after two failures
        Communicator g = Communicator::join("one", o);
        ++joined;
      } catch (const ringreduce::Error& e) {
        extra = e.what();
      }
    });
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r)
    EXPECT_NE(said[static_cast<size_t>(r)].find("member rank 2 called grow with 2 newcomers"),
              std::string::npos)
        << said[static_cast<size_t>(r)];
  EXPECT_NE(said[4].find("member rank 2 called grow with 2"), std::string::npos) << said[4];
  EXPECT_NE(said[3].find("newcomer 1 of 1 (never called"), std::string::npos) << said[3];
  EXPECT_EQ(joined.load(), 1);
  EXPECT_NE(extra.find("came as newcomer 2, and the members admit fewer"), std::string::npos)
      << extra;
}

// With RINGREDUCE_TOKEN: a newcomer with another token is refused by the store at once, and the
// members' grow names the newcomer that did not come.
TEST(Grow, ANewcomerWithTheWrongTokenIsRefusedAndNamed) {
  ringreduce::rendezvous::TcpStoreServer server("127.0.0.1", 0, "the-token");
  setenv("RINGREDUCE_STORE_SERVER", "0", 1);
  const std::string addr = "127.0.0.1:" + std::to_string(server.port());
  std::vector<std::thread> threads;
  std::vector<std::string> said(3);
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      ringreduce::Options o;
      o.rank = r;
      o.world_size = 2;
      o.addr = addr;
      o.token = "the-token";
      o.timeout = std::chrono::milliseconds(2000);
      try {
        Communicator c(o);
        c.grow("tok", 1);
      } catch (const ringreduce::Error& e) {
        said[static_cast<size_t>(r)] = e.what();
      }
    });
  threads.emplace_back([&] {
    ringreduce::Options o;
    o.addr = addr;
    o.token = "not-the-token";
    o.timeout = std::chrono::milliseconds(2000);
    try {
      Communicator::join("tok", o);
    } catch (const ringreduce::Error& e) {
      said[2] = e.what();
    }
  });
  for (auto& t : threads) t.join();
  unsetenv("RINGREDUCE_STORE_SERVER");
  EXPECT_NE(said[0].find("newcomer 1 of 1"), std::string::npos) << said[0];
  EXPECT_NE(said[0].find("RINGREDUCE_TOKEN"), std::string::npos) << said[0];
  EXPECT_NE(said[1].find("grow 'tok'"), std::string::npos) << said[1];
  EXPECT_NE(said[2].find("join 'tok': the job's store"), std::string::npos) << said[2];
}

}  // namespace
}  // namespace rrtest
