// The CUDA kernels (src/reduce/cuda) against the CPU kernels: the same arithmetic
// (elementwise.inc), so every dtype x op must give the CPU's bits, NaNs aside (a GPU's
// arithmetic returns the canonical NaN where x86 keeps the first operand's payload). Without a
// device, or in a build without CUDA, the device tests skip saying why.

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "reduce/cuda/reduce_cuda.h"
#include "reduce/reduce.h"
#include "reduce_reference.h"
#include "ringreduce/error.h"
#include "ringreduce/types.h"

namespace {

namespace cuda = ringreduce::reduce::cuda;
namespace reduce = ringreduce::reduce;
using namespace rr_test;  // reduce_reference.h: kAllTypes, kAllOps, random_elements

#define RR_NEED_DEVICE()                                                                           \
  do {                                                                                             \
    if (!cuda::available()) GTEST_SKIP() << "needs a CUDA device: " << cuda::unavailable_reason(); \
  } while (0)

bool is_nan(const unsigned char* p, DataType t) {
  uint64_t v = 0;
  std::memcpy(&v, p, ringreduce::dtype_size(t));  // little-endian: the low bytes
  switch (t) {
    case DataType::f16:
      return half_is_nan(static_cast<uint16_t>(v));
    case DataType::bf16:
      return bf16_is_nan(static_cast<uint16_t>(v));
    case DataType::f32:
      return std::isnan(bits_as<float>(static_cast<uint32_t>(v)));
    case DataType::f64:
      return std::isnan(bits_as<double>(v));
    default:
      return false;
  }
}

// The first element where got and want differ (both NaN counts as equal), or n.
size_t first_difference(const std::vector<unsigned char>& got,
                        const std::vector<unsigned char>& want, size_t n, DataType t) {
  const size_t s = ringreduce::dtype_size(t);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char* g = got.data() + i * s;
    const unsigned char* w = want.data() + i * s;
    if (std::memcmp(g, w, s) == 0) continue;
    if (is_nan(g, t) && is_nan(w, t)) continue;
    return i;
  }
  return n;
}

std::string what(DataType t, ReduceOp op, size_t n, size_t offset) {
  return std::string(ringreduce::dtype_name(t)) + " " + ringreduce::op_name(op) + " x " +
         std::to_string(n) + " at element offset " + std::to_string(offset);
}

TEST(CudaReduce, SaysWhyWhenThereIsNoDevice) {
  if (cuda::available()) {
    EXPECT_TRUE(cuda::unavailable_reason().empty());
    EXPECT_FALSE(cuda::device_description().empty());
    return;
  }
  const std::string why = cuda::unavailable_reason();
  EXPECT_FALSE(why.empty());
  // Any call that needs a device fails with an error, never a crash.
  float x = 1;
  EXPECT_THROW(cuda::combine(&x, &x, &x, 1, DataType::f32, ReduceOp::sum, nullptr),
               ringreduce::Error);
  EXPECT_THROW(cuda::DeviceBuffer buffer(64), ringreduce::Error);
}

TEST(CudaReduce, RefusesAnOpThatDoesNotApply) {
  RR_NEED_DEVICE();
  cuda::DeviceBuffer b(64);
  EXPECT_THROW(
      cuda::combine(b.data(), b.data(), b.data(), 4, DataType::f32, ReduceOp::band, nullptr),
      ringreduce::InvalidArgument);
  EXPECT_THROW(cuda::scale(b.data(), b.data(), 4, DataType::i32, 2.0, nullptr),
               ringreduce::InvalidArgument);
}

// Every dtype x op, out of place, in place (dst == a) and fused into two outputs, at counts
// around the 16-byte vector width, on aligned and misaligned pointers.
TEST(CudaReduce, EveryDtypeAndOpGivesTheCpuResult) {
  RR_NEED_DEVICE();
  const size_t counts[] = {1, 3, 17, 1000, 65536 + 5};
  for (DataType t : kAllTypes) {
    const size_t s = ringreduce::dtype_size(t);
    for (ReduceOp op : kAllOps) {
      if (!ringreduce::op_applies(op, t)) continue;
      std::mt19937_64 rng(1000 + static_cast<int>(t) * 16 + static_cast<int>(op));
      for (size_t n : counts) {
        for (size_t offset : {size_t{0}, size_t{1}}) {
          const auto a = random_elements(t, n, rng), b = random_elements(t, n, rng);
          std::vector<unsigned char> want(n * s + 1);
          reduce::combine(want.data(), a.data(), b.data(), n, t, op);
          const size_t bytes = n * s, off = offset * s;
          cuda::DeviceBuffer da(bytes + 16), db(bytes + 16), d0(bytes + 16), d1(bytes + 16);
          da.upload(a.data(), bytes, off);
          db.upload(b.data(), bytes, off);
          auto at = [&](const cuda::DeviceBuffer& d) { return static_cast<char*>(d.data()) + off; };
          std::vector<unsigned char> got(bytes + 1);

          cuda::combine(at(d0), at(da), at(db), n, t, op, nullptr);
          cuda::synchronize(nullptr);
          d0.download(got.data(), bytes, off);
          size_t i = first_difference(got, want, n, t);
          ASSERT_EQ(i, n) << "out of place, " << what(t, op, n, offset) << ": element " << i;

          cuda::combine2(at(d0), at(d1), at(da), at(db), n, t, op, nullptr);
          cuda::synchronize(nullptr);
          for (const cuda::DeviceBuffer* d : {&d0, &d1}) {
            d->download(got.data(), bytes, off);
            i = first_difference(got, want, n, t);
            ASSERT_EQ(i, n) << "combine2, " << what(t, op, n, offset) << ": element " << i;
          }

          cuda::combine(at(da), at(da), at(db), n, t, op, nullptr);  // in place
          cuda::synchronize(nullptr);
          da.download(got.data(), bytes, off);
          i = first_difference(got, want, n, t);
          ASSERT_EQ(i, n) << "in place, " << what(t, op, n, offset) << ": element " << i;
        }
      }
    }
  }
}

TEST(CudaReduce, DivideAndScaleGiveTheCpuResult) {
  RR_NEED_DEVICE();
  for (DataType t : kAllTypes) {
    if (t == DataType::boolean) continue;
    const size_t s = ringreduce::dtype_size(t);
    std::mt19937_64 rng(77 + static_cast<int>(t));
    for (size_t n : {size_t{1}, size_t{9}, size_t{4099}}) {
      const auto x = random_elements(t, n, rng);
      const size_t bytes = n * s;
      cuda::DeviceBuffer dx(bytes), dy(bytes);
      std::vector<unsigned char> want(bytes + 1), got(bytes + 1);
      for (uint64_t divisor : {uint64_t{1}, uint64_t{3}, uint64_t{7}, uint64_t{1} << 63}) {
        reduce::divide(want.data(), x.data(), n, t, divisor);
        dx.upload(x.data(), bytes);
        cuda::divide(dy.data(), dx.data(), n, t, divisor, nullptr);
        cuda::synchronize(nullptr);
        dy.download(got.data(), bytes);
        size_t i = first_difference(got, want, n, t);
        ASSERT_EQ(i, n) << "divide by " << divisor << ", " << ringreduce::dtype_name(t) << " x "
                        << n << ": element " << i;
      }
      if (!ringreduce::is_float(t)) continue;
      for (double factor : {0.5, 1.0 / 3.0, -7.25}) {
        reduce::scale(want.data(), x.data(), n, t, factor);
        dx.upload(x.data(), bytes);
        cuda::scale(dx.data(), dx.data(), n, t, factor, nullptr);  // in place
        cuda::synchronize(nullptr);
        dx.download(got.data(), bytes);
        size_t i = first_difference(got, want, n, t);
        ASSERT_EQ(i, n) << "scale by " << factor << ", " << ringreduce::dtype_name(t) << " x " << n
                        << ": element " << i;
      }
    }
  }
}

}  // namespace
