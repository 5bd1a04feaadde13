// The AVX2 variant (with FMA and F16C, which every AVX2 CPU has): compiled with -mavx2 -mfma
// -mf16c (CMakeLists.txt) and only called after reduce.cc has checked the CPU supports them.
#define RR_REDUCE_ISA avx2
#define RR_REDUCE_TABLE kAvx2Table
#include "reduce/kernels.inc"
