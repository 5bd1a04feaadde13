// Reduce kernels against a scalar reference: every dtype x op that applies to it x every
// instruction-set variant this CPU supports, at counts around every vector width, out of place
// and in place; plus the f16 and bf16 conversions (exhaustive for f16), integer wraparound,
// truncating division, premul_sum's scaling, and bool's truth-value semantics.
//
// The references are written independently of the kernels: f16 goes through GCC's _Float16
// (libgcc's soft-float conversions), bf16 through nearbyint on doubles, integers through 64- and
// 128-bit arithmetic. Floating-point results compare bit for bit, except that any NaN matches any
// NaN (the compiler may swap the operands of a commutative add, which changes which NaN payload
// x86 propagates).

#include <immintrin.h>
#include <sys/mman.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <limits>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "reduce/reduce.h"
#include "reduce/reduce_isa.h"
#include "reduce_reference.h"
#include "ringreduce/error.h"
#include "ringreduce/types.h"

namespace {

using ringreduce::DataType;
using ringreduce::ReduceOp;
namespace rr = ringreduce::reduce;
namespace ri = ringreduce::reduce::internal;
using namespace rr_test;  // reduce_reference.h

constexpr ri::Isa kAllIsas[] = {ri::Isa::generic, ri::Isa::avx2, ri::Isa::avx512};
constexpr size_t kCounts[] = {0, 1, 7, 15, 16, 17, 63, 64, 65, 1000, 4099};

const char* isa_name(ri::Isa isa) {
  return ri::table_for(isa).name;
}

// ---- Reference kernels --------------------------------------------------------------------------

template <class T>
T ref_op(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(op == ReduceOp::band ? a & b : op == ReduceOp::bor ? a | b : a ^ b);
      } else {
        return T{};  // no such kernel (op_applies)
      }
    case ReduceOp::sum:
    case ReduceOp::avg:
    case ReduceOp::premul_sum:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      } else {
        return a + b;
      }
    case ReduceOp::prod:
      if constexpr (std::is_integral_v<T>) {
        return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      } else {
        return a * b;
      }
    case ReduceOp::min:
      return a < b ? a : b;
    case ReduceOp::max:
      return a > b ? a : b;
  }
  return T{};
}

template <class T>
void ref_combine_typed(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    T x, y;
    std::memcpy(&x, static_cast<const T*>(a) + i, sizeof x);
    std::memcpy(&y, static_cast<const T*>(b) + i, sizeof y);
    const T r = ref_op(x, y, op);
    std::memcpy(static_cast<T*>(dst) + i, &r, sizeof r);
  }
}

template <float (*Load)(uint16_t), uint16_t (*Store)(float)>
void ref_combine_16(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    const float x = Load(static_cast<const uint16_t*>(a)[i]);
    const float y = Load(static_cast<const uint16_t*>(b)[i]);
    static_cast<uint16_t*>(dst)[i] = Store(ref_op(x, y, op));
  }
}

// bool: truth values (any non-zero byte is true); sum and max are or, prod and min are and.
void ref_combine_bool(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  for (size_t i = 0; i < n; ++i) {
    const bool x = static_cast<const unsigned char*>(a)[i] != 0;
    const bool y = static_cast<const unsigned char*>(b)[i] != 0;
    bool r = false;
    switch (op) {
      case ReduceOp::sum:
      case ReduceOp::max:
      case ReduceOp::bor:
        r = x || y;
        break;
      case ReduceOp::prod:
      case ReduceOp::min:
      case ReduceOp::band:
        r = x && y;
        break;
      case ReduceOp::bxor:
        r = x != y;
        break;
      default:
        break;
    }
    static_cast<unsigned char*>(dst)[i] = r ? 1 : 0;
  }
}

void ref_combine(void* dst, const void* a, const void* b, size_t n, DataType t, ReduceOp op) {
  switch (t) {
    case DataType::boolean:
      return ref_combine_bool(dst, a, b, n, op);
    case DataType::i16:
      return ref_combine_typed<int16_t>(dst, a, b, n, op);
    case DataType::f16:
      return ref_combine_16<ref_half_to_float, ref_float_to_half>(dst, a, b, n, op);
    case DataType::bf16:
      return ref_combine_16<ref_bf16_to_float, ref_float_to_bf16>(dst, a, b, n, op);
    case DataType::f32:
      return ref_combine_typed<float>(dst, a, b, n, op);
    case DataType::f64:
      return ref_combine_typed<double>(dst, a, b, n, op);
    case DataType::i8:
      return ref_combine_typed<int8_t>(dst, a, b, n, op);
    case DataType::u8:
      return ref_combine_typed<uint8_t>(dst, a, b, n, op);
    case DataType::i32:
      return ref_combine_typed<int32_t>(dst, a, b, n, op);
    case DataType::u32:
      return ref_combine_typed<uint32_t>(dst, a, b, n, op);
    case DataType::i64:
      return ref_combine_typed<int64_t>(dst, a, b, n, op);
    case DataType::u64:
      return ref_combine_typed<uint64_t>(dst, a, b, n, op);
  }
}

template <class T>
T ref_div(T x, uint64_t d) {
  if constexpr (std::is_integral_v<T>) {
    // __int128 holds every dividend and divisor, and its / truncates toward zero.
    return static_cast<T>(static_cast<__int128>(x) / static_cast<__int128>(d));
  } else {
    return x / static_cast<T>(d);
  }
}

template <class T>
void ref_divide_typed(void* dst, const void* src, size_t n, uint64_t d) {
  for (size_t i = 0; i < n; ++i) {
    T x;
    std::memcpy(&x, static_cast<const T*>(src) + i, sizeof x);
    const T r = ref_div(x, d);
    std::memcpy(static_cast<T*>(dst) + i, &r, sizeof r);
  }
}

void ref_divide(void* dst, const void* src, size_t n, DataType t, uint64_t d) {
  switch (t) {
    case DataType::f16:
      for (size_t i = 0; i < n; ++i) {
        static_cast<uint16_t*>(dst)[i] = ref_float_to_half(
            ref_half_to_float(static_cast<const uint16_t*>(src)[i]) / static_cast<float>(d));
      }
      return;
    case DataType::bf16:
      for (size_t i = 0; i < n; ++i) {
        static_cast<uint16_t*>(dst)[i] = ref_float_to_bf16(
            ref_bf16_to_float(static_cast<const uint16_t*>(src)[i]) / static_cast<float>(d));
      }
      return;
    case DataType::f32:
      return ref_divide_typed<float>(dst, src, n, d);
    case DataType::f64:
      return ref_divide_typed<double>(dst, src, n, d);
    case DataType::i8:
      return ref_divide_typed<int8_t>(dst, src, n, d);
    case DataType::u8:
      return ref_divide_typed<uint8_t>(dst, src, n, d);
    case DataType::i32:
      return ref_divide_typed<int32_t>(dst, src, n, d);
    case DataType::u32:
      return ref_divide_typed<uint32_t>(dst, src, n, d);
    case DataType::i64:
      return ref_divide_typed<int64_t>(dst, src, n, d);
    case DataType::u64:
      return ref_divide_typed<uint64_t>(dst, src, n, d);
    case DataType::i16:
      return ref_divide_typed<int16_t>(dst, src, n, d);
    case DataType::boolean:
      return;  // no avg on bool
  }
}

// ---- Comparison and input generation ------------------------------------------------------------

// Element i of two buffers as equal: bitwise, or both NaN.
bool same_element(const void* x, const void* y, size_t i, DataType t) {
  const size_t size = ringreduce::dtype_size(t);
  const auto* px = static_cast<const unsigned char*>(x) + i * size;
  const auto* py = static_cast<const unsigned char*>(y) + i * size;
  if (std::memcmp(px, py, size) == 0) return true;
  switch (t) {
    case DataType::f16: {
      uint16_t a, b;
      std::memcpy(&a, px, 2);
      std::memcpy(&b, py, 2);
      return half_is_nan(a) && half_is_nan(b);
    }
    case DataType::bf16: {
      uint16_t a, b;
      std::memcpy(&a, px, 2);
      std::memcpy(&b, py, 2);
      return bf16_is_nan(a) && bf16_is_nan(b);
    }
    case DataType::f32: {
      float a, b;
      std::memcpy(&a, px, 4);
      std::memcpy(&b, py, 4);
      return std::isnan(a) && std::isnan(b);
    }
    case DataType::f64: {
      double a, b;
      std::memcpy(&a, px, 8);
      std::memcpy(&b, py, 8);
      return std::isnan(a) && std::isnan(b);
    }
    default:
      return false;
  }
}

std::string element_hex(const void* p, size_t i, DataType t) {
  const size_t size = ringreduce::dtype_size(t);
  uint64_t v = 0;
  std::memcpy(&v, static_cast<const unsigned char*>(p) + i * size, size);
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%0*llx", static_cast<int>(2 * size),
                static_cast<unsigned long long>(v));
  return buf;
}

// Index of the first mismatch, or n.
size_t first_mismatch(const void* got, const void* want, size_t n, DataType t) {
  for (size_t i = 0; i < n; ++i) {
    if (!same_element(got, want, i, t)) return i;
  }
  return n;
}

// ---- Combine: every dtype x op x ISA ------------------------------------------------------------

struct KernelCase {
  ri::Isa isa;
  DataType type;
  ReduceOp op;
};

// gtest prints failing parameters with this instead of as raw bytes.
void PrintTo(const KernelCase& c, std::ostream* os) {
  *os << isa_name(c.isa) << " " << ringreduce::dtype_name(c.type) << " "
      << ringreduce::op_name(c.op);
}

std::string case_name(const testing::TestParamInfo<KernelCase>& info) {
  return std::string(isa_name(info.param.isa)) + "_" + ringreduce::dtype_name(info.param.type) +
         "_" + ringreduce::op_name(info.param.op);
}

std::vector<KernelCase> all_cases() {
  std::vector<KernelCase> cases;
  for (ri::Isa isa : kAllIsas) {
    for (DataType t : kAllTypes) {
      for (ReduceOp op : kAllOps)
        if (ringreduce::op_applies(op, t)) cases.push_back({isa, t, op});
    }
  }
  return cases;
}

class CombineTest : public testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    if (!ri::cpu_supports(GetParam().isa)) {
      GTEST_SKIP() << "CPU lacks " << isa_name(GetParam().isa);
    }
  }
};

TEST_P(CombineTest, MatchesReferenceInAndOutOfPlace) {
  const auto [isa, t, op] = GetParam();
  const ri::CombineFn fn = ri::table_for(isa).combine[static_cast<int>(t)][static_cast<int>(op)];
  ASSERT_NE(fn, nullptr);
  const size_t size = ringreduce::dtype_size(t);
  std::mt19937_64 rng(1234 + static_cast<int>(t) * 10 + static_cast<int>(op));

  for (size_t n : kCounts) {
    // offset 1 puts every buffer off its natural vector alignment.
    for (size_t offset : {size_t{0}, size_t{1}}) {
      SCOPED_TRACE("count " + std::to_string(n) + " offset " + std::to_string(offset));
      const auto a_data = random_elements(t, n + offset, rng);
      const auto b_data = random_elements(t, n + offset, rng);
      const unsigned char* a = a_data.data() + offset * size;
      const unsigned char* b = b_data.data() + offset * size;
      std::vector<unsigned char> want(n * size + 1);
      ref_combine(want.data(), a, b, n, t, op);

      // Out of place; the destination starts as garbage that must be overwritten.
      std::vector<unsigned char> out_data((n + offset) * size + 1, 0xA5);
      unsigned char* out = out_data.data() + offset * size;
      fn(out, a, b, n);
      size_t bad = first_mismatch(out, want.data(), n, t);
      ASSERT_EQ(bad, n) << "out of place: element " << bad << " a=" << element_hex(a, bad, t)
                        << " b=" << element_hex(b, bad, t) << " got " << element_hex(out, bad, t)
                        << " want " << element_hex(want.data(), bad, t);
      // Nothing written past the end.
      EXPECT_EQ(out_data[(n + offset) * size], 0xA5);

      // dst == a.
      auto in_a = a_data;
      fn(in_a.data() + offset * size, in_a.data() + offset * size, b, n);
      bad = first_mismatch(in_a.data() + offset * size, want.data(), n, t);
      ASSERT_EQ(bad, n) << "dst == a: element " << bad;

      // dst == b.
      auto in_b = b_data;
      fn(in_b.data() + offset * size, a, in_b.data() + offset * size, n);
      bad = first_mismatch(in_b.data() + offset * size, want.data(), n, t);
      ASSERT_EQ(bad, n) << "dst == b: element " << bad;

      // dst == a == b.
      std::vector<unsigned char> self_want(n * size + 1);
      ref_combine(self_want.data(), a, a, n, t, op);
      auto self = a_data;
      unsigned char* s = self.data() + offset * size;
      fn(s, s, s, n);
      bad = first_mismatch(s, self_want.data(), n, t);
      ASSERT_EQ(bad, n) << "dst == a == b: element " << bad;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(AllKernels, CombineTest, testing::ValuesIn(all_cases()), case_name);

// ---- Streaming combine (f32 and f64, every op) --------------------------------------------------

class StreamTest : public testing::TestWithParam<KernelCase> {
 protected:
  void SetUp() override {
    if (!ri::cpu_supports(GetParam().isa)) {
      GTEST_SKIP() << "CPU lacks " << isa_name(GetParam().isa);
    }
  }
};

std::vector<KernelCase> stream_cases() {
  std::vector<KernelCase> cases;
  for (ri::Isa isa : kAllIsas) {
    for (DataType t : {DataType::f32, DataType::f64}) {
      for (ReduceOp op : kAllOps)
        if (ringreduce::op_applies(op, t)) cases.push_back({isa, t, op});
    }
  }
  return cases;
}

TEST_P(StreamTest, MatchesReferenceAtEveryAlignment) {
  const auto [isa, t, op] = GetParam();
  const ri::StreamFn fn =
      ri::table_for(isa).combine_stream[static_cast<int>(t)][static_cast<int>(op)];
  ASSERT_NE(fn, nullptr);
  const size_t size = ringreduce::dtype_size(t);
  std::mt19937_64 rng(99);
  std::vector<size_t> counts(std::begin(kCounts), std::end(kCounts));
  counts.push_back(100003);
  for (size_t n : counts) {
    // Destination offsets walk through every element position within a 64-byte vector, so the
    // scalar head that aligns the streaming stores takes every length it can.
    for (size_t offset = 0; offset < 64 / size; offset += (n > 5000 ? 5 : 1)) {
      SCOPED_TRACE("count " + std::to_string(n) + " dst offset " + std::to_string(offset));
      const auto a = random_elements(t, n, rng);
      const auto b = random_elements(t, n, rng);
      std::vector<unsigned char> want(n * size + 1);
      ref_combine(want.data(), a.data(), b.data(), n, t, op);
      std::vector<unsigned char> out_data((n + offset) * size + 64, 0xA5);
      // Align the base to 64 bytes, then step offset elements in.
      auto base = reinterpret_cast<uintptr_t>(out_data.data());
      unsigned char* out = out_data.data() + ((64 - base % 64) % 64) + offset * size;
      fn(out, a.data(), b.data(), n);
      const size_t bad = first_mismatch(out, want.data(), n, t);
      ASSERT_EQ(bad, n) << "element " << bad;
      // In place falls back to the ordinary kernel and must still be right.
      auto in_a = a;
      fn(in_a.data(), in_a.data(), b.data(), n);
      ASSERT_EQ(first_mismatch(in_a.data(), want.data(), n, t), n);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(FloatKernels, StreamTest, testing::ValuesIn(stream_cases()), case_name);

TEST(StreamCopy, EveryIsaCopiesEveryByteAtEveryAlignment) {
  std::mt19937_64 rng(7);
  for (ri::Isa isa : kAllIsas) {
    if (!ri::cpu_supports(isa)) continue;
    const ri::CopyFn fn = ri::table_for(isa).copy_stream;
    ASSERT_NE(fn, nullptr) << isa_name(isa);
    for (size_t n : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{255}, size_t{256},
                     size_t{1000}, size_t{262147}}) {
      for (size_t dst_off : {0, 1, 7, 16, 63}) {
        for (size_t src_off : {0, 3, 32}) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " bytes " + std::to_string(n) + " dst+" +
                       std::to_string(dst_off) + " src+" + std::to_string(src_off));
          std::vector<unsigned char> src(n + 64), dst(n + 128, 0xA5);
          for (auto& c : src) c = static_cast<unsigned char>(rng());
          auto base = reinterpret_cast<uintptr_t>(dst.data());
          unsigned char* d = dst.data() + ((64 - base % 64) % 64) + dst_off;
          const auto before = dst;
          fn(d, src.data() + src_off, n);
          ASSERT_EQ(0, std::memcmp(d, src.data() + src_off, n));
          // Nothing outside [d, d + n) is touched.
          for (size_t i = 0; i < dst.size(); ++i) {
            const bool inside = dst.data() + i >= d && dst.data() + i < d + n;
            if (!inside) {
              ASSERT_EQ(dst[i], before[i]) << "byte " << i;
            }
          }
        }
      }
    }
  }
  // The public entry point, both ways.
  std::vector<char> a(5000, 'x'), b(5000), c(5000);
  ringreduce::reduce::copy(b.data(), a.data(), a.size(), true);
  ringreduce::reduce::copy(c.data(), a.data(), a.size(), false);
  EXPECT_EQ(b, a);
  EXPECT_EQ(c, a);
}

TEST(CachedCopy, CopiesEveryByteOnBothSidesOfTheRepMovsbThreshold) {
  // copy(..., false) switches from memcpy to `rep movsb` at 2112 bytes (where the CPU has ERMS).
  std::mt19937_64 rng(11);
  for (size_t n : {size_t{0}, size_t{1}, size_t{2111}, size_t{2112}, size_t{2113}, size_t{262144},
                   size_t{262147}}) {
    for (size_t dst_off : {0, 1, 63}) {
      for (size_t src_off : {0, 5}) {
        SCOPED_TRACE("bytes " + std::to_string(n) + " dst+" + std::to_string(dst_off) + " src+" +
                     std::to_string(src_off));
        std::vector<unsigned char> src(n + 8), dst(n + 128, 0x5A);
        for (auto& c : src) c = static_cast<unsigned char>(rng());
        ringreduce::reduce::copy(dst.data() + dst_off, src.data() + src_off, n, false);
        ASSERT_EQ(0, std::memcmp(dst.data() + dst_off, src.data() + src_off, n));
        for (size_t i = 0; i < dst_off; ++i) ASSERT_EQ(dst[i], 0x5A) << "byte " << i;
        for (size_t i = dst_off + n; i < dst.size(); ++i) ASSERT_EQ(dst[i], 0x5A) << "byte " << i;
      }
    }
  }
}

TEST(ReduceTables, StreamKernelsOnlyForF32AndF64) {
  for (ri::Isa isa : kAllIsas) {
    for (DataType t : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        const bool has =
            ri::table_for(isa).combine_stream[static_cast<int>(t)][static_cast<int>(op)] != nullptr;
        EXPECT_EQ(has, (t == DataType::f32 || t == DataType::f64) && ringreduce::op_applies(op, t))
            << isa_name(isa) << " " << ringreduce::dtype_name(t) << " " << ringreduce::op_name(op);
      }
    }
  }
}

TEST(ReduceTables, AKernelForEveryOpThatAppliesAndNoneElse) {
  for (ri::Isa isa : kAllIsas)
    for (DataType t : kAllTypes)
      for (ReduceOp op : kAllOps) {
        const bool has = ri::table_for(isa).combine[static_cast<int>(t)][static_cast<int>(op)];
        EXPECT_EQ(has, ringreduce::op_applies(op, t))
            << isa_name(isa) << " " << ringreduce::dtype_name(t) << " " << ringreduce::op_name(op);
      }
  // The public entry refuses what does not apply instead of calling nothing.
  std::vector<float> f(4, 1.0f);
  EXPECT_THROW(rr::combine(f.data(), f.data(), f.data(), 4, DataType::f32, ReduceOp::bxor),
               ringreduce::InvalidArgument);
  std::vector<uint8_t> b(4, 1);
  EXPECT_THROW(rr::divide(b.data(), b.data(), 4, DataType::boolean, 2),
               ringreduce::InvalidArgument);
  EXPECT_THROW(rr::scale(b.data(), b.data(), 4, DataType::i8, 0.5), ringreduce::InvalidArgument);
}

// premul_sum's premultiplication: every floating-point type, every ISA, against the reference
// (f16 and bf16 multiply in f32 and round once).
TEST(ReduceValues, ScaleMultipliesOnceAndRoundsOnce) {
  std::mt19937_64 rng(99);
  for (ri::Isa isa : kAllIsas) {
    if (!ri::cpu_supports(isa)) continue;
    for (DataType t : {DataType::f16, DataType::bf16, DataType::f32, DataType::f64})
      for (double factor : {0.25, -3.0, 1.0 / 3.0}) {
        const size_t n = 1001, size = ringreduce::dtype_size(t);
        const auto src = random_elements(t, n, rng);
        std::vector<unsigned char> got(n * size + 1), want(n * size + 1);
        ri::table_for(isa).scale[static_cast<int>(t)](got.data(), src.data(), n, factor);
        for (size_t i = 0; i < n; ++i) {
          switch (t) {
            case DataType::f16: {
              uint16_t h;
              std::memcpy(&h, src.data() + 2 * i, 2);
              const uint16_t r =
                  ref_float_to_half(ref_half_to_float(h) * static_cast<float>(factor));
              std::memcpy(want.data() + 2 * i, &r, 2);
              break;
            }
            case DataType::bf16: {
              uint16_t h;
              std::memcpy(&h, src.data() + 2 * i, 2);
              const uint16_t r =
                  ref_float_to_bf16(ref_bf16_to_float(h) * static_cast<float>(factor));
              std::memcpy(want.data() + 2 * i, &r, 2);
              break;
            }
            case DataType::f32: {
              float x;
              std::memcpy(&x, src.data() + 4 * i, 4);
              const float r = x * static_cast<float>(factor);
              std::memcpy(want.data() + 4 * i, &r, 4);
              break;
            }
            default: {
              double x;
              std::memcpy(&x, src.data() + 8 * i, 8);
              const double r = x * factor;
              std::memcpy(want.data() + 8 * i, &r, 8);
              break;
            }
          }
        }
        const size_t bad = first_mismatch(got.data(), want.data(), n, t);
        EXPECT_EQ(bad, n) << isa_name(isa) << " " << ringreduce::dtype_name(t) << " x " << factor
                          << " element " << bad;
      }
  }
}

// ---- Divide: every dtype x ISA ------------------------------------------------------------------

struct DivideCase {
  ri::Isa isa;
  DataType type;
};

void PrintTo(const DivideCase& c, std::ostream* os) {
  *os << isa_name(c.isa) << " " << ringreduce::dtype_name(c.type);
}

class DivideTest : public testing::TestWithParam<DivideCase> {
 protected:
  void SetUp() override {
    if (!ri::cpu_supports(GetParam().isa)) {
      GTEST_SKIP() << "CPU lacks " << isa_name(GetParam().isa);
    }
  }
};

std::vector<DivideCase> divide_cases() {
  std::vector<DivideCase> cases;
  for (ri::Isa isa : kAllIsas) {
    for (DataType t : kAllTypes)
      if (ringreduce::op_applies(ReduceOp::avg, t)) cases.push_back({isa, t});
  }
  return cases;
}

// Extremes of every integer width, so that INT_MIN / 1, -1 / huge and friends get divided.
void plant_extremes(std::vector<unsigned char>& data, DataType t, size_t n) {
  const size_t size = ringreduce::dtype_size(t);
  const uint64_t patterns[] = {0,
                               1,
                               ~uint64_t{0},                         // -1 / max unsigned
                               uint64_t{1} << (8 * size - 1),        // signed minimum
                               (uint64_t{1} << (8 * size - 1)) - 1,  // signed maximum
                               (uint64_t{1} << (8 * size - 1)) + 1,
                               7,
                               static_cast<uint64_t>(-7)};
  for (size_t i = 0; i < n && i < std::size(patterns); ++i) {
    std::memcpy(data.data() + i * size, &patterns[i], size);
  }
}

TEST_P(DivideTest, MatchesReference) {
  const auto [isa, t] = GetParam();
  const ri::DivideFn fn = ri::table_for(isa).divide[static_cast<int>(t)];
  ASSERT_NE(fn, nullptr);
  const size_t size = ringreduce::dtype_size(t);
  std::mt19937_64 rng(7 + static_cast<int>(t));
  const uint64_t divisors[] = {1,
                               2,
                               3,
                               7,
                               8,
                               127,
                               128,
                               255,
                               256,
                               1000,
                               (uint64_t{1} << 31) - 1,
                               uint64_t{1} << 31,
                               (uint64_t{1} << 32) + 1,
                               (uint64_t{1} << 53) + 1,
                               uint64_t{1} << 63,
                               ~uint64_t{0}};
  for (size_t n : kCounts) {
    for (uint64_t d : divisors) {
      SCOPED_TRACE("count " + std::to_string(n) + " divisor " + std::to_string(d));
      auto src = random_elements(t, n, rng);
      if (!ringreduce::is_float(t)) plant_extremes(src, t, n);
      std::vector<unsigned char> want(n * size + 1);
      ref_divide(want.data(), src.data(), n, t, d);

      std::vector<unsigned char> out(n * size + 1);
      fn(out.data(), src.data(), n, d);
      size_t bad = first_mismatch(out.data(), want.data(), n, t);
      ASSERT_EQ(bad, n) << "out of place: element " << bad << " src "
                        << element_hex(src.data(), bad, t) << " got "
                        << element_hex(out.data(), bad, t) << " want "
                        << element_hex(want.data(), bad, t);
      fn(src.data(), src.data(), n, d);
      bad = first_mismatch(src.data(), want.data(), n, t);
      ASSERT_EQ(bad, n) << "in place: element " << bad;
    }
  }
}

std::string divide_name(const testing::TestParamInfo<DivideCase>& info) {
  return std::string(isa_name(info.param.isa)) + "_" + ringreduce::dtype_name(info.param.type);
}

INSTANTIATE_TEST_SUITE_P(AllKernels, DivideTest, testing::ValuesIn(divide_cases()), divide_name);

// ---- Hand-picked cases, on every supported variant ----------------------------------------------

std::vector<ri::Isa> supported_isas() {
  std::vector<ri::Isa> out;
  for (ri::Isa isa : kAllIsas) {
    if (ri::cpu_supports(isa)) out.push_back(isa);
  }
  return out;
}

// Runs one combine of 2-element-wide inputs on every supported variant. The values are repeated
// out to 37 elements so that both the vector body and the scalar tail see them.
template <class T>
void expect_combine(DataType t, ReduceOp op, T a, T b, T want) {
  constexpr size_t n = 37;
  std::vector<T> va(n, a), vb(n, b), out(n);
  for (ri::Isa isa : supported_isas()) {
    ri::table_for(isa).combine[static_cast<int>(t)][static_cast<int>(op)](out.data(), va.data(),
                                                                          vb.data(), n);
    for (size_t i = 0; i < n; ++i) {
      ASSERT_EQ(out[i], want) << isa_name(isa) << " " << ringreduce::dtype_name(t) << " "
                              << ringreduce::op_name(op) << " element " << i;
    }
  }
}

TEST(ReduceValues, IntegersWrapAround) {
  expect_combine<int8_t>(DataType::i8, ReduceOp::sum, 127, 1, -128);
  expect_combine<int8_t>(DataType::i8, ReduceOp::sum, -128, -1, 127);
  expect_combine<int8_t>(DataType::i8, ReduceOp::prod, -128, -1, -128);
  expect_combine<int8_t>(DataType::i8, ReduceOp::prod, 16, 16, 0);
  expect_combine<uint8_t>(DataType::u8, ReduceOp::sum, 255, 1, 0);
  expect_combine<uint8_t>(DataType::u8, ReduceOp::prod, 16, 17, 16);  // 272 mod 256
  expect_combine<int32_t>(DataType::i32, ReduceOp::sum, INT32_MAX, 1, INT32_MIN);
  expect_combine<int32_t>(DataType::i32, ReduceOp::avg, INT32_MIN, -1, INT32_MAX);
  expect_combine<int32_t>(DataType::i32, ReduceOp::prod, 65536, 65536, 0);
  expect_combine<int32_t>(DataType::i32, ReduceOp::prod, INT32_MIN, -1, INT32_MIN);
  expect_combine<uint32_t>(DataType::u32, ReduceOp::sum, UINT32_MAX, 2, 1);
  expect_combine<int64_t>(DataType::i64, ReduceOp::sum, INT64_MAX, 1, INT64_MIN);
  expect_combine<int64_t>(DataType::i64, ReduceOp::prod, INT64_MIN, -1, INT64_MIN);
  expect_combine<uint64_t>(DataType::u64, ReduceOp::sum, UINT64_MAX, 1, 0);
  expect_combine<uint64_t>(DataType::u64, ReduceOp::prod, uint64_t{1} << 32, uint64_t{1} << 32, 0);
  // Signed comparisons stay signed.
  expect_combine<int8_t>(DataType::i8, ReduceOp::min, -1, 1, -1);
  expect_combine<int64_t>(DataType::i64, ReduceOp::max, -1, INT64_MIN, -1);
  expect_combine<uint32_t>(DataType::u32, ReduceOp::max, UINT32_MAX, 1, UINT32_MAX);
}

TEST(ReduceValues, BoolIsTruthValuedAndInt16Wraps) {
  // Any non-zero byte is true; results are 0 or 1.
  expect_combine<uint8_t>(DataType::boolean, ReduceOp::sum, 2, 0, 1);
  expect_combine<uint8_t>(DataType::boolean, ReduceOp::prod, 2, 1, 1);
  expect_combine<uint8_t>(DataType::boolean, ReduceOp::band, 2, 1, 1);
  expect_combine<uint8_t>(DataType::boolean, ReduceOp::bxor, 2, 1, 0);
  expect_combine<uint8_t>(DataType::boolean, ReduceOp::min, 1, 0, 0);
  expect_combine<uint8_t>(DataType::boolean, ReduceOp::max, 0, 0, 0);
  // 16-bit products do not overflow into undefined behaviour: they wrap.
  expect_combine<int16_t>(DataType::i16, ReduceOp::prod, INT16_MIN, -1, INT16_MIN);
  expect_combine<int16_t>(DataType::i16, ReduceOp::prod, -1, -1, 1);
  expect_combine<int16_t>(DataType::i16, ReduceOp::prod, 256, 256, 0);
  expect_combine<int16_t>(DataType::i16, ReduceOp::sum, INT16_MAX, 1, INT16_MIN);
  expect_combine<int16_t>(DataType::i16, ReduceOp::bxor, 0x0F0F, 0x00FF, 0x0FF0);
  expect_combine<uint64_t>(DataType::u64, ReduceOp::band, ~uint64_t{0}, 0x1234, 0x1234);
}

TEST(ReduceValues, HalfRoundsOnceToNearestEven) {
  const auto h = [](float f) { return ref_float_to_half(f); };
  // 1 + 2^-11 lies halfway between 1 and 1 + 2^-10: ties go to the even mantissa, 1.
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(1.0f), h(0x1p-11f), h(1.0f));
  // (1 + 2^-10) + 2^-11 is halfway between odd 1 + 2^-10 and even 1 + 2^-9: up.
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(1.0f + 0x1p-10f), h(0x1p-11f),
                           h(1.0f + 0x1p-9f));
  // Ties where the half ulp is 2: 2049 goes down to even 2048, 2051 up to even 2052.
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(2048.0f), h(1.0f), h(2048.0f));
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(2050.0f), h(1.0f), h(2052.0f));
  // Overflow goes to infinity (max finite 65504).
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(60000.0f), h(60000.0f), 0x7C00);
  expect_combine<uint16_t>(DataType::f16, ReduceOp::prod, h(-300.0f), h(300.0f), 0xFC00);
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(65504.0f), h(8.0f), h(65504.0f));
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, h(65504.0f), h(16.0f), 0x7C00);
  // Subnormals: 2^-24 is the smallest; 2^-24 + 2^-24 = 2 * 2^-24; 2^-24 * 0.5 ties to 0.
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, 0x0001, 0x0001, 0x0002);
  expect_combine<uint16_t>(DataType::f16, ReduceOp::prod, 0x0001, h(0.5f), 0x0000);
  expect_combine<uint16_t>(DataType::f16, ReduceOp::prod, 0x0003, h(0.5f), 0x0002);  // 1.5 -> 2
  expect_combine<uint16_t>(DataType::f16, ReduceOp::sum, 0x03FF, 0x0001, 0x0400);    // to normal
  expect_combine<uint16_t>(DataType::f16, ReduceOp::max, 0x8001, 0x0001, 0x0001);
}

TEST(ReduceValues, Bf16RoundsOnceToNearestEven) {
  const auto b = [](float f) { return ref_float_to_bf16(f); };
  expect_combine<uint16_t>(DataType::bf16, ReduceOp::sum, b(1.0f), b(0x1p-8f), b(1.0f));
  expect_combine<uint16_t>(DataType::bf16, ReduceOp::sum, b(1.0f + 0x1p-7f), b(0x1p-8f),
                           b(1.0f + 0x1p-6f));
  expect_combine<uint16_t>(DataType::bf16, ReduceOp::sum, 0x7F7F, 0x7F7F, 0x7F80);  // to inf
  expect_combine<uint16_t>(DataType::bf16, ReduceOp::sum, 0x0001, 0x0001, 0x0002);  // subnormal
  expect_combine<uint16_t>(DataType::bf16, ReduceOp::prod, 0x0001, b(0.5f), 0x0000);
  expect_combine<uint16_t>(DataType::bf16, ReduceOp::prod, 0x0003, b(0.5f), 0x0002);
}

TEST(ReduceValues, FloatMinMaxFollowCompareAndSelect) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // The documented form a < b ? a : b: a NaN in b propagates, a NaN in a does not.
  for (ri::Isa isa : supported_isas()) {
    for (ReduceOp op : {ReduceOp::min, ReduceOp::max}) {
      const auto fn =
          ri::table_for(isa).combine[static_cast<int>(DataType::f32)][static_cast<int>(op)];
      std::vector<float> a(37, nan), b(37, 1.0f), out(37);
      fn(out.data(), a.data(), b.data(), 37);
      for (float v : out) EXPECT_EQ(v, 1.0f) << isa_name(isa);
      fn(out.data(), b.data(), a.data(), 37);
      for (float v : out) EXPECT_TRUE(std::isnan(v)) << isa_name(isa);
      // Equal operands (here -0 and +0) give b.
      std::vector<float> neg(37, -0.0f), pos(37, 0.0f);
      fn(out.data(), neg.data(), pos.data(), 37);
      for (float v : out) EXPECT_FALSE(std::signbit(v)) << isa_name(isa);
      fn(out.data(), pos.data(), neg.data(), 37);
      for (float v : out) EXPECT_TRUE(std::signbit(v)) << isa_name(isa);
    }
  }
}

TEST(ReduceValues, DivideTruncatesTowardZero) {
  for (ri::Isa isa : supported_isas()) {
    const ri::KernelTable& k = ri::table_for(isa);
    std::vector<int32_t> i32 = {-7, 7, -1, INT32_MIN, INT32_MAX, -6, 0};
    std::vector<int32_t> i32_want = {-3, 3, 0, INT32_MIN / 2, INT32_MAX / 2, -3, 0};
    k.divide[static_cast<int>(DataType::i32)](i32.data(), i32.data(), i32.size(), 2);
    EXPECT_EQ(i32, i32_want) << isa_name(isa);

    std::vector<int8_t> i8 = {-128, -127, 127, -3, 3};
    std::vector<int8_t> i8_want = {-42, -42, 42, -1, 1};
    k.divide[static_cast<int>(DataType::i8)](i8.data(), i8.data(), i8.size(), 3);
    EXPECT_EQ(i8, i8_want) << isa_name(isa);

    std::vector<int64_t> i64 = {-9, 9, INT64_MIN, INT64_MAX};
    std::vector<int64_t> i64_want = {-2, 2, INT64_MIN / 4, INT64_MAX / 4};
    k.divide[static_cast<int>(DataType::i64)](i64.data(), i64.data(), i64.size(), 4);
    EXPECT_EQ(i64, i64_want) << isa_name(isa);

    std::vector<int64_t> huge = {INT64_MIN, INT64_MIN + 1, -1, INT64_MAX};
    std::vector<int64_t> huge_want = {-1, 0, 0, 0};
    k.divide[static_cast<int>(DataType::i64)](huge.data(), huge.data(), huge.size(),
                                              uint64_t{1} << 63);
    EXPECT_EQ(huge, huge_want) << isa_name(isa);

    std::vector<uint32_t> u32 = {UINT32_MAX, 5};
    std::vector<uint32_t> u32_want = {UINT32_MAX / 3, 1};
    k.divide[static_cast<int>(DataType::u32)](u32.data(), u32.data(), u32.size(), 3);
    EXPECT_EQ(u32, u32_want) << isa_name(isa);

    std::vector<float> f32 = {1.0f, -3.0f};
    std::vector<float> f32_want = {1.0f / 3.0f, -1.0f};
    k.divide[static_cast<int>(DataType::f32)](f32.data(), f32.data(), f32.size(), 3);
    EXPECT_EQ(f32, f32_want) << isa_name(isa);
  }
}

// ---- Conversions --------------------------------------------------------------------------------

__attribute__((target("f16c"))) float hw_half_to_float(uint16_t h) {
  return _cvtsh_ss(h);
}
__attribute__((target("f16c"))) uint16_t hw_float_to_half(float f) {
  return _cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT);
}
bool have_f16c() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("f16c");
}

TEST(HalfConversion, AllBitPatternsWidenExactlyAndRoundTrip) {
  const bool f16c = have_f16c();
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto h = static_cast<uint16_t>(i);
    const float f = rr::half_to_float(h);
    if (half_is_nan(h)) {
      ASSERT_TRUE(std::isnan(f)) << std::hex << i;
      // NaN stays NaN, keeps its sign and payload, and comes back quiet.
      ASSERT_EQ(rr::float_to_half(f), h | 0x0200) << std::hex << i;
    } else {
      ASSERT_EQ(bits_as<uint32_t>(f), bits_as<uint32_t>(ref_half_to_float(h))) << std::hex << i;
      ASSERT_EQ(rr::float_to_half(f), h) << std::hex << i;
    }
    if (f16c) {
      // The F16C variants convert with the hardware: it must agree bit for bit, NaNs included.
      ASSERT_EQ(bits_as<uint32_t>(f), bits_as<uint32_t>(hw_half_to_float(h))) << std::hex << i;
      ASSERT_EQ(rr::float_to_half(f), hw_float_to_half(f)) << std::hex << i;
    }
  }
}

// Floats that probe float -> half rounding: every midpoint between adjacent halves (the ties),
// one float ulp either side of each, the overflow threshold, and random bit patterns.
std::vector<float> half_probe_floats() {
  std::vector<float> out;
  for (uint32_t h = 0; h < 0x7C00; ++h) {
    const double lo = ref_half_to_float(static_cast<uint16_t>(h));
    const double hi = h + 1 == 0x7C00 ? 65536.0 : ref_half_to_float(static_cast<uint16_t>(h + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);  // exact: needs 12 significant bits
    for (float f : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY)}) {
      out.push_back(f);
      out.push_back(-f);
    }
  }
  for (float f : {65504.0f, 65519.996f, 65520.0f, 1e10f, FLT_MAX, INFINITY, 0x1p-25f, 0x1p-26f,
                  0x1.8p-25f, FLT_MIN, FLT_TRUE_MIN}) {
    out.push_back(f);
    out.push_back(-f);
  }
  std::mt19937 rng(5);
  for (int i = 0; i < 1 << 20; ++i) out.push_back(bits_as<float>(static_cast<uint32_t>(rng())));
  return out;
}

TEST(HalfConversion, FloatToHalfRoundsToNearestEven) {
  const bool f16c = have_f16c();
  for (float f : half_probe_floats()) {
    const uint16_t got = rr::float_to_half(f);
    if (std::isnan(f)) {
      ASSERT_TRUE(half_is_nan(got)) << f;
    } else {
      ASSERT_EQ(got, ref_float_to_half(f)) << std::hexfloat << f;
    }
    if (f16c) {
      ASSERT_EQ(got, hw_float_to_half(f)) << std::hexfloat << f;
    }
  }
  EXPECT_EQ(rr::float_to_half(65520.0f), 0x7C00);  // rounds up to 65536: overflow
  EXPECT_EQ(rr::float_to_half(65519.996f), 0x7BFF);
  EXPECT_EQ(rr::float_to_half(-1e10f), 0xFC00);
  EXPECT_EQ(rr::float_to_half(0x1p-25f), 0x0000);    // tie between 0 and 2^-24
  EXPECT_EQ(rr::float_to_half(0x1.8p-24f), 0x0002);  // tie between 1 and 2 ulps: even
  EXPECT_EQ(rr::float_to_half(-0.0f), 0x8000);
  EXPECT_EQ(rr::float_to_half(std::numeric_limits<float>::quiet_NaN()) & 0x7E00, 0x7E00);
  EXPECT_EQ(rr::float_to_half(std::numeric_limits<float>::signaling_NaN()) & 0x7E00, 0x7E00);
}

TEST(Bf16Conversion, RoundsToNearestEven) {
  for (uint32_t i = 0; i < 65536; ++i) {
    const auto b = static_cast<uint16_t>(i);
    const float f = rr::bf16_to_float(b);
    ASSERT_EQ(bits_as<uint32_t>(f), i << 16);
    if (bf16_is_nan(b)) {
      ASSERT_EQ(rr::float_to_bf16(f), b | 0x0040) << std::hex << i;
    } else {
      ASSERT_EQ(rr::float_to_bf16(f), b) << std::hex << i;
    }
  }
  std::mt19937 rng(6);
  for (int i = 0; i < 1 << 20; ++i) {
    const uint32_t u = rng();
    // Every third probe is a tie or a neighbour of one.
    const uint32_t bits = i % 3 == 0 ? (u & 0xFFFF0000u) | (0x8000u + (u & 3) - 1) : u;
    const float f = bits_as<float>(bits);
    if (std::isnan(f)) {
      ASSERT_TRUE(bf16_is_nan(rr::float_to_bf16(f))) << std::hex << bits;
    } else {
      ASSERT_EQ(rr::float_to_bf16(f), ref_float_to_bf16(f)) << std::hex << bits;
    }
  }
  EXPECT_EQ(rr::float_to_bf16(FLT_MAX), 0x7F80);
  EXPECT_EQ(rr::float_to_bf16(bits_as<float>(0x3F808000u)), 0x3F80);  // tie, even below
  EXPECT_EQ(rr::float_to_bf16(bits_as<float>(0x3F818000u)), 0x3F82);  // tie, even above
  EXPECT_EQ(rr::float_to_bf16(bits_as<float>(0x00018000u)), 0x0002);  // subnormal tie
  // A NaN whose payload sits only in the dropped bits must not round into infinity.
  EXPECT_TRUE(bf16_is_nan(rr::float_to_bf16(bits_as<float>(0x7F800001u))));
  EXPECT_TRUE(bf16_is_nan(rr::float_to_bf16(bits_as<float>(0xFF800001u))));
}

// ---- The public entry points --------------------------------------------------------------------

TEST(ReduceDispatch, PicksTheWidestSupportedVariant) {
  const std::string chosen = rr::isa();
  const char* want = ri::cpu_supports(ri::Isa::avx512) ? "avx512"
                     : ri::cpu_supports(ri::Isa::avx2) ? "avx2"
                                                       : "generic";
  EXPECT_EQ(chosen, want);
  EXPECT_EQ(&ri::active_table(),
            &ri::table_for(ri::cpu_supports(ri::Isa::avx512) ? ri::Isa::avx512
                           : ri::cpu_supports(ri::Isa::avx2) ? ri::Isa::avx2
                                                             : ri::Isa::generic));
}

TEST(ReduceDispatch, CombineAndDivideThroughThePublicApi) {
  std::vector<float> a = {1, 2, 3}, b = {4, 5, 6}, out(3);
  rr::combine(out.data(), a.data(), b.data(), 3, DataType::f32, ReduceOp::avg);
  EXPECT_EQ(out, (std::vector<float>{5, 7, 9}));
  rr::divide(out.data(), out.data(), 3, DataType::f32, 2);
  EXPECT_EQ(out, (std::vector<float>{2.5f, 3.5f, 4.5f}));
  rr::combine(nullptr, nullptr, nullptr, 0, DataType::f64, ReduceOp::sum);  // count 0: no access
  EXPECT_THROW(rr::divide(out.data(), out.data(), 3, DataType::f32, 0),
               ringreduce::InvalidArgument);
  EXPECT_THROW(
      rr::combine(out.data(), a.data(), b.data(), 3, static_cast<DataType>(42), ReduceOp::sum),
      ringreduce::InvalidArgument);
}

TEST(ReduceDispatch, LargeCombineTakesTheStreamingPathAndAgrees) {
  // Just over the threshold, out of place: combine() streams, and every sum is a[i] + b[i] as
  // the cached kernel gives it; then in place (cached). The threshold is the last-level cache
  // (508 MiB on this VM): three buffers, written once each before they are read, are what the
  // test costs (four zeroed 4 KiB-page vectors took 7.5 s alone, 22 s in ctest; now 3.4 s).
  const size_t n = ri::stream_threshold_bytes() / sizeof(float) + 17;
  // Huge pages where the kernel gives them (THP "madvise"): a fault per 2 MiB, not per 4 KiB,
  // which was half the test's time.
  struct Free {
    void operator()(float* p) const { std::free(p); }
  };
  auto buffer = [n] {
    constexpr size_t kHuge = size_t{2} << 20;
    const size_t bytes = (n * sizeof(float) + kHuge - 1) / kHuge * kHuge;
    void* p = std::aligned_alloc(kHuge, bytes);
    if (p == nullptr) throw std::bad_alloc();
    madvise(p, bytes, MADV_HUGEPAGE);  // advice: ignored where THP is off
    return std::unique_ptr<float[], Free>(static_cast<float*>(p));
  };
  auto a = buffer(), b = buffer(), got = buffer();
  for (size_t i = 0; i < n; ++i) {
    a[i] = static_cast<float>(i % 1000) * 0.25f;
    b[i] = static_cast<float>(i % 777) - 300.0f;
  }
  rr::combine(got.get(), a.get(), b.get(), n, DataType::f32, ReduceOp::sum);
  size_t wrong = 0;
  for (size_t i = 0; i < n; ++i) wrong += got[i] != a[i] + b[i];
  EXPECT_EQ(wrong, 0u);
  rr::combine(a.get(), a.get(), b.get(), n, DataType::f32, ReduceOp::sum);  // in place
  EXPECT_EQ(std::memcmp(a.get(), got.get(), n * sizeof(float)), 0);
}

}  // namespace
