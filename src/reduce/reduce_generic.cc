// The baseline variant: x86-64 as the compiler targets by default (SSE2), no extra flags beyond
// the kernel optimisation flags in CMakeLists.txt. Also home of the public scalar conversions,
// so that they never depend on an optional instruction set.
#define RR_REDUCE_ISA generic
#define RR_REDUCE_TABLE kGenericTable
#include "reduce/kernels.inc"

#include "reduce/reduce.h"

namespace ringreduce::reduce {

float half_to_float(uint16_t h) {
  return generic::soft_half_to_float(h);
}
uint16_t float_to_half(float f) {
  return generic::soft_float_to_half(f);
}
float bf16_to_float(uint16_t b) {
  return generic::soft_bf16_to_float(b);
}
uint16_t float_to_bf16(float f) {
  return generic::soft_float_to_bf16(f);
}

}  // namespace ringreduce::reduce
