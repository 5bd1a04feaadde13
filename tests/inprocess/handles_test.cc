// Communicator::from_handles (torch's reconfigure; how newcomers join): ranks as threads swap
// Endpoint handles in memory, make a communicator with no store, use it, make another without one
// rank (a fresh uuid and fresh endpoints), shrink it; bad handle lists are InvalidArguments.
#include <barrier>
#include <thread>

#include "harness.h"

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

INSTANTIATE_TEST_SUITE_P(Transports, Handles, ::testing::Values("shm", "tcp", "mix"));

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
