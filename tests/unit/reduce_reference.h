// What the reduce tests share (reduce_test.cc on the CPU kernels, reduce_cuda_test.cc on the
// device kernels): every dtype and op, reference f16/bf16 conversions written independently of
// the kernels (f16 through GCC's _Float16, bf16 through nearbyint on doubles), and random inputs.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "ringreduce/types.h"

namespace rr_test {

using ringreduce::DataType;
using ringreduce::ReduceOp;

inline constexpr DataType kAllTypes[] = {
    DataType::f16, DataType::bf16, DataType::f32, DataType::f64, DataType::i8,  DataType::u8,
    DataType::i16, DataType::i32,  DataType::u32, DataType::i64, DataType::u64, DataType::boolean};
inline constexpr ReduceOp kAllOps[] = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                                       ReduceOp::max, ReduceOp::avg,  ReduceOp::band,
                                       ReduceOp::bor, ReduceOp::bxor, ReduceOp::premul_sum};
template <class To, class From>
inline To bits_as(From f) {
  static_assert(sizeof(To) == sizeof(From));
  To t;
  std::memcpy(&t, &f, sizeof t);
  return t;
}

// ---- Reference conversions ----------------------------------------------------------------------

inline float ref_half_to_float(uint16_t h) {
  return static_cast<float>(bits_as<_Float16>(h));
}
inline uint16_t ref_float_to_half(float f) {
  return bits_as<uint16_t>(static_cast<_Float16>(f));
}

inline float ref_bf16_to_float(uint16_t b) {
  return bits_as<float>(static_cast<uint32_t>(b) << 16);
}

// Round |f| to 8 significant bits (or to the subnormal grid 2^-133) with nearbyint, which
// rounds half to even in the default mode, and read off the top 16 bits of the result.
inline uint16_t ref_float_to_bf16(float f) {
  if (std::isnan(f)) return 0x7FC0;
  const double x = std::fabs(static_cast<double>(f));
  uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  if (std::isinf(f)) return sign | 0x7F80;
  if (x == 0) return sign;
  int e;
  std::frexp(x, &e);                          // x = m * 2^e, m in [0.5, 1)
  const int ulp_exp = std::max(e - 8, -133);  // 8 significant bits; bf16 subnormal ulp 2^-133
  const double r = std::ldexp(std::nearbyint(std::ldexp(x, -ulp_exp)), ulp_exp);
  if (r >= 0x1p128) return sign | 0x7F80;
  return sign | static_cast<uint16_t>(bits_as<uint32_t>(static_cast<float>(r)) >> 16);
}

inline bool half_is_nan(uint16_t h) {
  return (h & 0x7FFF) > 0x7C00;
}
inline bool bf16_is_nan(uint16_t b) {
  return (b & 0x7FFF) > 0x7F80;
}

// Random elements of type t. Half of them are arbitrary bit patterns (NaNs, infinities,
// subnormals, huge and tiny values, every integer), half are moderate values (small integers,
// floats in [-8, 8]) so that sums and products land in the interesting range too.
inline std::vector<unsigned char> random_elements(DataType t, size_t n, std::mt19937_64& rng) {
  const size_t size = ringreduce::dtype_size(t);
  std::vector<unsigned char> out(n * size + 1);  // +1: data() is never null
  std::uniform_real_distribution<double> moderate(-8.0, 8.0);
  for (size_t i = 0; i < n; ++i) {
    uint64_t bits = rng();
    if (rng() & 1) {
      const double v = moderate(rng);
      switch (t) {
        case DataType::f16:
          bits = ref_float_to_half(static_cast<float>(v));
          break;
        case DataType::bf16:
          bits = ref_float_to_bf16(static_cast<float>(v));
          break;
        case DataType::f32:
          bits = bits_as<uint32_t>(static_cast<float>(v));
          break;
        case DataType::f64:
          bits = bits_as<uint64_t>(v);
          break;
        case DataType::boolean:
          bits = v > 0 ? 1 : 0;  // mostly 0 and 1; the arbitrary half has other bytes too
          break;
        default:
          bits = static_cast<uint64_t>(static_cast<int64_t>(v * 4));
          break;
      }
    }
    std::memcpy(out.data() + i * size, &bits, size);  // little-endian: the low bytes
  }
  return out;
}

}  // namespace rr_test
