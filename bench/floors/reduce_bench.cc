// The f32 sum kernel next to memcpy on the same buffer sizes (4 KiB .. 256 MiB), to see how close
// the reduction gets to the machine's copy bandwidth.
//
// Two views of throughput are reported for every benchmark:
//   bytes_per_second (SetBytesProcessed): memory traffic the operation must do, counted at the
//       program level: memcpy reads size and writes size (2 x size); dst = a + b reads two
//       buffers and writes one (3 x size); a += b reads a and b and writes a (3 x size). This is
//       the view to compare against memcpy for "how much of the bandwidth does it use". It does
//       not count the read-for-ownership a cached store adds when its line is not in cache (a
//       4th size for out-of-place dst = a + b, a 3rd for memcpy with ordinary stores), nor does
//       memcpy's own count shrink when glibc switches to streaming stores for large copies.
//   elem_bytes_per_second: size / time, the rate at which one buffer's worth of elements is
//       processed. This is what an allreduce user sees, and by it a reduction can never match a
//       copy: it moves 1.5 x the bytes per element.
//
// Variants:
//   Memcpy              glibc memcpy, which switches to streaming stores above its own
//                       threshold (240 MiB on the machine this was written on; see
//                       `ld.so --list-diagnostics`, x86.cpu_features.non_temporal_threshold).
//   SumOutOfPlace       reduce::combine(dst, a, b): the public entry, which switches to
//                       streaming stores at internal::stream_threshold_bytes().
//   SumOutOfPlaceCached the ordinary-store kernel at every size.
//   SumOutOfPlaceStream the streaming-store kernel at every size.
//   SumInPlace          reduce::combine(a, a, b): the ring's usual case.
// Buffers are allocated and written once before timing, so page faults are not measured.

#include <benchmark/benchmark.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>

#include "reduce/reduce.h"
#include "reduce/reduce_isa.h"
#include "ringreduce/types.h"

namespace {

using ringreduce::DataType;
using ringreduce::ReduceOp;
namespace rr = ringreduce::reduce;
namespace ri = ringreduce::reduce::internal;

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<float[], FreeDeleter>;

// Page-aligned, and touched so the kernel's first pass does not pay for page faults.
Buffer make_buffer(size_t bytes, float value) {
  constexpr size_t kAlign = 4096;
  const size_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  Buffer b(static_cast<float*>(std::aligned_alloc(kAlign, rounded)));
  if (!b) std::abort();
  for (size_t i = 0; i < bytes / sizeof(float); ++i) b[i] = value;
  return b;
}

void report(benchmark::State& state, size_t bytes, double traffic_factor) {
  const auto iters = static_cast<double>(state.iterations());
  state.SetBytesProcessed(
      static_cast<int64_t>(traffic_factor * static_cast<double>(bytes) * iters));
  state.counters["elem_bytes_per_second"] = benchmark::Counter(
      static_cast<double>(bytes) * iters, benchmark::Counter::kIsRate, benchmark::Counter::kIs1024);
  state.SetLabel(rr::isa());
}

void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  Buffer src = make_buffer(bytes, 1.0f), dst = make_buffer(bytes, 0.0f);
  for (auto _ : state) {
    std::memcpy(dst.get(), src.get(), bytes);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  report(state, bytes, 2.0);
}

void BM_SumOutOfPlace(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  Buffer a = make_buffer(bytes, 1.0f), b = make_buffer(bytes, 2.0f), dst = make_buffer(bytes, 0);
  for (auto _ : state) {
    rr::combine(dst.get(), a.get(), b.get(), n, DataType::f32, ReduceOp::sum);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  report(state, bytes, 3.0);
}

template <bool kStream>
void BM_SumOutOfPlaceKernel(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  const ri::KernelTable& t = ri::active_table();
  const int ti = static_cast<int>(DataType::f32), oi = static_cast<int>(ReduceOp::sum);
  const ri::CombineFn fn = kStream ? t.combine_stream[ti][oi] : t.combine[ti][oi];
  Buffer a = make_buffer(bytes, 1.0f), b = make_buffer(bytes, 2.0f), dst = make_buffer(bytes, 0);
  for (auto _ : state) {
    fn(dst.get(), a.get(), b.get(), n);
    benchmark::DoNotOptimize(dst.get());
    benchmark::ClobberMemory();
  }
  report(state, bytes, 3.0);
}

void BM_SumInPlace(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t n = bytes / sizeof(float);
  // a grows by 1 per iteration and saturates at 2^24: never subnormal, never slow.
  Buffer a = make_buffer(bytes, 1.0f), b = make_buffer(bytes, 1.0f);
  for (auto _ : state) {
    rr::combine(a.get(), a.get(), b.get(), n, DataType::f32, ReduceOp::sum);
    benchmark::DoNotOptimize(a.get());
    benchmark::ClobberMemory();
  }
  report(state, bytes, 3.0);
}

void sizes(benchmark::internal::Benchmark* b) {
  // Rates use CPU time (the library default): on a shared machine a preempted run would
  // otherwise be charged for another process's time slice.
  b->RangeMultiplier(4)->Range(4 << 10, 256 << 20);
}

BENCHMARK(BM_Memcpy)->Apply(sizes);
BENCHMARK(BM_SumOutOfPlace)->Apply(sizes);
BENCHMARK(BM_SumOutOfPlaceKernel<false>)->Name("BM_SumOutOfPlaceCached")->Apply(sizes);
BENCHMARK(BM_SumOutOfPlaceKernel<true>)->Name("BM_SumOutOfPlaceStream")->Apply(sizes);
BENCHMARK(BM_SumInPlace)->Apply(sizes);

}  // namespace

BENCHMARK_MAIN();
