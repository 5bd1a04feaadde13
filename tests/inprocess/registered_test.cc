// Communicator::alloc / free and the registered allreduce: results exact in and out of place, at
// offsets inside an allocation, for counts that do not divide by N and below N, every dtype's
// path through avg and max; large calls whose units ranks take as they come free, counted alike
// across calls of every kind; a call where one rank's buffers are not registered (every rank falls
// back alike, seen in the timeline); free's checks on every rank, free(nullptr); an allocation
// failing on one rank; free after an abort; ordinary memory across hosts.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>

#include "harness.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;

// The timeline of rank r (RINGREDUCE_TIMELINE=<dir>/t.%r.json; ranks that are threads of one
// process are told apart by ".commK" before ".json"), as text.
std::string timeline(const std::string& dir, int r) {
  std::stringstream s;
  const std::string name = "t." + std::to_string(r) + ".";
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().filename().string().starts_with(name)) s << std::ifstream(e.path()).rdbuf();
  return s.str();
}

// A directory of its own for the timelines, removed with what is in it.
struct TempDir {
  std::string path;
  TempDir() {
    char t[] = "/tmp/rr-registered-XXXXXX";
    path = mkdtemp(t);
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

TEST(Registered, AllreduceInRegisteredMemoryIsExactInAndOutOfPlace) {
  for (int n : {2, 3, 4}) {
    TempDir dir;
    run_ranks(n,
              [&](Communicator& comm) {
                const int me = comm.rank();
                // Counts: not a multiple of N, above the registered threshold; and one below N,
                // forced through the algorithm by RINGREDUCE_ALGO below (every slice but one
                // empty).
                for (size_t count : {size_t{100003}, size_t{2}}) {
                  auto* send = static_cast<int32_t*>(comm.alloc(count * 4 + 4096));
                  auto* recv = static_cast<int32_t*>(comm.alloc(count * 4));
                  // At an offset inside the allocation that differs by rank.
                  int32_t* in = send + 16 * me;
                  for (size_t i = 0; i < count; ++i)
                    in[i] = static_cast<int32_t>((i % 97) * (me + 1));
                  comm.allreduce(in, recv, count, DataType::i32, ReduceOp::sum);
                  const int32_t sum_ranks = n * (n + 1) / 2;
                  for (size_t i = 0; i < count; ++i)
                    ASSERT_EQ(recv[i], static_cast<int32_t>(i % 97) * sum_ranks) << "element " << i;
                  comm.allreduce(in, in, count, DataType::i32, ReduceOp::max);  // in place
                  for (size_t i = 0; i < count; ++i)
                    ASSERT_EQ(in[i], static_cast<int32_t>(i % 97) * n) << "element " << i;
                  comm.free(recv);
                  comm.free(send);
                }
                // avg of floats whose sum is exact, async.
                const size_t count = 70001;
                auto* buf = static_cast<float*>(comm.alloc(count * sizeof(float)));
                for (size_t i = 0; i < count; ++i) buf[i] = static_cast<float>(me * 2);
                comm.allreduce_async(buf, buf, count, DataType::f32, ReduceOp::avg).wait();
                for (size_t i = 0; i < count; ++i) ASSERT_EQ(buf[i], static_cast<float>(n - 1));
                comm.free(buf);
              },
              {{"RINGREDUCE_ALGO", "allreduce:registered"},
               {"RINGREDUCE_TIMELINE", dir.path + "/t.%r.json"}});
    // Every rank reduced its slice in place: the "reduce" phase, never the ring's fallback.
    for (int r = 0; r < n; ++r) {
      const std::string t = timeline(dir.path, r);
      EXPECT_NE(t.find("\"reduce\""), std::string::npos) << "rank " << r << " at N = " << n;
      EXPECT_EQ(t.find("not registered"), std::string::npos) << "rank " << r << " at N = " << n;
    }
  }
}

// The first element where got differs from want, or count: one memcmp (cheap under the
// sanitizers, which check a range at once), then the search only on a failure.
size_t first_difference(const int32_t* got, const std::vector<int32_t>& want, size_t count) {
  if (std::memcmp(got, want.data(), count * sizeof(int32_t)) == 0) return count;
  size_t i = 0;
  while (i < count && got[i] == want[i]) ++i;
  return i;
}

// Large calls are cut into units that ranks take as they come free, from counters in every
// rank's page (one per rank's range) that carry the call they count for: a count left by an
// earlier call (units, static slices, a fallback that takes none) must read as none taken, or a
// later call's units would be skipped or done twice.
TEST(Registered, LargeCallsTakeUnitsAndEveryRankCountsThemAlike) {
  // Under the sanitizers N = 3 alone (units that do not divide by N): 11 s for all four there.
  for (int n : ranks_in_matrix({2, 3, 4, 6}, {3})) {
    run_ranks(n,
              [&](Communicator& comm) {
                const int me = comm.rank();
                // Just over N MiB, where units start: 4N + 1 units of 256 KiB, the last one
                // short, in ranges of ceil((4N + 1) / N) = 5 units (at N = 6 the last rank's range
                // is empty); and 400 KB: static slices.
                const size_t large = static_cast<size_t>(n) * 262144 + 7, small = 100003;
                auto* buf = static_cast<int32_t*>(comm.alloc(large * 4));
                auto* out = static_cast<int32_t*>(comm.alloc(large * 4));
                std::vector<int32_t> plain(large), input(large), sum(large), max(large);
                for (size_t i = 0; i < large; ++i) {
                  const auto v = static_cast<int32_t>(i % 89);
                  input[i] = v * (me + 1);
                  sum[i] = v * (n * (n + 1) / 2);
                  max[i] = v * n;
                }
                // Units, static slices, units; a fallback (the last rank's ordinary buffer: every
                // rank falls back, no unit is taken); units again.
                for (size_t count : {large, small, large, size_t{0}, large}) {
                  if (count == 0) {
                    int32_t* mine = me == n - 1 ? plain.data() : buf;
                    std::memcpy(mine, input.data(), large * 4);
                    comm.allreduce(mine, mine, large, DataType::i32, ReduceOp::sum);
                    ASSERT_EQ(first_difference(mine, sum, large), large) << "the fallback";
                    continue;
                  }
                  std::memcpy(buf, input.data(), count * 4);
                  comm.allreduce(buf, out, count, DataType::i32, ReduceOp::sum);
                  ASSERT_EQ(first_difference(out, sum, count), count) << "sum of " << count;
                  comm.allreduce(buf, buf, count, DataType::i32, ReduceOp::max);  // in place
                  ASSERT_EQ(first_difference(buf, max, count), count) << "max of " << count;
                }
                comm.free(out);
                comm.free(buf);
              },
              {{"RINGREDUCE_ALGO", "allreduce:registered"}});
  }
}

TEST(Registered, TheTunerTakesLargeAllreducesOnlyWhileMemoryIsRegistered) {
  TempDir dir;
  run_ranks(2,
            [&](Communicator& comm) {
              std::vector<float> plain(1 << 16, 1.0f);
              comm.allreduce(std::span<float>(plain), ReduceOp::sum);  // nothing registered: not it
              auto* buf = static_cast<float*>(comm.alloc(plain.size() * sizeof(float)));
              std::fill(buf, buf + plain.size(), 1.0f);
              comm.allreduce(buf, buf, plain.size(), DataType::f32, ReduceOp::sum);
              EXPECT_EQ(buf[plain.size() - 1], 2.0f);
              comm.free(buf);
              // A call of the same shape once nothing is registered: planned afresh (the ring),
              // not the plan kept from the call before (CommImpl::call).
              comm.allreduce(std::span<float>(plain), ReduceOp::sum);
              EXPECT_EQ(plain.back(), 4.0f);
            },
            {{"RINGREDUCE_TIMELINE", dir.path + "/t.%r.json"}});
  for (int r = 0; r < 2; ++r) {
    const std::string t = timeline(dir.path, r);
    // One allreduce with the registered algorithm's handshake (the call on registered memory).
    size_t at = t.find("\"handshake\""), count = 0;
    for (; at != std::string::npos; at = t.find("\"handshake\"", at + 1)) ++count;
    EXPECT_EQ(count, 1u) << "rank " << r;
  }
}

TEST(Registered, OneRanksOrdinaryBufferMakesEveryRankFallBackAlike) {
  TempDir dir;
  const int n = 3;
  run_ranks(n,
            [&](Communicator& comm) {
              const size_t count = 50000;
              std::vector<int64_t> plain(count);
              auto* reg = static_cast<int64_t*>(comm.alloc(count * 8));
              int64_t* buf = comm.rank() == 1 ? plain.data() : reg;
              for (size_t i = 0; i < count; ++i) buf[i] = static_cast<int64_t>(i) + comm.rank();
              comm.allreduce(buf, buf, count, DataType::i64, ReduceOp::sum);
              for (size_t i = 0; i < count; ++i)
                ASSERT_EQ(buf[i], 3 * static_cast<int64_t>(i) + 3) << "element " << i;
              comm.free(reg);
            },
            {{"RINGREDUCE_TIMELINE", dir.path + "/t.%r.json"}});
  for (int r = 0; r < n; ++r)
    EXPECT_NE(timeline(dir.path, r).find("not registered"), std::string::npos) << "rank " << r;
}

TEST(Registered, FreeOfAPointerAllocDidNotReturnFailsOnEveryRankNamingIt) {
  run_ranks(3, [&](Communicator& comm) {
    void* p = comm.alloc(0);  // zero bytes: a valid pointer all the same
    ASSERT_NE(p, nullptr);
    int other = 0;
    try {
      comm.free(comm.rank() == 1 ? &other : p);
      FAIL() << "free accepted a pointer alloc() did not return";
    } catch (const ringreduce::InvalidArgument& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank " + std::to_string(comm.rank()) + ": free: "), std::string::npos)
          << what;
      EXPECT_NE(what.find(comm.rank() == 1 ? "this pointer" : "rank 1 passed"), std::string::npos)
          << what;
    }
    // The communicator is still good, and the memory still allocated.
    comm.free(p);
    comm.free(nullptr);  // null on every rank: nothing to do, as free(NULL)
    std::vector<int32_t> x(10, 1);
    comm.allreduce(std::span<int32_t>(x), ReduceOp::sum);
    EXPECT_EQ(x[9], 3);
  });
}

TEST(Registered, AnAllocationFailingOnOneRankFailsOnEveryRankNamingIt) {
  run_ranks(3, [&](Communicator& comm) {
    const size_t bytes = comm.rank() == 1 ? (size_t{1} << 62) + 1 : 4096;
    try {
      comm.alloc(bytes);
      FAIL() << "an impossible allocation succeeded";
    } catch (const ringreduce::Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("rank " + std::to_string(comm.rank()) + ": alloc: "), std::string::npos)
          << what;
      EXPECT_NE(what.find(comm.rank() == 1 ? "more than 2^62 bytes" : "rank 1 could not allocate"),
                std::string::npos)
          << what;
    }
    // Nothing is left allocated, and the communicator goes on.
    auto* x = static_cast<int32_t*>(comm.alloc(1 << 20));
    std::fill(x, x + (1 << 18), 1);
    comm.allreduce(x, x, 1 << 18, DataType::i32, ReduceOp::sum);
    EXPECT_EQ(x[(1 << 18) - 1], 3);
    comm.free(x);
  });
}

TEST(Registered, FreeAfterAnAbortRaisesAndTheEndReleasesTheMemory) {
  run_ranks(2, [&](Communicator& comm) {
    auto* x = static_cast<float*>(comm.alloc(1 << 20));
    x[0] = 1.0f;
    comm.abort("test");
    EXPECT_THROW(comm.free(x), ringreduce::Error);
    x[1] = 2.0f;  // still mapped: the communicator's end releases it
  });
}

TEST(Registered, AcrossHostsAllocGivesOrdinaryMemory) {
  run_ranks(4,
            [&](Communicator& comm) {
              const size_t count = 1 << 18;
              auto* buf = static_cast<float*>(comm.alloc(count * sizeof(float)));
              for (size_t i = 0; i < count; ++i) buf[i] = 1.0f;
              comm.allreduce(buf, buf, count, DataType::f32, ReduceOp::sum);
              EXPECT_EQ(buf[count - 1], 4.0f);
              comm.free(buf);
            },
            {{"TEST_HOSTS", "2"}});
}

}  // namespace
}  // namespace rrtest
