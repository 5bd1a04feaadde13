#include "reduce/wire.h"

#include <cmath>
#include <cstring>
#include <string>

#include "reduce/reduce_isa.h"
#include "ringreduce/error.h"

namespace ringreduce::reduce {
namespace {

// unit_elems, unit_bytes, code_bytes, scaled, roundoff 2^-(m+1), half the smallest subnormal
// step 2^(1-bias-m) / 2.
constexpr WireLayout kBf16{1, 2, 2, false, 0x1p-8, 0x1p-134};
constexpr WireLayout kF16{kWireBlock, 4 + 2 * kWireBlock, 2, true, 0x1p-11, 0x1p-25};
constexpr WireLayout kE4M3{kWireBlock, 4 + kWireBlock, 1, true, 0x1p-4, 0x1p-10};
constexpr WireLayout kE5M2{kWireBlock, 4 + kWireBlock, 1, true, 0x1p-3, 0x1p-17};

// The largest finite value's exponent and mantissa bits, and the lowest exponent, of each
// scaled format: the same rule as block_exponent() in wire_kernels.inc.
struct ScaleRule {
  int max_exp;
  uint32_t max_bits;
  int min_k;
};
ScaleRule scale_rule(Wire w) {
  switch (w) {
    case Wire::f16:
      return {15, 0x477FE000u, -125};
    case Wire::fp8e4m3:
      return {7, 0x43700000u, -126};
    case Wire::fp8e5m2:
      return {15, 0x47600000u, -126};
    default:
      return {0, 0, 0};
  }
}

const internal::KernelTable& table() {
  return internal::active_table();
}

}  // namespace

const WireLayout& wire_layout(Wire w) {
  switch (w) {
    case Wire::bf16:
      return kBf16;
    case Wire::f16:
      return kF16;
    case Wire::fp8e4m3:
      return kE4M3;
    case Wire::fp8e5m2:
      return kE5M2;
    default:
      throw InvalidArgument(std::string("wire format ") + wire_name(w) + " has no layout");
  }
}

size_t wire_bytes(Wire w, size_t count) {
  const WireLayout& l = wire_layout(w);
  if (!l.scaled) return count * l.code_bytes;
  return (count + l.unit_elems - 1) / l.unit_elems * 4 + count * l.code_bytes;
}

size_t wire_elems_fitting(Wire w, size_t bytes) {
  const WireLayout& l = wire_layout(w);
  const size_t units = bytes / l.unit_bytes;
  return (units > 0 ? units : 1) * l.unit_elems;
}

void wire_encode(void* dst, const float* src, size_t count, Wire w) {
  wire_layout(w);  // refuses none and automatic
  if (count > 0) table().wire_encode[static_cast<int>(w)](dst, src, count);
}

void wire_decode(float* dst, const float* local, const void* src, size_t count, Wire w) {
  wire_layout(w);
  if (count > 0) table().wire_decode[static_cast<int>(w)](dst, local, src, count);
}

void wire_round(float* dst, const float* src, size_t count, Wire w) {
  wire_layout(w);
  if (count > 0) table().wire_round[static_cast<int>(w)](dst, src, count);
}

}  // namespace ringreduce::reduce

namespace ringreduce {

void wire_round(Wire w, const float* src, float* dst, size_t count) {
  reduce::wire_round(dst, src, count, w);
}

}  // namespace ringreduce

namespace ringreduce::reduce {

int wire_block_exponent(Wire w, float amax) {
  if (!wire_layout(w).scaled) return 0;
  const ScaleRule r = scale_rule(w);
  uint32_t a;
  std::memcpy(&a, &amax, 4);
  a &= 0x7FFFFFFFu;
  if (a >= 0x7F800000u) a = 0;
  const int e = static_cast<int>(a >> 23) - 127;
  const int k = e - r.max_exp + ((a & 0x7FFFFFu) > (r.max_bits & 0x7FFFFFu) ? 1 : 0);
  return k < r.min_k ? r.min_k : k;
}

double wire_error_bound(Wire w, double x, int k) {
  const WireLayout& l = wire_layout(w);
  return l.roundoff * std::fabs(x) + std::ldexp(l.half_step, k);
}

}  // namespace ringreduce::reduce
