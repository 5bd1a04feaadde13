// The coded collectives (CallOptions::wire, algorithms/wire_phases.h) against an exact float64
// reduction: every format, N = 2..9 over shared memory, TCP and mixed hosts, inputs of mixed
// magnitudes and signs with float32 subnormals among them. Each element's error must stay within
// one rounding of each input plus one of the result (the bound docs/WIRE.md states, independent
// of N); allreduce and allgather leave every rank with the same bits; infinities and NaN come
// out as float32 sums would give them; and the calls a format cannot serve are refused on every
// rank, naming the rank and the call.

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "harness.h"
#include "reduce/wire.h"

namespace {

using ringreduce::CallOptions;
using ringreduce::Wire;
using rrtest::DataType;
using rrtest::ReduceOp;
namespace rr = ringreduce::reduce;

const Wire kWires[] = {Wire::bf16, Wire::f16, Wire::fp8e4m3, Wire::fp8e5m2};

// Rank r's input: values of both signs whose exponents span 2^-40..2^20 (so a block holds values
// far below its largest), every 97th a float32 subnormal.
std::vector<float> input(int rank, size_t count) {
  std::mt19937 gen(1234u + static_cast<unsigned>(rank));
  std::uniform_int_distribution<int> ex(-40, 20);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::vector<float> v(count);
  for (size_t i = 0; i < count; ++i) {
    const int e = i % 97 == 3 ? -140 : ex(gen);
    v[i] = std::ldexp(mant(gen), e) * ((gen() & 1) != 0 ? -1.0f : 1.0f);
  }
  return v;
}

float amax_of(const std::vector<float>& v) {
  float m = 0;
  for (float x : v)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// The bound for one element of a reduction: a rounding of each input (at the exponent of that
// input's largest value, which no block's exponent exceeds), float32's own rounding in the N - 1
// additions and the avg's division, and, when `rounded`, a rounding of the result at the
// exponent of the results' largest value.
struct Bound {
  Wire w;
  std::vector<int> k_in;  // per rank
  int k_out = 0;
  double operator()(const std::vector<std::vector<float>>& in, size_t i, double exact, bool rounded,
                    double divisor) const {
    double b = 0, mag = 0;
    for (size_t r = 0; r < in.size(); ++r) {
      b += rr::wire_error_bound(w, in[r][i], k_in[r]);
      mag += std::fabs(in[r][i]);
    }
    b = b / divisor + static_cast<double>(in.size()) * 0x1p-24 * mag * 1.5 / divisor;
    if (rounded) b += rr::wire_error_bound(w, std::fabs(exact) + b, k_out);
    return b;
  }
};

using Param = std::tuple<std::string, int>;  // transport, ranks

class WireCollectives : public ::testing::TestWithParam<Param> {
 protected:
  std::map<std::string, std::string> settings() const {
    return rrtest::transport_settings(std::get<0>(GetParam()));
  }
  int ranks() const { return std::get<1>(GetParam()); }
};

// Counts: one element, a partial block, several whole blocks and a partial, and one large enough
// that the links cut it into several pieces (TCP's 64 KiB staging, shared memory's 256 KiB slot).
const size_t kCounts[] = {1, 255, 1000, 150001};

TEST_P(WireCollectives, AllreduceWithinOneRoundingPerInputAndResultOnEveryRank) {
  const int n = ranks();
  std::vector<std::vector<float>> in;
  for (int r = 0; r < n; ++r) in.push_back(input(r, kCounts[3]));
  std::vector<std::vector<float>> results(static_cast<size_t>(n));
  for (Wire w : kWires) {
    for (size_t count : kCounts) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg}) {
        rrtest::run_ranks(
            n,
            [&](ringreduce::Communicator& comm) {
              const auto r = static_cast<size_t>(comm.rank());
              std::vector<float> send(in[r].begin(), in[r].begin() + static_cast<long>(count));
              std::vector<float> out(count, -7.0f);
              // In place on odd ranks, out of place on even ones.
              if (r % 2 == 1) {
                comm.allreduce(send.data(), send.data(), count, DataType::f32, op,
                               CallOptions{.wire = w});
                out = send;
              } else {
                comm.allreduce(send.data(), out.data(), count, DataType::f32, op,
                               CallOptions{.wire = w});
              }
              results[r] = out;
            },
            settings());
        std::vector<std::vector<float>> cut;
        for (auto& v : in) cut.emplace_back(v.begin(), v.begin() + static_cast<long>(count));
        Bound bound{w, {}, 0};
        double exact_max = 0;
        std::vector<double> exact(count, 0.0);
        for (size_t i = 0; i < count; ++i) {
          for (auto& v : cut) exact[i] += v[i];
          if (op == ReduceOp::avg) exact[i] /= n;
          exact_max = std::max(exact_max, std::fabs(exact[i]));
        }
        for (auto& v : cut) bound.k_in.push_back(rr::wire_block_exponent(w, amax_of(v)));
        bound.k_out = rr::wire_block_exponent(w, static_cast<float>(exact_max * 1.01));
        const double div = op == ReduceOp::avg ? n : 1;
        for (size_t i = 0; i < count; ++i) {
          const double err = std::fabs(static_cast<double>(results[0][i]) - exact[i]);
          ASSERT_LE(err, bound(cut, i, exact[i], true, div))
              << ringreduce::wire_name(w) << " N=" << n << " count " << count << " "
              << ringreduce::op_name(op) << " element " << i << ": " << results[0][i] << " against "
              << exact[i];
          for (int r = 1; r < n; ++r)
            ASSERT_EQ(std::memcmp(&results[r][i], &results[0][i], 4), 0)
                << "rank " << r << " differs from rank 0 at element " << i;
        }
      }
    }
  }
}

TEST_P(WireCollectives, ReduceScatterAndAllgather) {
  const int n = ranks();
  const size_t count = 3000;  // per rank
  for (Wire w : kWires) {
    std::vector<std::vector<float>> in, scattered(static_cast<size_t>(n)),
        gathered(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r) in.push_back(input(r, count * static_cast<size_t>(n)));
    rrtest::run_ranks(
        n,
        [&](ringreduce::Communicator& comm) {
          const auto r = static_cast<size_t>(comm.rank());
          std::vector<float> out(count);
          comm.reduce_scatter(in[r].data(), out.data(), count, DataType::f32, ReduceOp::sum,
                              CallOptions{.wire = w});
          scattered[r] = out;
          // Allgather in place: this rank's contribution already sits in its block.
          std::vector<float> all(count * static_cast<size_t>(n), 0.0f);
          std::copy(in[r].begin(), in[r].begin() + static_cast<long>(count),
                    all.begin() + static_cast<long>(r * count));
          comm.allgather(all.data() + r * count, all.data(), count, DataType::f32,
                         CallOptions{.wire = w});
          gathered[r] = all;
        },
        settings());
    Bound bound{w, {}, 0};
    for (auto& v : in) bound.k_in.push_back(rr::wire_block_exponent(w, amax_of(v)));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < count; ++i) {
        const size_t at = static_cast<size_t>(r) * count + i;
        double exact = 0;
        for (auto& v : in) exact += v[at];
        ASSERT_LE(std::fabs(scattered[r][i] - exact), bound(in, at, exact, false, 1))
            << ringreduce::wire_name(w) << " reduce_scatter rank " << r << " element " << i;
        // Allgather: rank r's block is its input rounded once, the same on every rank.
        const double x = in[r][i];
        ASSERT_LE(std::fabs(gathered[0][at] - x), rr::wire_error_bound(w, x, bound.k_in[r]))
            << ringreduce::wire_name(w) << " allgather block " << r << " element " << i;
        for (int q = 1; q < n; ++q)
          ASSERT_EQ(std::memcmp(&gathered[q][at], &gathered[0][at], 4), 0)
              << "allgather: rank " << q << " differs from rank 0 at " << at;
      }
    }
  }
}

std::vector<Param> params() {
  std::vector<Param> p;
  for (int n : rrtest::ranks_in_matrix({2, 3, 4, 5, 6, 7, 8, 9}, {2, 3})) p.emplace_back("shm", n);
  for (int n : rrtest::ranks_in_matrix({2, 3, 5, 9}, {3})) p.emplace_back("tcp", n);
  for (int n : rrtest::ranks_in_matrix({4, 6}, {4})) p.emplace_back("mix", n);
  return p;
}
INSTANTIATE_TEST_SUITE_P(Ranks, WireCollectives, ::testing::ValuesIn(params()),
                         [](const auto& info) {
                           return std::get<0>(info.param) + std::to_string(std::get<1>(info.param));
                         });

class WireOverEachTransport : public rrtest::OverEachTransport {};

TEST_P(WireOverEachTransport, InfinityAndNanComeOutAsInFloat32) {
  const float inf = std::numeric_limits<float>::infinity();
  for (Wire w : kWires) {
    rrtest::run_ranks(
        4,
        [&](ringreduce::Communicator& comm) {
          std::vector<float> v(600, 1.0f);
          if (comm.rank() == 0) v[5] = inf, v[300] = inf;
          if (comm.rank() == 1) v[7] = std::numeric_limits<float>::quiet_NaN(), v[300] = -inf;
          if (comm.rank() == 2) v[9] = -inf;
          comm.allreduce(v.data(), v.data(), v.size(), DataType::f32, ReduceOp::sum,
                         CallOptions{.wire = w});
          EXPECT_EQ(v[5], inf);
          EXPECT_TRUE(std::isnan(v[7]));
          EXPECT_EQ(v[9], -inf);
          EXPECT_TRUE(std::isnan(v[300]));  // inf + -inf
          EXPECT_EQ(v[0], 4.0f);            // the finite values of those blocks are unharmed
          EXPECT_EQ(v[599], 4.0f);
        },
        transport());
  }
}

TEST_P(WireOverEachTransport, RefusedWhereItCannotApplyOnEveryRankNamingRankAndCall) {
  rrtest::run_ranks(
      3,
      [&](ringreduce::Communicator& comm) {
        std::vector<int32_t> ints(10, 1);
        std::vector<float> f(10, 1.0f);
        const std::string me = "rank " + std::to_string(comm.rank());
        auto expect_refused = [&](auto&& call, const char* what) {
          try {
            call();
            ADD_FAILURE() << what << " was not refused";
          } catch (const ringreduce::InvalidArgument& e) {
            const std::string msg = e.what();
            EXPECT_NE(msg.find(me), std::string::npos) << msg;
            EXPECT_NE(msg.find(what), std::string::npos) << msg;
            EXPECT_NE(msg.find("wire format bf16 applies to float32"), std::string::npos) << msg;
          }
        };
        expect_refused(
            [&] {
              comm.allreduce(ints.data(), ints.data(), 10, DataType::i32, ReduceOp::sum,
                             CallOptions{.wire = Wire::bf16});
            },
            "allreduce");
        expect_refused(
            [&] {
              comm.allreduce(f.data(), f.data(), 10, DataType::f32, ReduceOp::max,
                             CallOptions{.wire = Wire::bf16});
            },
            "allreduce");
        expect_refused(
            [&] {
              comm.broadcast(f.data(), 10, DataType::f32, 0, CallOptions{.wire = Wire::bf16});
            },
            "broadcast");
        // Nothing was issued: the communicator goes on, exact.
        comm.allreduce(ints.data(), ints.data(), 10, DataType::i32, ReduceOp::sum);
        EXPECT_EQ(ints[9], 3);
      },
      transport());
}

TEST_P(WireOverEachTransport, RanksThatAskForDifferentFormatsGetAMismatchNamingBoth) {
  rrtest::run_ranks(
      3,
      [&](ringreduce::Communicator& comm) {
        std::vector<float> f(1000, 1.0f);
        const Wire w = comm.rank() == 1 ? Wire::fp8e4m3 : Wire::bf16;
        try {
          comm.allreduce(f.data(), f.data(), f.size(), DataType::f32, ReduceOp::sum,
                         CallOptions{.timeout = std::chrono::seconds(20), .wire = w});
          ADD_FAILURE() << "rank " << comm.rank() << ": no error";
        } catch (const ringreduce::Error& e) {
          const std::string msg = e.what();
          EXPECT_NE(msg.find("wire"), std::string::npos) << msg;
        }
      },
      transport());
}

TEST_P(WireOverEachTransport, TheSettingAppliesToTheCallsItCanAndLeavesTheOthersExact) {
  auto s = transport();
  s["RINGREDUCE_WIRE"] = "fp8e4m3";
  rrtest::run_ranks(
      3,
      [&](ringreduce::Communicator& comm) {
        // 1 + 2^-6 is not an fp8e4m3 value beside 1's block-mates: coded, the sum moves.
        std::vector<float> f(256, 1.0f);
        f[0] = 1.0f + 0x1p-6f;
        comm.allreduce(f.data(), f.data(), f.size(), DataType::f32, ReduceOp::sum);
        EXPECT_NE(f[0], 3.0f + 3 * 0x1p-6f);
        // Integers and max are not coded: exact.
        std::vector<int32_t> ints(300, 1 << 20);
        comm.allreduce(ints.data(), ints.data(), ints.size(), DataType::i32, ReduceOp::sum);
        EXPECT_EQ(ints[299], 3 << 20);
        std::vector<float> m(300, 1.0f + 0x1p-20f);
        comm.allreduce(m.data(), m.data(), m.size(), DataType::f32, ReduceOp::max);
        EXPECT_EQ(m[0], 1.0f + 0x1p-20f);
        // And a call can ask for none.
        std::vector<float> g(256, 1.0f + 0x1p-6f);
        comm.allreduce(g.data(), g.data(), g.size(), DataType::f32, ReduceOp::sum,
                       CallOptions{.wire = Wire::none});
        EXPECT_EQ(g[0], 3.0f + 3 * 0x1p-6f);
      },
      s);
}

INSTANTIATE_TEST_SUITE_P(Transports, WireOverEachTransport,
                         ::testing::ValuesIn(rrtest::transports()),
                         [](const auto& info) { return info.param; });

}  // namespace
