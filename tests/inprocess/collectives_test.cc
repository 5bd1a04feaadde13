// The in-process correctness matrix: N = 1..9 ranks as threads over real loopback
// sockets; counts {0, 1, N-1, 7, 1M+3}; every dtype x op; in and out of place; and a tiny segment
// size that forces the multi-segment pipelined paths. Inputs are small integers, so every result
// is exact and compared bit for bit.
//
// Shared memory runs N = 1..8 and mix (two emulated hosts) N = 2, 3, 4, 5, 6 and 8: odd and even,
// a power of two above 4 and not, which is what the schedules branch on (N = 7 also has as many
// ranks beyond a power of two as it can); N = 9 runs in OneHost and over three hosts. tcp runs
// N = 2, 3 and 5: mix runs the same TCP links and algorithms at every N, and Striped the striped
// links (matrix_params). The large counts (1M+3; 64K+3 and
// 1001 in 8-byte segments) run every dtype x op pair at N <= 4 over shared memory; elsewhere one
// op per dtype, a different one at each N, so that each transport's N together still run every
// pair (in_matrix, harness.h).
//
// RR_TEST_MATRIX=small (harness.h; scripts/sanitize) keeps every test and path but runs N in
// {1, 2, 3, 4} (Striped: 2, 3; three hosts: N = 6), the allreduce matrix's large count at 256K+3
// instead of 1M+3, and the large counts (256K+3, 64K+3, 1001 with 8-byte segments) for one op per
// dtype instead of every dtype x op pair.
#include <sched.h>

#include <map>
#include <mutex>

#include <tuple>

#include "harness.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;

// Expected results are computed once per (size, count, dtype, op) and shared by the rank threads.
class Expected {
 public:
  const std::vector<char>& get(int size, size_t count, DataType t, ReduceOp op) {
    std::lock_guard<std::mutex> lock(mu_);
    auto key = std::make_tuple(size, count, static_cast<int>(t), static_cast<int>(op));
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    std::vector<char> buf(std::max<size_t>(1, count * ringreduce::dtype_size(t)));
    for (size_t i = 0; i < count; ++i)
      store_value(t, buf.data(), i, expected_value(size, i, t, op));
    return cache_[key] = std::move(buf);
  }

 private:
  std::mutex mu_;
  std::map<std::tuple<int, size_t, int, int>, std::vector<char>> cache_;
};

std::vector<size_t> counts_for(int n) {
  // The small matrix's large count, 256K+3, still takes several segments, stripes and rounds of
  // direct for the wider dtypes; a quarter of the data is most of a quarter of the time there.
  const size_t large = small_matrix() ? (1u << 18) + 3 : (1u << 20) + 3;
  return {0, 1, static_cast<size_t>(n - 1), 7, large};
}

// The data movers (broadcast, allgather, alltoall) do not reduce, so they run once per dtype and
// count: with sum, or, where the full matrix samples one op per dtype at a large count (N >= 5,
// in_matrix) and not sum, with the op it samples, so that every element size still takes them at
// every N. The small matrix keeps them on sum only, as the sanitizers' time budget was set for.
bool movers_run(DataType t, ReduceOp op, bool large, int n, bool every_pair) {
  return op == ReduceOp::sum ||
         (!small_matrix() && !in_matrix(t, ReduceOp::sum, large, n, every_pair));
}

std::string what(const char* call, int n, size_t count, DataType t, ReduceOp op, bool in_place) {
  return std::string(call) + " n=" + std::to_string(n) + " count=" + std::to_string(count) + " " +
         ringreduce::dtype_name(t) + " " + ringreduce::op_name(op) + (in_place ? " in-place" : "");
}

// The matrix runs over each transport: "shm" (the default for ranks on one host), "tcp", and
// "mix": two emulated hosts, ranks placed alternately (shared memory within a host, TCP between
// them, the ring reordered by host).
class Matrix : public ::testing::TestWithParam<std::tuple<int, std::string>> {
 protected:
  int ranks() const { return std::get<0>(GetParam()); }
  const std::string& kind() const { return std::get<1>(GetParam()); }
  std::map<std::string, std::string> transport(std::map<std::string, std::string> s = {}) const {
    return rrtest::transport_settings(kind(), std::move(s));
  }
  // Whether every (dtype, op) pair runs at the large counts at N <= 4 (in_matrix).
  bool every_pair() const { return kind() == "shm"; }
};

// Shared memory on one host (no setting that takes TCP in) runs every pair at N <= 4 (in_matrix).
bool every_pair_over(const std::map<std::string, std::string>& settings) {
  return settings.count("RINGREDUCE_SHM") == 0 && settings.count("TEST_HOSTS") == 0;
}

// Every allreduce algorithm runs the whole matrix: forced, and as the tuner picks.
void allreduce_matrix(int n, const std::string& algo, std::map<std::string, std::string> settings) {
  Expected expected;
  if (!algo.empty()) settings["RINGREDUCE_ALGO"] = "allreduce:" + algo;
  const bool every_pair = every_pair_over(settings);
  run_ranks(
      n,
      [&](Communicator& comm) {
        for (size_t count : counts_for(n))
          for (DataType t : all_dtypes())
            for (ReduceOp op : all_ops())
              for (bool in_place : {false, true}) {
                if (!in_matrix(t, op, count > 7, n, every_pair)) continue;
                const size_t bytes = count * ringreduce::dtype_size(t);
                const auto input = make_input(comm.rank(), count, t, op);
                auto in = input;
                std::vector<char> out(std::max<size_t>(1, bytes), 0x5a);
                void* dst = in_place ? in.data() : out.data();
                comm.allreduce(in.data(), dst, count, t, op);
                const auto& want = expected.get(n, count, t, op);
                ASSERT_EQ(0, std::memcmp(dst, want.data(), bytes))
                    << what(("allreduce/" + (algo.empty() ? "tuner" : algo)).c_str(), n, count, t,
                            op, in_place);
                // Out of place never writes the input.
                if (!in_place) {
                  ASSERT_EQ(0, std::memcmp(in.data(), input.data(), bytes));
                }
              }
      },
      settings);
}

TEST_P(Matrix, AllreduceTunerEveryDtypeOpCountPlacement) {
  allreduce_matrix(ranks(), "", transport());
}
TEST_P(Matrix, AllreduceRingEveryDtypeOpCountPlacement) {
  allreduce_matrix(ranks(), "ring", transport());
}
TEST_P(Matrix, AllreduceRecursiveDoublingEveryDtypeOpCountPlacement) {
  allreduce_matrix(ranks(), "rd", transport());
}
TEST_P(Matrix, AllreduceRabenseifnerEveryDtypeOpCountPlacement) {
  allreduce_matrix(ranks(), "rabenseifner", transport());
}
TEST_P(Matrix, AllreduceDoubleBinaryTreeEveryDtypeOpCountPlacement) {
  allreduce_matrix(ranks(), "tree", transport());
}

// The window algorithms read peers' memory in place: every rank on one host, shared memory only
// (forcing them otherwise is an error, tested in window_test). Counts above an algorithm's limit
// fall back to the tuner's choice; 1M+3 elements take direct several rounds at every N.
class OneHost : public ::testing::TestWithParam<int> {};
TEST_P(OneHost, AllreduceFlatEveryDtypeOpCountPlacement) {
  allreduce_matrix(GetParam(), "flat", {});
}
TEST_P(OneHost, AllreduceDirectEveryDtypeOpCountPlacement) {
  allreduce_matrix(GetParam(), "direct", {});
}
INSTANTIATE_TEST_SUITE_P(Ranks, OneHost,
                         ::testing::ValuesIn(ranks_in_matrix({1, 2, 3, 4, 5, 6, 7, 8, 9},
                                                             {1, 2, 3, 4})),
                         [](const auto& info) { return "shm_N" + std::to_string(info.param); });

// Ranks pinned two to a core, as ringrun places them when ranks outnumber cores: the window
// algorithms wait first for a peer that needs their core and watch a while for one on another
// (peer_wait.h). Results stay exact, and a rank whose call differs is named on every rank, also
// by a rank that waited for a peer of its own core first.
TEST(Crowded, RanksPinnedTwoToACoreGetExactResultsAndMismatches) {
  cpu_set_t usable;
  ASSERT_EQ(0, sched_getaffinity(0, sizeof usable, &usable));
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE && cores.size() < 2; ++c)
    if (CPU_ISSET(c, &usable)) cores.push_back(c);
  const int n = 4;
  Expected expected;
  for (const char* algo : {"flat", "direct"})
    run_ranks(
        n,
        [&](Communicator& comm) {
          cpu_set_t one;
          CPU_ZERO(&one);
          CPU_SET(cores[static_cast<size_t>(comm.rank()) % cores.size()], &one);
          ASSERT_EQ(0, sched_setaffinity(0, sizeof one, &one));  // this thread only
          const int calls = 20 * 4 * 2 * 2 * 2;
          int call = 0;
          for (int rep = 0; rep < 20; ++rep)
            for (size_t count : {size_t{1}, size_t{7}, size_t{1001}, size_t{70001}})
              for (DataType t : {DataType::f32, DataType::i64})
                for (ReduceOp op : {ReduceOp::sum, ReduceOp::max})
                  for (bool in_place : {false, true}) {
                    const size_t bytes = count * ringreduce::dtype_size(t);
                    auto in = make_input(comm.rank(), count, t, op);
                    std::vector<char> out(bytes);
                    void* dst = in_place ? in.data() : out.data();
                    try {
                      comm.allreduce(in.data(), dst, count, t, op);
                    } catch (const ringreduce::Error& e) {
                      // A rank still finishing the last good call when a faster one finds the
                      // mismatch in the next fails that call with the mismatch's notice: the
                      // failure reaches every rank at once, wherever it is, naming the call.
                      const std::string what = e.what();
                      if (++call == calls && what.find("mismatched call") != std::string::npos &&
                          what.find("#" + std::to_string(calls + 1)) != std::string::npos)
                        return;
                      throw;
                    }
                    ++call;
                    ASSERT_EQ(0, std::memcmp(dst, expected.get(n, count, t, op).data(), bytes))
                        << algo << " count " << count << " rank " << comm.rank();
                  }
          // Rank 2 shares rank 0's core.
          std::vector<float> a(1002, 1.0f);
          try {
            comm.allreduce(a.data(), a.data(), comm.rank() == 2 ? 1002 : 1001, DataType::f32,
                           ReduceOp::sum);
            ADD_FAILURE() << algo << ": rank " << comm.rank() << " saw no error";
          } catch (const ringreduce::MismatchError& e) {
            EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
          }
        },
        {{"RINGREDUCE_ALGO", std::string("allreduce:") + algo}}, std::chrono::seconds(20));
}

TEST_P(Matrix, AllreduceHierarchicalEveryDtypeOpCountPlacement) {
  // Two levels on "mix" (two emulated hosts) when N is even; otherwise, and on one host, it is
  // the ring. Three hosts of N/3 ranks run in HierarchicalOverThreeHosts.
  allreduce_matrix(ranks(), "hierarchical", transport());
}

// RINGREDUCE_NSOCKS: messages of 128 KiB and more are cut into stripes over several TCP
// connections per link (1M+3 elements in 512 KiB segments, and 200000-byte segments whose
// stripes end off any element boundary but 64 bytes'), also with two channels of their own.
class Striped : public ::testing::TestWithParam<int> {};
TEST_P(Striped, AllreduceEveryDtypeOpCountPlacement) {
  const std::map<std::string, std::string> tcp3 = {{"RINGREDUCE_SHM", "0"},
                                                   {"RINGREDUCE_NSOCKS", "3"}};
  for (const char* algo : {"ring", "star", "rd"}) allreduce_matrix(GetParam(), algo, tcp3);
  auto odd = tcp3;
  odd["RINGREDUCE_SEGMENT_BYTES"] = "200000";
  odd["RINGREDUCE_CHANNELS"] = "2";
  allreduce_matrix(GetParam(), "ring", odd);
}
INSTANTIATE_TEST_SUITE_P(Ranks, Striped, ::testing::ValuesIn(ranks_in_matrix({2, 3, 5}, {2, 3})),
                         [](const auto& info) { return "tcp_N" + std::to_string(info.param); });

TEST(Hierarchical, HierarchicalOverThreeHosts) {
  for (int n : ranks_in_matrix({6, 9}, {6}))
    allreduce_matrix(n, "hierarchical", {{"TEST_HOSTS", "3"}});
}

TEST_P(Matrix, AllreduceTinySegmentsPipeline) {
  const int n = ranks();
  Expected expected;
  // 8-byte segments: every chunk is cut into many segments, all in flight at once.
  for (const char* algo : {"ring", "rabenseifner", "tree"})
    run_ranks(
        n,
        [&](Communicator& comm) {
          for (size_t count : {static_cast<size_t>(n - 1), size_t{7}, size_t{1001}})
            for (DataType t : all_dtypes())
              for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max})
                for (bool in_place : {false, true}) {
                  if (!in_matrix(t, op, count > 7, n, every_pair())) continue;
                  const size_t bytes = count * ringreduce::dtype_size(t);
                  auto in = make_input(comm.rank(), count, t, op);
                  std::vector<char> out(std::max<size_t>(1, bytes));
                  void* dst = in_place ? in.data() : out.data();
                  comm.allreduce(in.data(), dst, count, t, op);
                  ASSERT_EQ(0, std::memcmp(dst, expected.get(n, count, t, op).data(), bytes))
                      << what((std::string("allreduce/") + algo + "/8B segments").c_str(), n, count,
                              t, op, in_place);
                }
        },
        transport({{"RINGREDUCE_SEGMENT_BYTES", "8"},
                   {"RINGREDUCE_ALGO", std::string("allreduce:") + algo}}));
}

// The binomial trees, forced, for every dtype x op, every root, whole and in 8-byte segments.
TEST_P(Matrix, BinomialBroadcastReduceEveryDtypeOpRoot) {
  const int n = ranks();
  Expected expected;
  for (const char* seg : {"", "8"}) {
    auto settings = transport({{"RINGREDUCE_ALGO", "broadcast:binomial,reduce:binomial"}});
    if (*seg) settings["RINGREDUCE_SEGMENT_BYTES"] = seg;
    run_ranks(
        n,
        [&](Communicator& comm) {
          const int r = comm.rank();
          for (size_t count : {size_t{0}, size_t{1}, static_cast<size_t>(n + 2),
                               *seg ? size_t{1001} : (size_t{1} << 16) + 3})
            for (DataType t : all_dtypes())
              for (ReduceOp op : all_ops())
                for (int root = 0; root < n; ++root) {
                  const bool large = count > static_cast<size_t>(n + 2);
                  if (!in_matrix(t, op, large, n, every_pair())) continue;
                  const size_t bytes = count * ringreduce::dtype_size(t);
                  auto in = make_input(r, count, t, op);
                  std::vector<char> red(std::max<size_t>(1, bytes), 0x11);
                  comm.reduce(in.data(), r == root ? red.data() : nullptr, count, t, op, root);
                  if (r == root) {
                    ASSERT_EQ(0,
                              std::memcmp(red.data(), expected.get(n, count, t, op).data(), bytes))
                        << what("reduce/binomial", n, count, t, op, false) << " root " << root;
                  }
                  if (!movers_run(t, op, large, n, every_pair())) continue;
                  auto b = r == root ? make_input(root, count, t, op)
                                     : std::vector<char>(std::max<size_t>(1, bytes), 0);
                  comm.broadcast(b.data(), count, t, root);
                  ASSERT_EQ(0, std::memcmp(b.data(), make_input(root, count, t, op).data(), bytes))
                      << what("broadcast/binomial", n, count, t, op, false) << " root " << root;
                }
        },
        settings);
  }
}

TEST_P(Matrix, ReduceScatterAllgatherBroadcastReduceAlltoall) {
  const int n = ranks();
  Expected expected;
  for (const char* seg : {"", "8"}) {
    std::map<std::string, std::string> settings = transport();
    if (*seg) settings["RINGREDUCE_SEGMENT_BYTES"] = seg;
    run_ranks(
        n,
        [&](Communicator& comm) {
          const int r = comm.rank();
          const size_t big = *seg ? 1001 : (1u << 16) + 3;
          for (size_t block : {size_t{0}, size_t{1}, size_t{7}, big})
            for (DataType t : all_dtypes())
              for (ReduceOp op : all_ops()) {
                if (!in_matrix(t, op, block > 7, n, every_pair())) continue;
                const size_t elem = ringreduce::dtype_size(t);
                const size_t total = block * static_cast<size_t>(n);
                const auto& want = expected.get(n, total, t, op);

                // reduce_scatter: rank r receives reduced block r.
                auto in = make_input(r, total, t, op);
                std::vector<char> out(std::max<size_t>(1, block * elem));
                comm.reduce_scatter(in.data(), out.data(), block, t, op);
                ASSERT_EQ(
                    0, std::memcmp(out.data(), want.data() + static_cast<size_t>(r) * block * elem,
                                   block * elem))
                    << what("reduce_scatter", n, block, t, op, false);

                // reduce to every root in turn (recv only on the root).
                for (int root = 0; root < n; root += std::max(1, n / 3)) {
                  std::vector<char> red(std::max<size_t>(1, total * elem), 0x11);
                  comm.reduce(in.data(), r == root ? red.data() : nullptr, total, t, op, root);
                  if (r == root) {
                    ASSERT_EQ(0, std::memcmp(red.data(), want.data(), total * elem))
                        << what("reduce", n, total, t, op, false) << " root " << root;
                  }
                }
                if (!movers_run(t, op, block > 7, n, every_pair())) continue;

                // allgather: block j comes from rank j (in place too: send inside recv).
                std::vector<char> gathered(std::max<size_t>(1, total * elem));
                auto mine = make_input(r, block, t, op);
                comm.allgather(mine.data(), gathered.data(), block, t);
                for (int j = 0; j < n; ++j) {
                  auto theirs = make_input(j, block, t, op);
                  ASSERT_EQ(0, std::memcmp(gathered.data() + static_cast<size_t>(j) * block * elem,
                                           theirs.data(), block * elem))
                      << what("allgather", n, block, t, op, false) << " block " << j;
                }
                std::memcpy(gathered.data() + static_cast<size_t>(r) * block * elem, mine.data(),
                            block * elem);
                comm.allgather(gathered.data() + static_cast<size_t>(r) * block * elem,
                               gathered.data(), block, t);
                for (int j = 0; j < n; ++j)
                  ASSERT_EQ(0, std::memcmp(gathered.data() + static_cast<size_t>(j) * block * elem,
                                           make_input(j, block, t, op).data(), block * elem))
                      << what("allgather", n, block, t, op, true);

                // broadcast from a root that is not rank 0 when possible.
                const int root = n - 1;
                std::vector<char> b = r == root
                                          ? make_input(root, total, t, op)
                                          : std::vector<char>(std::max<size_t>(1, total * elem), 0);
                comm.broadcast(b.data(), total, t, root);
                ASSERT_EQ(
                    0, std::memcmp(b.data(), make_input(root, total, t, op).data(), total * elem))
                    << what("broadcast", n, total, t, op, false);

                // alltoall: block j of rank i's input is (i, j)-specific; recv block j comes from
                // j.
                std::vector<char> a2a_in(std::max<size_t>(1, total * elem)), a2a_out(a2a_in.size());
                for (int j = 0; j < n; ++j)
                  for (size_t k = 0; k < block; ++k)
                    store_value(t, a2a_in.data(), static_cast<size_t>(j) * block + k,
                                (r * 3 + j + k) % 7);
                comm.alltoall(a2a_in.data(), a2a_out.data(), block, t);
                for (int j = 0; j < n; ++j)
                  for (size_t k = 0; k < block; ++k)
                    ASSERT_EQ(load_value(t, a2a_out.data(), static_cast<size_t>(j) * block + k),
                              static_cast<double>((j * 3 + r + k) % 7))
                        << what("alltoall", n, block, t, op, false) << " from " << j;
              }
          comm.barrier();
        },
        settings);
  }
}

// Shared memory runs N = 1..8, mix N = 2, 3, 4, 5, 6, 8, tcp N = 2, 3, 5 (see the top of this
// file). N = 1 runs over shm only: a world of one sets up no link whatever the settings
// (comm_impl.cc) and every collective returns before it would use one, so tcp_N1 and mix_N1 would
// repeat it.
// The star allreduce exists for the scaling comparison only (bench/drivers/scaling.sh; the tuner
// never picks it): a world of each transport and an uneven and a larger N, not the whole matrix
// (where it took 56 s of ctest's serial time).
class Star : public Matrix {};
TEST_P(Star, AllreduceStarEveryDtypeOpCountPlacement) {
  allreduce_matrix(ranks(), "star", transport());
}
INSTANTIATE_TEST_SUITE_P(Ranks, Star,
                         ::testing::Values(std::make_tuple(2, std::string("shm")),
                                           std::make_tuple(3, std::string("tcp")),
                                           std::make_tuple(5, std::string("mix")),
                                           std::make_tuple(8, std::string("shm"))),
                         [](const auto& info) {
                           return std::get<1>(info.param) + "_N" +
                                  std::to_string(std::get<0>(info.param));
                         });

std::vector<std::tuple<int, std::string>> matrix_params() {
  std::vector<std::tuple<int, std::string>> v;
  for (int n : ranks_in_matrix({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 2, 3, 4}))
    for (const std::string& kind : rrtest::transports())
      if (kind == "shm"   ? n != 9
          : kind == "mix" ? n > 1 && n != 7 && n != 9
                          : n == 2 || n == 3 || n == 5)
        v.emplace_back(n, kind);
  return v;
}

INSTANTIATE_TEST_SUITE_P(Ranks, Matrix, ::testing::ValuesIn(matrix_params()), [](const auto& info) {
  return std::get<1>(info.param) + "_N" + std::to_string(std::get<0>(info.param));
});

}  // namespace
}  // namespace rrtest
