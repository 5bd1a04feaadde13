// The CUDA reduce kernels against the device's own copy bandwidth, measured in the same run
// (scripts/gpu-check): cudaMemcpyAsync device to device moves 2 bytes of memory traffic per
// byte copied (read + write); combine moves 3 (two reads, one write) and combine2 4. The kernel's
// share of the copy's traffic rate is the figure issue 17 asks to be >= 90% on buffers larger
// than L2.
//
// Usage: cuda_kernels [MiB ...]   (default 256 1024). Exit 2 without a device.

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "reduce/cuda/reduce_cuda.h"
#include "ringreduce/error.h"
#include "ringreduce/types.h"

namespace {

namespace cuda = ringreduce::reduce::cuda;
using ringreduce::DataType;
using ringreduce::ReduceOp;

constexpr int kRounds = 20;

// Best of kRounds, in ms, of what fn enqueues on the default stream.
template <class F>
double best_ms(F&& fn) {
  cuda::EventTimer t;
  fn();  // warm up: the first launch loads the module
  cuda::synchronize(nullptr);
  double best = 1e30;
  for (int r = 0; r < kRounds; ++r) {
    t.start(nullptr);
    fn();
    t.stop(nullptr);
    best = std::min(best, t.elapsed_ms());
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  if (!cuda::available()) {
    std::fprintf(stderr, "cuda_kernels: %s\n", cuda::unavailable_reason().c_str());
    return 2;
  }
  std::vector<size_t> mibs;
  for (int i = 1; i < argc; ++i) mibs.push_back(std::strtoull(argv[i], nullptr, 10));
  if (mibs.empty()) mibs = {256, 1024};
  try {
    std::printf("# cuda_kernels: %s; best of %d\n", cuda::device_description().c_str(), kRounds);
    std::printf("# %8s %-9s %-9s %10s %12s %12s %8s\n", "MiB", "dtype", "kernel", "ms", "data GB/s",
                "traffic GB/s", "vs copy");
    for (size_t mib : mibs) {
      const size_t bytes = mib << 20;
      cuda::DeviceBuffer a(bytes), b(bytes), d0(bytes), d1(bytes);
      const double copy_ms = best_ms([&] { cuda::copy(d0.data(), a.data(), bytes, nullptr); });
      const double copy_traffic = 2.0 * static_cast<double>(bytes) / copy_ms / 1e6;
      std::printf("  %8zu %-9s %-9s %10.3f %12.1f %12.1f %7.1f%%\n", mib, "bytes", "copy", copy_ms,
                  static_cast<double>(bytes) / copy_ms / 1e6, copy_traffic, 100.0);
      for (DataType t : {DataType::f32, DataType::bf16, DataType::f16, DataType::f64}) {
        const size_t n = bytes / ringreduce::dtype_size(t);
        const double c1 = best_ms(
            [&] { cuda::combine(d0.data(), a.data(), b.data(), n, t, ReduceOp::sum, nullptr); });
        const double c2 = best_ms([&] {
          cuda::combine2(d0.data(), d1.data(), a.data(), b.data(), n, t, ReduceOp::sum, nullptr);
        });
        for (auto [name, ms, moves] :
             {std::tuple{"combine", c1, 3.0}, std::tuple{"combine2", c2, 4.0}}) {
          const double traffic = moves * static_cast<double>(bytes) / ms / 1e6;
          std::printf("  %8zu %-9s %-9s %10.3f %12.1f %12.1f %7.1f%%\n", mib,
                      ringreduce::dtype_name(t), name, ms, static_cast<double>(bytes) / ms / 1e6,
                      traffic, 100.0 * traffic / copy_traffic);
        }
      }
    }
  } catch (const ringreduce::Error& e) {
    std::fprintf(stderr, "cuda_kernels: %s\n", e.what());
    return 1;
  }
  return 0;
}
