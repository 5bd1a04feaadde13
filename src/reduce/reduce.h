// Element-wise reduction kernels for every DataType x ReduceOp. Written as plain loops the
// compiler vectorises, compiled once per ISA (generic x86-64, AVX2, AVX-512) and dispatched at
// run time from cpuid, so one binary runs on any x86-64 and uses the widest units it finds.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ringreduce/types.h"

namespace ringreduce::reduce {

// dst[i] = a[i] (op) b[i] for i < count. dst may alias a or b (in place).
// ReduceOp::avg combines as sum: the algorithm divides once at the end (see divide()); so does
// premul_sum (its inputs were scaled first, see scale()). InvalidArgument for an op that does not
// apply to the type (op_applies).
// f16 and bf16 are widened to f32, combined, and rounded to nearest-even once.
void combine(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op);

// Copies bytes (no overlap). With `stream`, the stores bypass the cache: for a destination that
// will not be read again soon, it saves reading every line before writing it. Without, `rep
// movsb` from 2 KiB where the CPU has ERMS, whatever the C library's memcpy would pick.
void copy(void* dst, const void* src, size_t bytes, bool stream);
// The size from which a written buffer no longer stays in cache: the largest cache's size (the
// kernels' own switch to streaming stores uses it too).
size_t stream_output_threshold();

// dst[i] = src[i] / divisor; integers truncate toward zero. dst may alias src.
void divide(void* dst, const void* src, size_t count, DataType type, uint64_t divisor);

// dst[i] = src[i] * factor, for floating-point types (premul_sum); f16 and bf16 multiply in f32.
// dst may alias src.
void scale(void* dst, const void* src, size_t count, DataType type, double factor);

// The instruction set the dispatcher chose: "avx512", "avx2" or "generic".
const char* isa();

// Scalar conversions, also used by tests and the benchmark's checker.
float half_to_float(uint16_t h);
uint16_t float_to_half(float f);  // round to nearest even; overflow to inf; NaN stays NaN
float bf16_to_float(uint16_t b);
uint16_t float_to_bf16(float f);  // round to nearest even

}  // namespace ringreduce::reduce
