// Test data whose reductions are exact in every dtype, shared by ringreduce-perf's checker and
// the tests. Values are small integers (products use only 1 and 2), so sums, products, min and
// max are exact in f16/bf16 too, and the pattern repeats every kPeriod elements, so a checker
// compares against kPeriod precomputed values instead of recomputing every element. bool inputs
// are 0 and 1 (mostly 1: and, or and xor all see both); premul_sum is checked with its default
// factor 1 here (a sum), the tests scale with other factors themselves.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "reduce/reduce.h"
#include "ringreduce/types.h"

namespace ringreduce::exact {

inline constexpr size_t kPeriod = 15;

inline bool is_unsigned(DataType t) {
  return t == DataType::u8 || t == DataType::u32 || t == DataType::u64;
}

// The value rank `rank` contributes at element i.
inline double input_value(int rank, size_t i, DataType t, ReduceOp op) {
  if (t == DataType::boolean) return ((i * 7 + static_cast<size_t>(rank) * 3) % 5 == 0) ? 0 : 1;
  if (op == ReduceOp::prod) return ((i + static_cast<size_t>(rank)) % 3 == 0) ? 2.0 : 1.0;
  const double v = static_cast<double>((i * 7 + static_cast<size_t>(rank) * 3) % 5);
  return is_unsigned(t) ? v : v - 2.0;
}

inline void store_value(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::f16:
      static_cast<uint16_t*>(p)[i] = reduce::float_to_half(static_cast<float>(v));
      break;
    case DataType::bf16:
      static_cast<uint16_t*>(p)[i] = reduce::float_to_bf16(static_cast<float>(v));
      break;
    case DataType::f32:
      static_cast<float*>(p)[i] = static_cast<float>(v);
      break;
    case DataType::f64:
      static_cast<double*>(p)[i] = v;
      break;
    case DataType::i8:
      static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v));
      break;
    case DataType::u8:
      static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v));
      break;
    case DataType::i32:
      static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v));
      break;
    case DataType::u32:
      static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v));
      break;
    case DataType::i64:
      static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v);
      break;
    case DataType::u64:
      static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(static_cast<int64_t>(v));
      break;
    case DataType::i16:
      static_cast<int16_t*>(p)[i] = static_cast<int16_t>(static_cast<int64_t>(v));
      break;
    case DataType::boolean:
      static_cast<uint8_t*>(p)[i] = v != 0 ? 1 : 0;
      break;
  }
}

inline double load_value(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::f16:
      return reduce::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::bf16:
      return reduce::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::f32:
      return static_cast<const float*>(p)[i];
    case DataType::f64:
      return static_cast<const double*>(p)[i];
    case DataType::i8:
      return static_cast<const int8_t*>(p)[i];
    case DataType::u8:
      return static_cast<const uint8_t*>(p)[i];
    case DataType::i32:
      return static_cast<const int32_t*>(p)[i];
    case DataType::u32:
      return static_cast<const uint32_t*>(p)[i];
    case DataType::i64:
      return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::u64:
      return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
    case DataType::i16:
      return static_cast<const int16_t*>(p)[i];
    case DataType::boolean:
      return static_cast<const uint8_t*>(p)[i];
  }
  return 0;
}

// The exact reduction over `size` ranks at element i, rounded as the dtype stores it (avg
// divides the exact sum once, in the precision the reduce kernels use).
inline double expected_value(int size, size_t i, DataType t, ReduceOp op) {
  double acc = input_value(0, i, t, op);
  for (int r = 1; r < size; ++r) {
    const double v = input_value(r, i, t, op);
    // Bitwise on the values as the integers they are (small, so two's complement in any width).
    const auto bits = [&](auto f) {
      acc = static_cast<double>(f(static_cast<int64_t>(acc), static_cast<int64_t>(v)));
    };
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::avg:
      case ReduceOp::premul_sum:
        acc += v;
        break;
      case ReduceOp::band:
        bits([](int64_t a, int64_t b) { return a & b; });
        break;
      case ReduceOp::bor:
        bits([](int64_t a, int64_t b) { return a | b; });
        break;
      case ReduceOp::bxor:
        bits([](int64_t a, int64_t b) { return a ^ b; });
        break;
      case ReduceOp::prod:
        acc *= v;
        break;
      case ReduceOp::min:
        acc = std::min(acc, v);
        break;
      case ReduceOp::max:
        acc = std::max(acc, v);
        break;
    }
  }
  // bool: a sum is an or, a product an and (truth values).
  if (t == DataType::boolean) acc = acc != 0 ? 1 : 0;
  if (op == ReduceOp::avg) {
    switch (t) {
      case DataType::f64:
        acc = acc / size;
        break;
      case DataType::f32:
      case DataType::f16:
      case DataType::bf16:
        acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(size));
        break;
      default:
        acc = std::trunc(acc / size);
        break;
    }
  }
  uint64_t slot = 0;  // round-trip through the dtype: wraps integers, rounds floats
  store_value(t, &slot, 0, acc);
  return load_value(t, &slot, 0);
}

// Fills count elements starting at global element `first` with rank's input.
inline void fill_input(void* p, size_t count, int rank, DataType t, ReduceOp op, size_t first = 0) {
  const size_t elem = dtype_size(t);
  unsigned char pattern[kPeriod * 8];
  for (size_t k = 0; k < kPeriod; ++k)
    store_value(t, pattern, k, input_value(rank, first + k, t, op));
  for (size_t i = 0; i < count; i += kPeriod)
    std::memcpy(static_cast<char*>(p) + i * elem, pattern, std::min(kPeriod, count - i) * elem);
}

// Elements of p[0, count) (global elements first.. first+count) that differ bitwise from the
// expected reduction over `size` ranks.
inline size_t count_wrong_reduced(const void* p, size_t count, int size, DataType t, ReduceOp op,
                                  size_t first = 0) {
  const size_t elem = dtype_size(t);
  unsigned char want[kPeriod * 8];
  for (size_t k = 0; k < kPeriod; ++k)
    store_value(t, want, k, expected_value(size, first + k, t, op));
  size_t wrong = 0;
  const char* q = static_cast<const char*>(p);
  for (size_t i = 0; i < count; ++i)
    if (std::memcmp(q + i * elem, want + (i % kPeriod) * elem, elem) != 0) ++wrong;
  return wrong;
}

// The same for a result coded on the wire (CallOptions::wire): within `roundoff` x (the sum of
// the inputs' magnitudes + the result's) of the exact value (one rounding of each input and one
// of the result; the inputs here, small integers, code exactly), plus float32's own rounding.
inline size_t count_wrong_reduced(const void* p, size_t count, int size, DataType t, ReduceOp op,
                                  size_t first, double roundoff) {
  size_t wrong = 0;
  for (size_t i = 0; i < count; ++i) {
    const double want = expected_value(size, first + i, t, op);
    double mag = 0;
    for (int r = 0; r < size; ++r) mag += std::fabs(input_value(r, first + i, t, op));
    const double tol = roundoff * (mag + std::fabs(want)) + 0x1p-22 * (mag + 1);
    if (!(std::fabs(load_value(t, p, i) - want) <= tol)) ++wrong;
  }
  return wrong;
}

// Elements of p[0, count) that differ from rank's input (global elements first..).
inline size_t count_wrong_input(const void* p, size_t count, int rank, DataType t, ReduceOp op,
                                size_t first = 0) {
  const size_t elem = dtype_size(t);
  unsigned char want[kPeriod * 8];
  for (size_t k = 0; k < kPeriod; ++k) store_value(t, want, k, input_value(rank, first + k, t, op));
  size_t wrong = 0;
  const char* q = static_cast<const char*>(p);
  for (size_t i = 0; i < count; ++i)
    if (std::memcmp(q + i * elem, want + (i % kPeriod) * elem, elem) != 0) ++wrong;
  return wrong;
}

}  // namespace ringreduce::exact
