// Communicator::split (MPI_Comm_split's semantics) over shared memory, TCP and two hosts: groups by
// color ranked by key, collectives and sends on a group interleaved with the parent's, repeated
// and nested splits that never meet, a group outliving its parent, kNoColor, and bad colors.
#include <thread>

#include "harness.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;

class Split : public OverEachTransport {};

TEST_P(Split, GroupsByColorRankedByKeyInterleavedWithTheParent) {
  const int n = 5;
  run_ranks(
      n,
      [&](Communicator& comm) {
        const int me = comm.rank();
        // Even and odd ranks, each group in reverse rank order.
        Communicator group = comm.split(me % 2, -me);
        ASSERT_TRUE(group.valid());
        const int members = me % 2 == 0 ? 3 : 2;
        ASSERT_EQ(group.size(), members);
        // Reverse order: the highest rank of the color is rank 0 of the group.
        const int highest = me % 2 == 0 ? 4 : 3;
        EXPECT_EQ(group.rank(), (highest - me) / 2);
        for (int round = 0; round < 20; ++round) {
          std::vector<int64_t> in_group(1000, me), in_world(500, 1);
          ringreduce::Work w = group.allreduce_async(std::span<int64_t>(in_group), ReduceOp::sum);
          comm.allreduce(std::span<int64_t>(in_world), ReduceOp::sum);
          w.wait();
          EXPECT_EQ(in_group[999], me % 2 == 0 ? 0 + 2 + 4 : 1 + 3);
          EXPECT_EQ(in_world[0], n);
        }
        // Point to point inside the group: group ranks, not world ranks.
        if (group.size() > 1) {
          std::vector<int32_t> token(3, me), got(3);
          const int right = (group.rank() + 1) % group.size();
          const int left = (group.rank() + group.size() - 1) % group.size();
          ringreduce::Work s = group.send_async(token.data(), 3, DataType::i32, right, 1);
          group.recv(got.data(), 3, DataType::i32, left, 1);
          s.wait();
          EXPECT_EQ(got[0] % 2, me % 2);  // from the same color
        }
        group.barrier();
      },
      transport());
}

TEST_P(Split, RepeatedAndNestedSplitsNeverMeetAndAGroupOutlivesItsParent) {
  run_ranks(
      4,
      [&](Communicator& comm) {
        const int me = comm.rank();
        // Two splits with the same colors: distinct groups (split numbers differ).
        Communicator a = comm.split(0, me);
        Communicator b = comm.split(0, me);
        std::vector<int32_t> x(10, 1), y(10, 2);
        ringreduce::Work wa = a.allreduce_async(std::span<int32_t>(x), ReduceOp::sum);
        b.allreduce(std::span<int32_t>(y), ReduceOp::sum);
        wa.wait();
        EXPECT_EQ(x[0], 4);
        EXPECT_EQ(y[0], 8);
        // A split of a split: pairs.
        Communicator pair = a.split(me / 2, me);
        EXPECT_EQ(pair.size(), 2);
        EXPECT_EQ(pair.rank(), me % 2);
        // The parent and the first group go away; the pair goes on.
        comm.barrier();
        a = Communicator(std::move(b));
        std::vector<float> z(100000, float(me));
        pair.allreduce(std::span<float>(z), ReduceOp::max);
        EXPECT_EQ(z[99999], float(me | 1));
      },
      transport());
}

TEST_P(Split, NoColorGivesAnEmptyCommunicatorAndBadColorsAreRefused) {
  run_ranks(
      3,
      [&](Communicator& comm) {
        Communicator only_zero = comm.split(comm.rank() == 0 ? 7 : Communicator::kNoColor, 0);
        EXPECT_EQ(only_zero.valid(), comm.rank() == 0);
        if (comm.rank() == 0) {
          EXPECT_EQ(only_zero.size(), 1);
          std::vector<int32_t> v(5, 3);
          only_zero.allreduce(std::span<int32_t>(v), ReduceOp::sum);  // alone: a copy
          EXPECT_EQ(v[4], 3);
        } else {
          EXPECT_THROW(only_zero.barrier(), ringreduce::InvalidArgument);
        }
        try {
          (void)comm.split(-5, 0);
          ADD_FAILURE() << "color -5 accepted";
        } catch (const ringreduce::InvalidArgument& e) {
          EXPECT_NE(std::string(e.what()).find("color -5"), std::string::npos) << e.what();
        }
        comm.barrier();  // the refused split issued nothing
      },
      transport());
}

INSTANTIATE_TEST_SUITE_P(Transports, Split, ::testing::ValuesIn(rrtest::transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rrtest
