// Data types and reduction operators shared by every layer and by the public API.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ringreduce {

enum class DataType : uint8_t { f16, bf16, f32, f64, i8, u8, i32, u32, i64, u64 };
inline constexpr int kNumDataTypes = 10;

// avg = sum, then divide by the world size once at the end; integers truncate toward zero.
enum class ReduceOp : uint8_t { sum, prod, min, max, avg };
inline constexpr int kNumReduceOps = 5;

// IEEE 754 binary16 and bfloat16, stored as their bit patterns. Typed spans of these deduce
// DataType::f16 / DataType::bf16; arithmetic on them is the reduce layer's business.
struct half {
  uint16_t bits;
};
struct bfloat16 {
  uint16_t bits;
};

size_t dtype_size(DataType t);
const char* dtype_name(DataType t);  // "float", "half", "bfloat16", ... (nccl-tests spelling)
const char* op_name(ReduceOp op);    // "sum", "prod", "min", "max", "avg"
bool is_float(DataType t);

// Parse the spellings nccl-tests accepts ("float", "f32", "half", "bf16", "int32", ...).
// Return false if the name is unknown.
bool parse_dtype(const std::string& name, DataType* out);
bool parse_op(const std::string& name, ReduceOp* out);

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
#undef RINGREDUCE_DTYPE_OF

}  // namespace ringreduce
