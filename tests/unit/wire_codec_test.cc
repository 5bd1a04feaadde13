// The narrow wire formats' codecs (reduce/wire.h) against a reference written from the formats'
// definitions alone: every positive code's value computed in double from its exponent and
// mantissa fields, and the nearest one found by search (ties to the even code). Every
// instruction-set variant this CPU runs, blocks of every awkward length, inputs of mixed
// magnitudes and signs, subnormals, infinities, NaN and values near FLT_MAX.

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reduce/reduce_isa.h"
#include "reduce/wire.h"
#include "ringreduce/error.h"
#include "ringreduce/types.h"

namespace {

using ringreduce::Wire;
namespace rr = ringreduce::reduce;
namespace internal = ringreduce::reduce::internal;

const Wire kWires[] = {Wire::bf16, Wire::f16, Wire::fp8e4m3, Wire::fp8e5m2};

// Mantissa bits, exponent bits and bias of each format (IEEE-style: the all-ones exponent is
// infinity and NaN).
struct Fields {
  int m, e, bias;
};
Fields fields(Wire w) {
  switch (w) {
    case Wire::bf16:
      return {7, 8, 127};
    case Wire::f16:
      return {10, 5, 15};
    case Wire::fp8e4m3:
      return {3, 4, 7};
    default:
      return {2, 5, 15};
  }
}

// Every finite non-negative value of the format, in code order (which is value order).
std::vector<double> finite_values(Wire w) {
  const Fields f = fields(w);
  std::vector<double> v;
  for (int e = 0; e < (1 << f.e) - 1; ++e)
    for (int m = 0; m < (1 << f.m); ++m)
      v.push_back(e == 0 ? std::ldexp(m, 1 - f.bias - f.m)
                         : std::ldexp((1 << f.m) + m, e - f.bias - f.m));
  return v;
}

// The format's nearest value to y (>= 0, finite), ties to the even code; never above the largest
// finite value (scaled inputs never exceed it, and bf16 clamps there instead of overflowing).
double nearest(const std::vector<double>& values, double y) {
  size_t hi = std::lower_bound(values.begin(), values.end(), y) - values.begin();
  if (hi == values.size()) return values.back();
  if (hi == 0 || values[hi] == y) return values[hi];
  const double a = values[hi - 1], b = values[hi];
  if (y - a < b - y) return a;
  if (b - y < y - a) return b;
  return (hi - 1) % 2 == 0 ? a : b;
}

// The reference rounding of a block (what decode(encode(x)) must give), bf16 unscaled.
std::vector<float> reference_round(Wire w, const float* x, size_t n) {
  static std::vector<double> tables[8];
  std::vector<double>& values = tables[static_cast<int>(w)];
  if (values.empty()) values = finite_values(w);
  float amax = 0;
  for (size_t i = 0; i < n; ++i)
    if (std::isfinite(x[i])) amax = std::max(amax, std::fabs(x[i]));
  const int k = rr::wire_block_exponent(w, amax);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i])) {
      out[i] = x[i];
      continue;
    }
    const double y = std::ldexp(static_cast<double>(std::fabs(x[i])), -k);
    double q = std::ldexp(nearest(values, y), k);
    if (q > FLT_MAX) {  // a finite input never decodes to infinity: the largest float below
      size_t j = values.size() - 1;
      while (std::ldexp(values[j], k) > FLT_MAX) --j;
      q = std::ldexp(values[j], k);
    }
    out[i] = std::copysign(static_cast<float>(q), x[i]);
  }
  return out;
}

bool same(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::isnan(a) && std::isnan(b);
  return std::memcmp(&a, &b, 4) == 0;
}

// Mixed magnitudes: each value's exponent is drawn across a range chosen per block, so that a
// block holds values far below its largest (the fp8 scale's weak spot), of both signs.
std::vector<float> mixed(size_t n, uint32_t seed, int lo_exp, int hi_exp) {
  std::mt19937 gen(seed);
  std::uniform_int_distribution<int> ex(lo_exp, hi_exp);
  std::uniform_real_distribution<float> mant(1.0f, 2.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i)
    v[i] = std::ldexp(mant(gen), ex(gen)) * ((gen() & 1) != 0 ? -1.0f : 1.0f);
  return v;
}

std::vector<internal::Isa> isas() {
  std::vector<internal::Isa> out;
  for (internal::Isa isa : {internal::Isa::generic, internal::Isa::avx2, internal::Isa::avx512})
    if (internal::cpu_supports(isa)) out.push_back(isa);
  return out;
}

// Runs one variant's codec on x and checks it against the reference, element by element.
void check_variant(internal::Isa isa, Wire w, const std::vector<float>& x,
                   const std::string& what) {
  const internal::KernelTable& t = internal::table_for(isa);
  const int wi = static_cast<int>(w);
  const size_t n = x.size();
  std::vector<uint8_t> coded(rr::wire_bytes(w, n) + 16, 0xEE);
  t.wire_encode[wi](coded.data(), x.data(), n);
  // Nothing written past the message.
  for (size_t i = rr::wire_bytes(w, n); i < coded.size(); ++i)
    ASSERT_EQ(coded[i], 0xEE) << what << ": wrote past the coded message";
  std::vector<float> decoded(n), rounded(n), added(n), local(n);
  t.wire_decode[wi](decoded.data(), nullptr, coded.data(), n);
  t.wire_round[wi](rounded.data(), x.data(), n);
  for (size_t i = 0; i < n; ++i) local[i] = static_cast<float>(i % 7) - 3.0f;
  t.wire_decode[wi](added.data(), local.data(), coded.data(), n);
  const size_t block = rr::wire_layout(w).scaled ? rr::kWireBlock : n;
  for (size_t b = 0; b < n; b += block) {
    const size_t len = std::min(block, n - b);
    const std::vector<float> ref = reference_round(w, x.data() + b, len);
    for (size_t i = 0; i < len; ++i) {
      const size_t j = b + i;
      ASSERT_TRUE(same(decoded[j], ref[i]))
          << what << " " << internal::table_for(isa).name << " " << ringreduce::wire_name(w)
          << " element " << j << ": " << x[j] << " decoded as " << decoded[j] << ", expected "
          << ref[i];
      ASSERT_TRUE(same(rounded[j], ref[i])) << what << " round, element " << j;
      ASSERT_TRUE(same(added[j], local[j] + ref[i])) << what << " decode-add, element " << j;
    }
  }
  // In place decode-add, as the links run it.
  std::vector<float> inplace = local;
  t.wire_decode[wi](inplace.data(), inplace.data(), coded.data(), n);
  for (size_t i = 0; i < n; ++i) ASSERT_TRUE(same(inplace[i], added[i])) << what << " in place";
}

TEST(Wire, EveryVariantRoundsAsTheFormatDefinesIt) {
  for (internal::Isa isa : isas()) {
    for (Wire w : kWires) {
      for (size_t n : {size_t{1}, size_t{7}, size_t{255}, size_t{256}, size_t{257}, size_t{1000}}) {
        check_variant(isa, w, mixed(n, 17 + static_cast<uint32_t>(n), -30, 30), "mixed");
        // Subnormal floats and values around the formats' own subnormal ranges.
        check_variant(isa, w, mixed(n, 5, -149, -120), "float subnormals");
        check_variant(isa, w, mixed(n, 6, -24, 0), "small");
        // Around the top of float32: nothing finite may decode to infinity.
        check_variant(isa, w, mixed(n, 7, 120, 127), "near FLT_MAX");
      }
    }
  }
}

TEST(Wire, InfinityAndNanKeepTheirMeaningAndDoNotSpoilTheirBlock) {
  const float inf = std::numeric_limits<float>::infinity();
  for (internal::Isa isa : isas()) {
    for (Wire w : kWires) {
      std::vector<float> x = mixed(300, 9, -10, 10);
      x[3] = inf;
      x[4] = -inf;
      x[5] = std::numeric_limits<float>::quiet_NaN();
      x[260] = FLT_MAX;
      x[261] = -FLT_MAX;
      check_variant(isa, w, x, "specials");
      std::vector<float> r(x.size());
      rr::wire_round(r.data(), x.data(), x.size(), w);
      EXPECT_EQ(r[3], inf);
      EXPECT_EQ(r[4], -inf);
      EXPECT_TRUE(std::isnan(r[5]));
      EXPECT_TRUE(std::isfinite(r[260]) && r[260] > 0) << ringreduce::wire_name(w);
      EXPECT_TRUE(std::isfinite(r[261]) && r[261] < 0) << ringreduce::wire_name(w);
    }
  }
}

TEST(Wire, ErrorWithinTheStatedBoundAndRoundingIsIdempotent) {
  for (Wire w : kWires) {
    const std::vector<float> x = mixed(4096, 11, -40, 40);
    std::vector<float> r(x.size()), rr2(x.size());
    rr::wire_round(r.data(), x.data(), x.size(), w);
    rr::wire_round(rr2.data(), r.data(), r.size(), w);
    for (size_t b = 0; b < x.size(); b += rr::kWireBlock) {
      float amax = 0;
      for (size_t i = b; i < b + rr::kWireBlock; ++i) amax = std::max(amax, std::fabs(x[i]));
      const int k = rr::wire_block_exponent(w, amax);
      for (size_t i = b; i < b + rr::kWireBlock; ++i) {
        const double err = std::fabs(static_cast<double>(r[i]) - x[i]);
        ASSERT_LE(err, rr::wire_error_bound(w, x[i], k))
            << ringreduce::wire_name(w) << " element " << i << " " << x[i] << " -> " << r[i];
        // A rounded value codes to itself: a rank that rounds its result and sends it coded
        // gives every receiver its own values.
        ASSERT_TRUE(same(rr2[i], r[i])) << ringreduce::wire_name(w) << " element " << i;
      }
    }
  }
}

TEST(Wire, MessagesCutBetweenUnitsDecodeAsTheWhole) {
  for (Wire w : kWires) {
    const std::vector<float> x = mixed(5000, 13, -20, 20);
    std::vector<uint8_t> whole(rr::wire_bytes(w, x.size()));
    rr::wire_encode(whole.data(), x.data(), x.size(), w);
    // Pieces as a link cuts them: as many whole units as fit in 1000 bytes.
    const size_t per = rr::wire_elems_fitting(w, 1000);
    ASSERT_GT(per, 0u);
    std::vector<uint8_t> pieces(whole.size());
    for (size_t e = 0; e < x.size(); e += per) {
      const size_t n = std::min(per, x.size() - e);
      rr::wire_encode(pieces.data() + rr::wire_offset(w, e), x.data() + e, n, w);
    }
    EXPECT_EQ(pieces, whole) << ringreduce::wire_name(w);
  }
  EXPECT_EQ(rr::wire_bytes(Wire::bf16, 10), 20u);
  EXPECT_EQ(rr::wire_bytes(Wire::fp8e4m3, 257), 2 * 4 + 257u);
  EXPECT_EQ(rr::wire_bytes(Wire::f16, 256), 4 + 512u);
  EXPECT_THROW(rr::wire_bytes(Wire::none, 1), ringreduce::InvalidArgument);
}

TEST(Wire, NamesParseAndPrint) {
  for (int i = 0; i < ringreduce::kNumWires; ++i) {
    Wire w{};
    ASSERT_TRUE(ringreduce::parse_wire(ringreduce::wire_name(static_cast<Wire>(i)), &w));
    EXPECT_EQ(static_cast<int>(w), i);
  }
  Wire w{};
  EXPECT_TRUE(ringreduce::parse_wire("fp8", &w));
  EXPECT_EQ(w, Wire::fp8e4m3);
  EXPECT_FALSE(ringreduce::parse_wire("fp4", &w));
}

}  // namespace
