#include <string>

#include "ringreduce/types.h"

namespace ringreduce {

size_t dtype_size(DataType t) {
  switch (t) {
    case DataType::f16:
    case DataType::bf16:
    case DataType::i16:
      return 2;
    case DataType::f32:
    case DataType::i32:
    case DataType::u32:
      return 4;
    case DataType::f64:
    case DataType::i64:
    case DataType::u64:
      return 8;
    case DataType::i8:
    case DataType::u8:
    case DataType::boolean:
      return 1;
  }
  return 0;
}

const char* dtype_name(DataType t) {
  switch (t) {
    case DataType::f16:
      return "half";
    case DataType::bf16:
      return "bfloat16";
    case DataType::f32:
      return "float";
    case DataType::f64:
      return "double";
    case DataType::i8:
      return "int8";
    case DataType::u8:
      return "uint8";
    case DataType::i32:
      return "int32";
    case DataType::u32:
      return "uint32";
    case DataType::i64:
      return "int64";
    case DataType::u64:
      return "uint64";
    case DataType::i16:
      return "int16";
    case DataType::boolean:
      return "bool";
  }
  return "?";
}

const char* op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum:
      return "sum";
    case ReduceOp::prod:
      return "prod";
    case ReduceOp::min:
      return "min";
    case ReduceOp::max:
      return "max";
    case ReduceOp::avg:
      return "avg";
    case ReduceOp::band:
      return "band";
    case ReduceOp::bor:
      return "bor";
    case ReduceOp::bxor:
      return "bxor";
    case ReduceOp::premul_sum:
      return "premul_sum";
  }
  return "?";
}

bool op_applies(ReduceOp op, DataType t) {
  switch (op) {
    case ReduceOp::band:
    case ReduceOp::bor:
    case ReduceOp::bxor:
      return !is_float(t);
    case ReduceOp::premul_sum:
      return is_float(t);
    case ReduceOp::avg:
      return t != DataType::boolean;
    default:
      return static_cast<int>(op) < kNumReduceOps;
  }
}

bool is_float(DataType t) {
  return t == DataType::f16 || t == DataType::bf16 || t == DataType::f32 || t == DataType::f64;
}

bool parse_dtype(const std::string& n, DataType* out) {
  struct Alias {
    const char* name;
    DataType t;
  };
  static const Alias kAliases[] = {
      {"half", DataType::f16},      {"f16", DataType::f16},     {"float16", DataType::f16},
      {"bfloat16", DataType::bf16}, {"bf16", DataType::bf16},   {"float", DataType::f32},
      {"f32", DataType::f32},       {"float32", DataType::f32}, {"double", DataType::f64},
      {"f64", DataType::f64},       {"float64", DataType::f64}, {"int8", DataType::i8},
      {"i8", DataType::i8},         {"uint8", DataType::u8},    {"u8", DataType::u8},
      {"int32", DataType::i32},     {"i32", DataType::i32},     {"int", DataType::i32},
      {"uint32", DataType::u32},    {"u32", DataType::u32},     {"int64", DataType::i64},
      {"i64", DataType::i64},       {"uint64", DataType::u64},  {"u64", DataType::u64},
      {"int16", DataType::i16},     {"i16", DataType::i16},     {"short", DataType::i16},
      {"bool", DataType::boolean},
  };
  for (const auto& a : kAliases) {
    if (n == a.name) {
      *out = a.t;
      return true;
    }
  }
  return false;
}

bool parse_op(const std::string& n, ReduceOp* out) {
  for (int i = 0; i < kNumReduceOps; ++i) {
    const auto op = static_cast<ReduceOp>(i);
    if (n == op_name(op)) {
      *out = op;
      return true;
    }
  }
  return false;
}

const char* wire_name(Wire w) {
  switch (w) {
    case Wire::none:
      return "none";
    case Wire::bf16:
      return "bf16";
    case Wire::f16:
      return "f16";
    case Wire::fp8e4m3:
      return "fp8e4m3";
    case Wire::fp8e5m2:
      return "fp8e5m2";
    case Wire::automatic:
      return "auto";
  }
  return "?";
}

bool parse_wire(const std::string& n, Wire* out) {
  for (int i = 0; i < kNumWires; ++i) {
    const auto w = static_cast<Wire>(i);
    if (n == wire_name(w)) {
      *out = w;
      return true;
    }
  }
  if (n == "off" || n == "f32" || n == "float") {
    *out = Wire::none;
    return true;
  }
  if (n == "fp8") {
    *out = Wire::fp8e4m3;
    return true;
  }
  return false;
}

}  // namespace ringreduce
