// The AVX-512 variant (F, BW, VL, DQ, plus F16C): compiled with those flags (CMakeLists.txt) and
// only called after reduce.cc has checked the CPU and OS support them.
//
// AVX-512 BF16 (vcvtneps2bf16) is deliberately not used for f32 -> bf16: it flushes subnormal
// inputs and outputs to zero, so results would differ from the other variants and from the
// scalar reference. The integer-shift rounding vectorises well enough. AVX-512 FP16 needs
// Sapphire Rapids and a newer compiler for arithmetic; F16C conversions suffice here.
#define RR_REDUCE_ISA avx512
#define RR_REDUCE_TABLE kAvx512Table
#include "reduce/kernels.inc"
