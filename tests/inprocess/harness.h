// In-process test harness: N ranks as threads, each with its own Communicator over real loopback
// sockets, rendezvousing through an in-memory store.
#pragma once

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "reduce/reduce.h"
#include "ringreduce/ringreduce.hpp"

namespace rrtest {

using ringreduce::DataType;
using ringreduce::ReduceOp;

inline std::string unique_prefix() {
  static std::atomic<int> n{0};
  return "test" + std::to_string(n.fetch_add(1));
}

// Runs body(comm) on `size` threads, one communicator each; rethrows the first failure after
// every thread has finished (threads are always joined).
inline void run_ranks(int size, const std::function<void(ringreduce::Communicator&)>& body,
                      std::map<std::string, std::string> settings = {},
                      std::chrono::milliseconds timeout = std::chrono::seconds(60)) {
  auto store = ringreduce::make_memory_store();
  const std::string prefix = unique_prefix();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ringreduce::Options o;
        o.rank = r;
        o.world_size = size;
        o.store = store;
        o.store_prefix = prefix;
        o.timeout = timeout;
        o.settings = settings;
        ringreduce::Communicator comm(o);
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

// ---- exact test data -------------------------------------------------------------------------

inline bool is_signed_or_float(DataType t) {
  return t != DataType::u8 && t != DataType::u32 && t != DataType::u64;
}

// Small integers, so every sum, product, min and max is exact in every dtype. Products use
// powers of two (values 1 and 2): exact in f16/bf16 for any world size here.
inline double input_value(int rank, size_t i, DataType t, ReduceOp op) {
  if (op == ReduceOp::prod) return ((i + static_cast<size_t>(rank)) % 3 == 0) ? 2.0 : 1.0;
  double v = static_cast<double>((i * 7 + static_cast<size_t>(rank) * 3) % 5);
  return is_signed_or_float(t) ? v - 2.0 : v;
}

inline void store_value(DataType t, void* p, size_t i, double v) {
  switch (t) {
    case DataType::f16: static_cast<uint16_t*>(p)[i] = ringreduce::reduce::float_to_half(static_cast<float>(v)); break;
    case DataType::bf16: static_cast<uint16_t*>(p)[i] = ringreduce::reduce::float_to_bf16(static_cast<float>(v)); break;
    case DataType::f32: static_cast<float*>(p)[i] = static_cast<float>(v); break;
    case DataType::f64: static_cast<double*>(p)[i] = v; break;
    case DataType::i8: static_cast<int8_t*>(p)[i] = static_cast<int8_t>(static_cast<int64_t>(v)); break;
    case DataType::u8: static_cast<uint8_t*>(p)[i] = static_cast<uint8_t>(static_cast<int64_t>(v)); break;
    case DataType::i32: static_cast<int32_t*>(p)[i] = static_cast<int32_t>(static_cast<int64_t>(v)); break;
    case DataType::u32: static_cast<uint32_t*>(p)[i] = static_cast<uint32_t>(static_cast<int64_t>(v)); break;
    case DataType::i64: static_cast<int64_t*>(p)[i] = static_cast<int64_t>(v); break;
    case DataType::u64: static_cast<uint64_t*>(p)[i] = static_cast<uint64_t>(static_cast<int64_t>(v)); break;
  }
}

inline double load_value(DataType t, const void* p, size_t i) {
  switch (t) {
    case DataType::f16: return ringreduce::reduce::half_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::bf16: return ringreduce::reduce::bf16_to_float(static_cast<const uint16_t*>(p)[i]);
    case DataType::f32: return static_cast<const float*>(p)[i];
    case DataType::f64: return static_cast<const double*>(p)[i];
    case DataType::i8: return static_cast<const int8_t*>(p)[i];
    case DataType::u8: return static_cast<const uint8_t*>(p)[i];
    case DataType::i32: return static_cast<const int32_t*>(p)[i];
    case DataType::u32: return static_cast<const uint32_t*>(p)[i];
    case DataType::i64: return static_cast<double>(static_cast<const int64_t*>(p)[i]);
    case DataType::u64: return static_cast<double>(static_cast<const uint64_t*>(p)[i]);
  }
  return 0;
}

// The exact reduction of input_value over `size` ranks at index i, as the dtype stores it.
inline double expected_value(int size, size_t i, DataType t, ReduceOp op) {
  double acc = input_value(0, i, t, op);
  for (int r = 1; r < size; ++r) {
    double v = input_value(r, i, t, op);
    switch (op) {
      case ReduceOp::sum: case ReduceOp::avg: acc += v; break;
      case ReduceOp::prod: acc *= v; break;
      case ReduceOp::min: acc = std::min(acc, v); break;
      case ReduceOp::max: acc = std::max(acc, v); break;
    }
  }
  if (op == ReduceOp::avg) {
    switch (t) {
      case DataType::f64: acc = acc / size; break;
      case DataType::f32: case DataType::f16: case DataType::bf16:
        acc = static_cast<double>(static_cast<float>(acc) / static_cast<float>(size));
        break;
      default: acc = std::trunc(acc / size); break;
    }
  }
  // Round-trip through the dtype: wraps integers, rounds floats exactly as storing does.
  uint64_t slot = 0;
  store_value(t, &slot, 0, acc);
  return load_value(t, &slot, 0);
}

inline std::vector<char> make_input(int rank, size_t count, DataType t, ReduceOp op) {
  std::vector<char> buf(std::max<size_t>(1, count * ringreduce::dtype_size(t)));
  for (size_t i = 0; i < count; ++i) store_value(t, buf.data(), i, input_value(rank, i, t, op));
  return buf;
}

// Number of elements of buf[offset, offset+count) that differ from the expected reduction at
// global indices first_index + k.
inline size_t count_wrong(const void* buf, size_t count, DataType t, ReduceOp op, int size,
                          size_t first_index = 0) {
  size_t wrong = 0;
  for (size_t k = 0; k < count; ++k) {
    double got = load_value(t, buf, k);
    double want = expected_value(size, first_index + k, t, op);
    if (!(got == want)) ++wrong;
  }
  return wrong;
}

inline const std::vector<DataType>& all_dtypes() {
  static const std::vector<DataType> v = {DataType::f16, DataType::bf16, DataType::f32,
                                          DataType::f64, DataType::i8,   DataType::u8,
                                          DataType::i32, DataType::u32,  DataType::i64,
                                          DataType::u64};
  return v;
}
inline const std::vector<ReduceOp>& all_ops() {
  static const std::vector<ReduceOp> v = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                                          ReduceOp::max, ReduceOp::avg};
  return v;
}

}  // namespace rrtest
