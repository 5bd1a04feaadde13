// gather, scatter and the collectives whose blocks have their own sizes (allgatherv,
// reduce_scatterv, alltoallv): every rank's block checked at N = 1, 2, 3, 5 over shared memory,
// TCP and two hosts, with empty blocks, blocks of one element and blocks of several segments, in
// and out of place; and counts that disagree between ranks are a MismatchError on every rank.
#include <numeric>

#include "harness.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;

class Uneven : public OverEachTransport {
 protected:
  std::vector<int> sizes() const {
    return GetParam() == "mix" ? std::vector<int>{2, 3, 5} : std::vector<int>{1, 2, 3, 5};
  }
};

// What rank `from` puts in the block it sends to rank `to` (element i, round k): every element
// says where it came from and where it is going.
int64_t cell(int from, int to, size_t i, int k) {
  return int64_t(from) * 1000003 + int64_t(to) * 10007 + int64_t(i) * 3 + k;
}

// Blocks of their own sizes for n ranks: empty, one element, several segments.
std::vector<size_t> uneven_counts(int n, int k) {
  const size_t shapes[] = {0, 1, 7, 70001, 300000, 3};
  std::vector<size_t> c(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) c[size_t(r)] = shapes[size_t(r + k) % std::size(shapes)];
  return c;
}

TEST_P(Uneven, GatherAndScatterEveryRootAndSize) {
  for (int n : sizes())
    run_ranks(
        n,
        [&](Communicator& comm) {
          const int me = comm.rank();
          for (int root : {0, n - 1})
            for (size_t count : {size_t{0}, size_t{1}, size_t{1001}, size_t{300001}})
              for (bool in_place : {false, true}) {
                const std::string what = "n=" + std::to_string(n) + " root " +
                                         std::to_string(root) + " count " + std::to_string(count) +
                                         (in_place ? " in place" : "");
                // gather: block r of the root's recv is rank r's send
                std::vector<int64_t> all(count * size_t(n), -1), mine(count);
                for (size_t i = 0; i < count; ++i) mine[i] = cell(me, root, i, 1);
                const int64_t* send = mine.data();
                if (in_place && me == root) {
                  std::copy(mine.begin(), mine.end(), all.begin() + long(count * size_t(me)));
                  send = all.data() + count * size_t(me);
                }
                comm.gather(send, me == root ? all.data() : nullptr, count, DataType::i64, root);
                for (int q = 0; me == root && q < n; ++q)
                  for (size_t i = 0; i < count; ++i)
                    ASSERT_EQ(all[size_t(q) * count + i], cell(q, root, i, 1)) << "gather " << what;
                // scatter: rank r gets block r of the root's send
                std::vector<int64_t> blocks(count * size_t(n)), got(count, -1);
                if (me == root)
                  for (int q = 0; q < n; ++q)
                    for (size_t i = 0; i < count; ++i)
                      blocks[size_t(q) * count + i] = cell(root, q, i, 2);
                int64_t* recv = got.data();
                if (in_place && me == root) recv = blocks.data() + count * size_t(me);
                comm.scatter(me == root ? blocks.data() : nullptr, recv, count, DataType::i64,
                             root);
                for (size_t i = 0; i < count; ++i)
                  ASSERT_EQ(recv[i], cell(root, me, i, 2)) << "scatter " << what;
              }
        },
        transport());
}

TEST_P(Uneven, AllgathervReduceScattervAlltoallvWithBlocksOfTheirOwnSizes) {
  for (int n : sizes())
    run_ranks(
        n,
        [&](Communicator& comm) {
          const int me = comm.rank();
          for (int k = 0; k < 3; ++k) {
            const std::vector<size_t> counts = uneven_counts(n, k);
            std::vector<size_t> off(counts.size(), 0);
            for (size_t r = 1; r < counts.size(); ++r) off[r] = off[r - 1] + counts[r - 1];
            const size_t total = std::accumulate(counts.begin(), counts.end(), size_t{0});
            const std::string what = "n=" + std::to_string(n) + " k=" + std::to_string(k);
            for (bool in_place : {false, true}) {
              // allgatherv
              std::vector<int64_t> all(total, -1), mine(counts[size_t(me)]);
              for (size_t i = 0; i < mine.size(); ++i) mine[i] = cell(me, -1, i, k);
              const int64_t* send = mine.data();
              if (in_place) {
                std::copy(mine.begin(), mine.end(), all.begin() + long(off[size_t(me)]));
                send = all.data() + off[size_t(me)];
              }
              comm.allgatherv(send, all.data(), counts, DataType::i64);
              for (int q = 0; q < n; ++q)
                for (size_t i = 0; i < counts[size_t(q)]; ++i)
                  ASSERT_EQ(all[off[size_t(q)] + i], cell(q, -1, i, k))
                      << "allgatherv " << what << " block " << q;
              // reduce_scatterv, sum and max over exact inputs (global element index)
              for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::avg}) {
                auto in = make_input(me, total, DataType::f32, op);
                std::vector<float> out(std::max<size_t>(1, counts[size_t(me)]), -1.0f);
                float* recv =
                    in_place ? reinterpret_cast<float*>(in.data()) + off[size_t(me)] : out.data();
                comm.reduce_scatterv(in.data(), recv, counts, DataType::f32, op);
                for (size_t i = 0; i < counts[size_t(me)]; ++i)
                  ASSERT_EQ(recv[i],
                            float(expected_value(n, off[size_t(me)] + i, DataType::f32, op)))
                      << "reduce_scatterv " << ringreduce::op_name(op) << " " << what;
              }
            }
            // alltoallv: rank r sends rank j a block of shape(r + 2j + k) elements
            auto shape = [&](int from, int to) { return uneven_counts(1, from + 2 * to + k)[0]; };
            std::vector<size_t> sc(static_cast<size_t>(n)), rc(static_cast<size_t>(n));
            for (int j = 0; j < n; ++j) sc[size_t(j)] = shape(me, j), rc[size_t(j)] = shape(j, me);
            std::vector<int64_t> sbuf, rbuf(std::accumulate(rc.begin(), rc.end(), size_t{0}), -1);
            for (int j = 0; j < n; ++j)
              for (size_t i = 0; i < sc[size_t(j)]; ++i) sbuf.push_back(cell(me, j, i, k));
            comm.alltoallv(sbuf.data(), sc, rbuf.data(), rc, DataType::i64);
            size_t at = 0;
            for (int j = 0; j < n; ++j)
              for (size_t i = 0; i < rc[size_t(j)]; ++i)
                ASSERT_EQ(rbuf[at++], cell(j, me, i, k)) << "alltoallv " << what << " from " << j;
          }
        },
        transport());
}

TEST_P(Uneven, CountsThatDisagreeAreAMismatchOnEveryRank) {
  std::vector<std::string> errors(3);
  run_ranks(
      3,
      [&](Communicator& comm) {
        std::vector<size_t> counts = {4, 5, 6};
        if (comm.rank() == 1) counts[2] = 7;  // rank 1 disagrees about rank 2's block
        std::vector<float> all(30), mine(counts[size_t(comm.rank())], 1.0f);
        try {
          comm.barrier();  // every rank past start-up before the mismatch fails the communicator
          comm.allgatherv(mine.data(), all.data(), counts, DataType::f32);
          comm.barrier();
          ADD_FAILURE() << "no error on rank " << comm.rank();
        } catch (const ringreduce::MismatchError& e) {
          errors[size_t(comm.rank())] = e.what();
        }
      },
      transport(), std::chrono::seconds(20));
  for (const auto& e : errors) EXPECT_NE(e.find("allgatherv"), std::string::npos) << e;

  // alltoallv: rank 0 sends rank 2 more than rank 2 expects: rank 2's MismatchError reaches all.
  std::fill(errors.begin(), errors.end(), "");
  run_ranks(
      3,
      [&](Communicator& comm) {
        const int me = comm.rank();
        std::vector<size_t> sc = {2, 2, 2}, rc = {2, 2, 2};
        if (me == 0) sc[2] = 3;
        std::vector<int32_t> s(8, me), r(8);
        try {
          comm.barrier();
          comm.alltoallv(s.data(), sc, r.data(), rc, DataType::i32);
          comm.barrier();
          ADD_FAILURE() << "no error on rank " << me;
        } catch (const ringreduce::MismatchError& e) {
          errors[size_t(me)] = e.what();
        }
      },
      transport(), std::chrono::seconds(20));
  for (const auto& e : errors)
    EXPECT_NE(e.find("rank 0 sent 12 bytes where this rank expected 8"), std::string::npos) << e;
}

TEST_P(Uneven, BadCountsAreInvalidArguments) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        std::vector<float> a(8), b(8);
        const std::vector<size_t> one = {4}, two = {4, 4};
        std::vector<size_t> own_differs = two;
        own_differs[size_t(comm.rank())] = 3;
        auto expect_bad = [&](auto&& call, const std::string& words) {
          try {
            call();
            ADD_FAILURE() << "accepted: " << words;
          } catch (const ringreduce::InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
          }
        };
        expect_bad([&] { comm.allgatherv(a.data(), b.data(), one, DataType::f32); },
                   "counts has 1 entries, not one per rank (2)");
        expect_bad([&] { comm.alltoallv(a.data(), two, b.data(), one, DataType::f32); },
                   "recv counts has 1 entries");
        expect_bad([&] { comm.alltoallv(a.data(), two, b.data(), own_differs, DataType::f32); },
                   "sends itself 4 elements but receives 3 from itself");
        expect_bad([&] { comm.gather(a.data(), nullptr, 4, DataType::f32, 5); }, "root 5");
        comm.barrier();
      },
      transport());
}

INSTANTIATE_TEST_SUITE_P(Transports, Uneven, ::testing::ValuesIn(rrtest::transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rrtest
