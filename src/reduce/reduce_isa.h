// Internal view of the reduce layer: one table of kernels per instruction set, so that tests and
// benchmarks can run every variant the CPU supports, not only the one the dispatcher picks.
// Not part of the public API.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ringreduce/types.h"

namespace ringreduce::reduce::internal {

enum class Isa : uint8_t { generic, avx2, avx512 };
inline constexpr int kNumIsas = 3;

// Kernels take a count that may be 0. dst aliases a or b exactly, or overlaps neither
// (partial overlap is not supported; no caller needs it).
using CombineFn = void (*)(void* dst, const void* a, const void* b, size_t count);
using DivideFn = void (*)(void* dst, const void* src, size_t count, uint64_t divisor);
// Same contract as CombineFn, but stores bypass the cache (see reduce.cc for when that pays).
// Only f32/f64 sum have one; the slot is nullptr elsewhere.
using StreamFn = CombineFn;
// memcpy with streaming stores (whole bytes, any alignment; dst and src do not overlap).
using CopyFn = void (*)(void* dst, const void* src, size_t bytes);
// dst[i] = src[i] * factor (dst == src or no overlap).
using ScaleFn = void (*)(void* dst, const void* src, size_t count, double factor);

// The narrow wire formats (wire.h): code `count` floats, decode them (into dst, or added to
// local when it is not null; dst may be local), or round them as a code and decode would.
using WireEncodeFn = void (*)(void* dst, const float* src, size_t count);
using WireDecodeFn = void (*)(float* dst, const float* local, const void* src, size_t count);
using WireRoundFn = void (*)(float* dst, const float* src, size_t count);

struct KernelTable {
  const char* name;  // "generic", "avx2", "avx512"
  // Null where the op does not apply to the type (ringreduce::op_applies).
  CombineFn combine[kNumDataTypes][kNumReduceOps];
  DivideFn divide[kNumDataTypes];  // null for bool (no avg)
  ScaleFn scale[kNumDataTypes];    // floating point only
  StreamFn combine_stream[kNumDataTypes][kNumReduceOps];
  CopyFn copy_stream;
  // By Wire value; null for none and automatic.
  WireEncodeFn wire_encode[kNumWires];
  WireDecodeFn wire_decode[kNumWires];
  WireRoundFn wire_round[kNumWires];
};

// Each table lives in its own translation unit, compiled with that ISA's flags. They are
// constant-initialised, so merely loading the library never executes an instruction the CPU
// may lack; only calling through a table does.
extern const KernelTable kGenericTable;
extern const KernelTable kAvx2Table;
extern const KernelTable kAvx512Table;

const KernelTable& table_for(Isa isa);
// Whether this CPU (and OS, for the wider register state) can run that table.
bool cpu_supports(Isa isa);
// The table combine()/divide() use: the widest supported, chosen once.
const KernelTable& active_table();

// Out-of-place combines at least this large use the streaming kernel where one exists.
// Below it the result is likely still in cache when the caller reads it again (the ring sends
// what it just reduced), so ordinary stores win there.
size_t stream_threshold_bytes();

}  // namespace ringreduce::reduce::internal
