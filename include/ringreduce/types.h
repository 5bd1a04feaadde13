// Data types and reduction operators shared by every layer and by the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ringreduce/export.h"

namespace ringreduce {

// Values are part of the C ABI (ringreduce.h): never renumber one, only add. boolean is one byte
// holding 0 or 1 (C++ bool, torch.bool).
enum class DataType : uint8_t { f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64, i16, boolean };
inline constexpr int kNumDataTypes = 12;

// avg = sum, then divide by the world size once at the end; integers truncate toward zero.
// band, bor, bxor: bitwise, on integers and bool. premul_sum: each rank's input multiplied by a
// scalar of its own (CallOptions::premul_factor) before the sum, for floating-point types (NCCL's
// ncclRedOpCreatePreMulSum, torch's PREMUL_SUM). On bool, sum and max are or, prod and min are
// and (as torch computes them).
enum class ReduceOp : uint8_t { sum, prod, min, max, avg, band, bor, bxor, premul_sum };
inline constexpr int kNumReduceOps = 9;

// IEEE 754 binary16 and bfloat16, stored as their bit patterns. Typed spans of these deduce
// DataType::f16 / DataType::bf16; arithmetic on them is the reduce layer's business.
struct half {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};

RINGREDUCE_API size_t dtype_size(DataType t);
RINGREDUCE_API const char* dtype_name(
    DataType t);  // "float", "half", "bfloat16", ... (nccl-tests spelling)
RINGREDUCE_API const char* op_name(ReduceOp op);  // "sum", "prod", "min", "max", "avg", "band", ...
RINGREDUCE_API bool is_float(DataType t);
// Whether `op` reduces values of type `t` (bitwise ops: integers and bool; premul_sum: floating
// point; avg: all but bool; the rest: every type).
RINGREDUCE_API bool op_applies(ReduceOp op, DataType t);

// Parse the spellings nccl-tests accepts ("float", "f32", "half", "bf16", "int32", ...).
// Return false if the name is unknown.
RINGREDUCE_API bool parse_dtype(const std::string& name, DataType* out);
RINGREDUCE_API bool parse_op(const std::string& name, ReduceOp* out);

// What a float allreduce, reduce_scatter or allgather puts on the wire (CallOptions::wire,
// RINGREDUCE_WIRE; docs/WIRE.md). none: the data as it is. The others round each rank's float32
// input once to a narrow format, send it straight to the rank that owns its block, which sums in
// float32, and round that result once for the allgather: whatever the number of ranks, an
// element's error is at most one rounding of each input plus one of the result. bf16: 8-bit
// exponent, 7-bit mantissa (half the bytes). f16: 5-bit exponent and 10-bit mantissa, with a
// power-of-two scale per block of 256 elements so that nothing overflows (half the bytes, 8x
// finer than bf16). fp8e4m3 / fp8e5m2: 8 bits, scaled per block the same way (a quarter of the
// bytes). automatic: bf16 where the tuner predicts it is faster than float32, else none.
// Values are part of the C ABI.
enum class Wire : uint8_t { none, bf16, f16, fp8e4m3, fp8e5m2, automatic };
inline constexpr int kNumWires = 6;
RINGREDUCE_API const char* wire_name(
    Wire w);  // "none", "bf16", "f16", "fp8e4m3", "fp8e5m2", "auto"
// Accepts those names (and "off", "f32", "fp8" for fp8e4m3); false if unknown.
RINGREDUCE_API bool parse_wire(const std::string& name, Wire* out);
// dst = src as coding it in format w (not none or automatic) and decoding it gives back, blocks
// of the scaled formats counted from src (dst may be src): what a coded collective does to a
// block of a rank's input, for error feedback (ringreduce.torch.hooks), tests and checkers.
RINGREDUCE_API void wire_round(Wire w, const float* src, float* dst, size_t count);

template <typename T>
struct DataTypeOf;
#define RINGREDUCE_DTYPE_OF(T, D)                  \
  template <>                                      \
  struct DataTypeOf<T> {                           \
    static constexpr DataType value = DataType::D; \
  }
RINGREDUCE_DTYPE_OF(half, f16);
RINGREDUCE_DTYPE_OF(bfloat16, bf16);
RINGREDUCE_DTYPE_OF(float, f32);
RINGREDUCE_DTYPE_OF(double, f64);
RINGREDUCE_DTYPE_OF(int8_t, i8);
RINGREDUCE_DTYPE_OF(uint8_t, u8);
RINGREDUCE_DTYPE_OF(int32_t, i32);
RINGREDUCE_DTYPE_OF(uint32_t, u32);
RINGREDUCE_DTYPE_OF(int64_t, i64);
RINGREDUCE_DTYPE_OF(uint64_t, u64);
RINGREDUCE_DTYPE_OF(int16_t, i16);
RINGREDUCE_DTYPE_OF(bool, boolean);
#undef RINGREDUCE_DTYPE_OF

}  // namespace ringreduce
