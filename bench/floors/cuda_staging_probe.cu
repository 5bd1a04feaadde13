// cuda_staging_probe: the device staging's CUDA primitives alone (src/comm/device.cc), timed in
// N processes sharing one GPU, to say where a small call on device memory spends its time.
//
// Per iteration each process enqueues on its stream what a staged call enqueues: the input's copy
// into page-locked memory, an event, cuStreamWaitValue32 on a host flag, the output's copy back,
// an event. Its host thread then polls the first event, (coupled) waits until every process has
// got that far, as a collective would, writes the "result" into the page-locked buffer, sets the
// flag and polls the last event. Printed per rank and size, medians (p90) in us: enqueueing, the
// input's copy, the wait for the peers, and the output's copy from the flag to its event.
// The output is checked after each size.
//
// Found with it (docs/PERFORMANCE.md, "Small calls on device memory", H200, 2026-11-28): with two
// or more processes on one GPU and no MPS, a host-to-device copy of <= 1 KiB after the stream's
// wait takes ~265 us instead of ~13 (the GPU time-slices between the processes' contexts; larger
// copies go to the copy engines and are not held).
//
// usage: cuda_staging_probe N COUPLED(0|1) COPY(memcpy|batch) ITERS SIZE...
//   batch: the output's copy by cudaMemcpyBatchAsync with cudaMemcpyFlagPreferOverlapWithCompute
//   (a hint to use the copy engines; it needs a stream of the process's own, which both modes use)
// env CUDA_STAGING_PROBE_ATTR=1: also times cudaPointerGetAttributes on malloc'd, device and
// page-locked memory (what CallOptions::memory automatic costs a host call in a CUDA process).
// Exit status: 0 done, 1 a CUDA call failed or the output was wrong, 2 usage.
#include <cuda.h>
#include <cuda_runtime.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

namespace {

void check(cudaError_t e, const char* what, int rank) {
  if (e == cudaSuccess) return;
  std::fprintf(stderr, "cuda_staging_probe: rank %d: %s: %s\n", rank, what, cudaGetErrorString(e));
  std::exit(1);
}

// Process-shared counters (an anonymous shared mapping made before fork).
struct Shared {
  std::atomic<uint64_t> ready[64];
  std::atomic<uint64_t> round[64];
};

double now_us() {
  return std::chrono::duration<double, std::micro>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

double quantile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))];
}

using WaitValue = CUresult (*)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

}  // namespace

int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr,
                 "usage: cuda_staging_probe N COUPLED(0|1) COPY(memcpy|batch) ITERS SIZE...\n");
    return 2;
  }
  const int n = std::atoi(argv[1]);
  const bool coupled = std::atoi(argv[2]) != 0;
  const std::string copy = argv[3];
  const int iters = std::atoi(argv[4]);
  std::vector<size_t> sizes;
  for (int i = 5; i < argc; ++i) sizes.push_back(std::strtoull(argv[i], nullptr, 0));
  if (n < 1 || n > 64 || iters < 1 || (copy != "memcpy" && copy != "batch") ||
      std::find(sizes.begin(), sizes.end(), size_t{0}) != sizes.end()) {
    std::fprintf(stderr,
                 "cuda_staging_probe: N in 1..64, ITERS >= 1, COPY memcpy|batch, sizes > 0\n");
    return 2;
  }
  void* map =
      mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
  if (map == MAP_FAILED) return 1;
  auto* sh = new (map) Shared{};
  // The processes, forked before CUDA is touched (a CUDA context does not survive fork).
  std::vector<pid_t> children;
  int rank = 0;
  for (int r = 1; r < n; ++r) {
    const pid_t p = fork();
    if (p == 0) {
      rank = r;
      children.clear();
      break;
    }
    children.push_back(p);
  }
  check(cudaSetDevice(0), "cudaSetDevice", rank);
  cudaStream_t stream = nullptr;
  check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate", rank);
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult found{};
  check(cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &fn, 12000, cudaEnableDefault,
                                         &found),
        "cudaGetDriverEntryPointByVersion", rank);
  if (found != cudaDriverEntryPointSuccess) {
    std::fprintf(stderr, "cuda_staging_probe: no cuStreamWaitValue32\n");
    return 1;
  }
  const auto wait_value = reinterpret_cast<WaitValue>(fn);
  const size_t most = *std::max_element(sizes.begin(), sizes.end());
  char* dev = nullptr;
  check(cudaMalloc(&dev, most), "cudaMalloc", rank);
  char* pinned = nullptr;
  check(cudaHostAlloc(reinterpret_cast<void**>(&pinned), 64 + most,
                      cudaHostAllocPortable | cudaHostAllocMapped),
        "cudaHostAlloc", rank);
  auto* flag = reinterpret_cast<uint32_t*>(pinned);
  *flag = 0;
  char* staged = pinned + 64;
  void* flag_dev = nullptr;
  check(cudaHostGetDevicePointer(&flag_dev, flag, 0), "cudaHostGetDevicePointer", rank);
  cudaEvent_t input = nullptr, output = nullptr;
  check(cudaEventCreateWithFlags(&input, cudaEventDisableTiming), "cudaEventCreate", rank);
  check(cudaEventCreateWithFlags(&output, cudaEventDisableTiming), "cudaEventCreate", rank);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", rank);

  if (rank == 0 && std::getenv("CUDA_STAGING_PROBE_ATTR")) {
    std::vector<char> ordinary(1 << 20);
    const std::pair<const char*, const void*> kinds[] = {
        {"malloc", ordinary.data()}, {"device", dev}, {"page-locked", pinned}};
    for (const auto& [name, p] : kinds) {
      cudaPointerAttributes a{};
      const int calls = 200000;
      const double t = now_us();
      for (int i = 0; i < calls; ++i)
        if (cudaPointerGetAttributes(&a, p) != cudaSuccess) (void)cudaGetLastError();
      std::printf("cudaPointerGetAttributes on %s memory: %.1f ns a call\n", name,
                  (now_us() - t) * 1e3 / calls);
    }
  }

  uint64_t round = 0;
  auto barrier = [&] {
    ++round;
    sh->round[rank].store(round);
    for (int r = 0; r < n; ++r)
      while (sh->round[r].load() < round) sched_yield();
  };
  auto poll = [&](cudaEvent_t e) {
    for (;;) {
      const cudaError_t q = cudaEventQuery(e);
      if (q == cudaSuccess) return;
      if (q != cudaErrorNotReady) check(q, "cudaEventQuery", rank);
    }
  };
  uint32_t gen = 0;
  for (const size_t bytes : sizes) {
    std::vector<double> enqueue, in, peers, out, total;
    barrier();
    for (int it = 0; it < iters + 10; ++it) {  // 10 untimed first
      ++gen;
      const double t0 = now_us();
      check(cudaMemcpyAsync(staged, dev, bytes, cudaMemcpyDeviceToHost, stream), "copy in", rank);
      check(cudaEventRecord(input, stream), "cudaEventRecord", rank);
      if (wait_value(stream, reinterpret_cast<CUdeviceptr>(flag_dev), gen,
                     CU_STREAM_WAIT_VALUE_EQ) != CUDA_SUCCESS) {
        std::fprintf(stderr, "cuda_staging_probe: rank %d: cuStreamWaitValue32 failed\n", rank);
        return 1;
      }
      if (copy == "memcpy") {
        check(cudaMemcpyAsync(dev, staged, bytes, cudaMemcpyHostToDevice, stream), "copy out",
              rank);
      } else {
        void* dsts[1] = {dev};
        const void* srcs[1] = {staged};
        size_t lengths[1] = {bytes};
        cudaMemcpyAttributes attr{};
        attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
        attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
        size_t first[1] = {0};
        check(cudaMemcpyBatchAsync(dsts, srcs, lengths, 1, &attr, first, 1, stream),
              "cudaMemcpyBatchAsync", rank);
      }
      check(cudaEventRecord(output, stream), "cudaEventRecord", rank);
      const double t1 = now_us();
      poll(input);
      const double t2 = now_us();
      if (coupled) {
        sh->ready[rank].store(gen, std::memory_order_release);
        for (int r = 0; r < n; ++r)
          while (sh->ready[r].load(std::memory_order_acquire) < gen) {
          }
      }
      std::memset(staged, static_cast<int>(gen & 0xff), bytes);  // the op's result
      const double t3 = now_us();
      std::atomic_ref<uint32_t>(*flag).store(gen, std::memory_order_release);
      poll(output);
      const double t4 = now_us();
      if (it >= 10) {
        enqueue.push_back(t1 - t0);
        in.push_back(t2 - t1);
        peers.push_back(t3 - t2);
        out.push_back(t4 - t3);
        total.push_back(t4 - t0);
      }
    }
    std::vector<char> back(bytes);
    check(cudaMemcpy(back.data(), dev, bytes, cudaMemcpyDeviceToHost), "check copy", rank);
    for (size_t i = 0; i < bytes; ++i)
      if (back[i] != static_cast<char>(gen & 0xff)) {
        std::fprintf(stderr, "cuda_staging_probe: rank %d, %zu B: byte %zu wrong\n", rank, bytes,
                     i);
        return 1;
      }
    barrier();
    for (int r = 0; r < n; ++r) {  // in rank order
      if (r == rank)
        std::printf(
            "N=%d %s %s rank %d %7zu B: total %6.1f (%6.1f) enqueue %5.1f in %5.1f (%5.1f) "
            "peers %6.1f out %6.1f (%6.1f) us\n",
            n, coupled ? "coupled" : "alone", copy.c_str(), rank, bytes, quantile(total, .5),
            quantile(total, .9), quantile(enqueue, .5), quantile(in, .5), quantile(in, .9),
            quantile(peers, .5), quantile(out, .5), quantile(out, .9));
      std::fflush(stdout);
      barrier();
    }
  }
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize", rank);
  int status = 0;
  for (const pid_t p : children) {
    int s = 0;
    if (waitpid(p, &s, 0) != p || !WIFEXITED(s) || WEXITSTATUS(s) != 0) status = 1;
  }
  return status;
}
