// The dtypes and ops beyond the original matrix's (collectives_test.cc): int16 and bool with every
// op that applies to them, the bitwise ops on every integer type, premul_sum with a factor per
// rank; through allreduce, reduce_scatter and reduce over shared memory, TCP and two hosts. And an
// op that does not apply to a dtype is an InvalidArgument that leaves the communicator usable.
#include "harness.h"

namespace rrtest {
namespace {

using ringreduce::Communicator;

class Dtypes : public OverEachTransport {};

// (dtype, op) pairs: int16 and bool with all their ops, bitwise ops on every integer type.
std::vector<std::pair<DataType, ReduceOp>> new_pairs() {
  std::vector<std::pair<DataType, ReduceOp>> v;
  for (DataType t : {DataType::i16, DataType::boolean})
    for (int o = 0; o < ringreduce::kNumReduceOps; ++o)
      if (ringreduce::op_applies(static_cast<ReduceOp>(o), t)) v.push_back({t, ReduceOp(o)});
  for (DataType t :
       {DataType::i8, DataType::u8, DataType::i32, DataType::u32, DataType::i64, DataType::u64})
    for (ReduceOp op : {ReduceOp::band, ReduceOp::bor, ReduceOp::bxor}) v.push_back({t, op});
  return v;
}

std::vector<char> expected(int n, size_t count, DataType t, ReduceOp op, size_t first = 0) {
  std::vector<char> buf(std::max<size_t>(1, count * ringreduce::dtype_size(t)));
  for (size_t i = 0; i < count; ++i)
    store_value(t, buf.data(), i, expected_value(n, first + i, t, op));
  return buf;
}

TEST_P(Dtypes, Int16BoolAndBitwiseOpsThroughEveryReduction) {
  const int n = 3;
  run_ranks(
      n,
      [&](Communicator& comm) {
        for (auto [t, op] : new_pairs())
          for (size_t count : {size_t{1}, size_t{7}, size_t{70001}}) {
            const size_t elem = ringreduce::dtype_size(t), bytes = count * elem;
            const std::string what = std::string(ringreduce::dtype_name(t)) + " " +
                                     ringreduce::op_name(op) + " count " + std::to_string(count);
            // allreduce, out of place and in place
            auto in = make_input(comm.rank(), count, t, op);
            std::vector<char> out(std::max<size_t>(1, bytes));
            comm.allreduce(in.data(), out.data(), count, t, op);
            ASSERT_EQ(0, std::memcmp(out.data(), expected(n, count, t, op).data(), bytes))
                << "allreduce " << what;
            comm.allreduce(in.data(), in.data(), count, t, op);
            ASSERT_EQ(0, std::memcmp(in.data(), expected(n, count, t, op).data(), bytes))
                << "allreduce in place " << what;
            // reduce_scatter: every rank's input is the whole n * count pattern
            auto rs_in = make_input(comm.rank(), count * n, t, op);
            std::vector<char> rs_out(std::max<size_t>(1, bytes));
            comm.reduce_scatter(rs_in.data(), rs_out.data(), count, t, op);
            ASSERT_EQ(0, std::memcmp(rs_out.data(),
                                     expected(n, count, t, op, count * size_t(comm.rank())).data(),
                                     bytes))
                << "reduce_scatter " << what;
            // reduce to rank 1
            auto r_in = make_input(comm.rank(), count, t, op);
            std::vector<char> r_out(std::max<size_t>(1, bytes));
            comm.reduce(r_in.data(), comm.rank() == 1 ? r_out.data() : nullptr, count, t, op, 1);
            if (comm.rank() == 1) {
              ASSERT_EQ(0, std::memcmp(r_out.data(), expected(n, count, t, op).data(), bytes))
                  << "reduce " << what;
            }
          }
      },
      transport());
}

// premul_sum: each rank's input times its own factor, then the sum. Factors k/2 keep small
// integers exact in every floating-point type.
TEST_P(Dtypes, PremulSumScalesEachRanksInputByItsOwnFactor) {
  const int n = 3;
  auto factor = [](int rank) { return 0.5 * (rank + 1); };
  run_ranks(
      n,
      [&](Communicator& comm) {
        for (DataType t : {DataType::f16, DataType::bf16, DataType::f32, DataType::f64})
          for (size_t count : {size_t{1}, size_t{1000}, size_t{300001}}) {
            const size_t bytes = count * ringreduce::dtype_size(t);
            std::vector<char> want(std::max<size_t>(1, bytes));
            auto want_at = [&](size_t first) {
              for (size_t i = 0; i < count; ++i) {
                double v = 0;
                for (int r = 0; r < n; ++r)
                  v += factor(r) * input_value(r, first + i, t, ReduceOp::sum);
                store_value(t, want.data(), i, v);
              }
              return want.data();
            };
            ringreduce::CallOptions call;
            call.premul_factor = factor(comm.rank());
            const std::string what =
                std::string(ringreduce::dtype_name(t)) + " count " + std::to_string(count);
            auto in = make_input(comm.rank(), count, t, ReduceOp::sum);
            const auto original = in;
            std::vector<char> out(std::max<size_t>(1, bytes));
            comm.allreduce(in.data(), out.data(), count, t, ReduceOp::premul_sum, call);
            ASSERT_EQ(0, std::memcmp(out.data(), want_at(0), bytes)) << "allreduce " << what;
            ASSERT_EQ(in, original) << "out of place, the input is left as it was: " << what;
            comm.allreduce(in.data(), in.data(), count, t, ReduceOp::premul_sum, call);
            ASSERT_EQ(0, std::memcmp(in.data(), want_at(0), bytes)) << "in place " << what;
            auto rs_in = make_input(comm.rank(), count * n, t, ReduceOp::sum);
            std::vector<char> rs_out(std::max<size_t>(1, bytes));
            comm.reduce_scatter(rs_in.data(), rs_out.data(), count, t, ReduceOp::premul_sum, call);
            ASSERT_EQ(0, std::memcmp(rs_out.data(), want_at(count * size_t(comm.rank())), bytes))
                << "reduce_scatter " << what;
            std::vector<char> r_out(std::max<size_t>(1, bytes));
            auto r_in = make_input(comm.rank(), count, t, ReduceOp::sum);
            comm.reduce(r_in.data(), r_out.data(), count, t, ReduceOp::premul_sum, 0, call);
            if (comm.rank() == 0) {
              ASSERT_EQ(0, std::memcmp(r_out.data(), want_at(0), bytes)) << "reduce " << what;
            }
          }
      },
      transport());
}

TEST_P(Dtypes, AnOpThatDoesNotApplyIsAnInvalidArgumentAndTheCommunicatorGoesOn) {
  run_ranks(
      2,
      [&](Communicator& comm) {
        std::vector<float> f(8, 1.0f);
        std::vector<uint8_t> b(8, 1);
        std::vector<int32_t> i(8, 3);
        auto expect_bad = [&](auto&& call, const std::string& words) {
          try {
            call();
            ADD_FAILURE() << "accepted: " << words;
          } catch (const ringreduce::InvalidArgument& e) {
            EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
            EXPECT_NE(std::string(e.what()).find("rank " + std::to_string(comm.rank()) + ": "),
                      std::string::npos)
                << e.what();
          }
        };
        // A good call first: a repeated call's checks are kept for its shape (CommImpl::call),
        // and these differ from it in one thing each.
        comm.allreduce(f.data(), f.data(), 8, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(f[7], 2.0f);
        expect_bad([&] { comm.allreduce(f.data(), f.data(), 8, DataType::f32, ReduceOp::bxor); },
                   "bxor does not apply to float");
        expect_bad([&] { comm.allreduce(nullptr, f.data(), 8, DataType::f32, ReduceOp::sum); },
                   "send buffer is null");
        expect_bad([&] { comm.allreduce(b.data(), b.data(), 8, DataType::boolean, ReduceOp::avg); },
                   "avg does not apply to bool");
        expect_bad(
            [&] { comm.reduce(i.data(), i.data(), 8, DataType::i32, ReduceOp::premul_sum, 0); },
            "premul_sum does not apply to int32");
        comm.allreduce(i.data(), i.data(), 8, DataType::i32, ReduceOp::bor);
        EXPECT_EQ(i[7], 3);
        comm.allreduce(f.data(), f.data(), 8, DataType::f32, ReduceOp::sum);
        EXPECT_EQ(f[7], 4.0f);
      },
      transport());
}

INSTANTIATE_TEST_SUITE_P(Transports, Dtypes, ::testing::ValuesIn(rrtest::transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rrtest
