// Run-time dispatch: pick the widest kernel table this CPU supports, once, and route every call
// through it.

#include "reduce/reduce.h"

#include <cpuid.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <optional>
#include <string>

#include "core/config.h"
#include "reduce/reduce_isa.h"
#include "ringreduce/error.h"

namespace ringreduce::reduce {
namespace internal {

const KernelTable& table_for(Isa isa) {
  switch (isa) {
    case Isa::generic:
      return kGenericTable;
    case Isa::avx2:
      return kAvx2Table;
    case Isa::avx512:
      return kAvx512Table;
  }
  return kGenericTable;
}

bool cpu_supports(Isa isa) {
  // libgcc's cpu model also checks XCR0, so a feature counts only when the OS saves the wider
  // registers as well.
  __builtin_cpu_init();
  switch (isa) {
    case Isa::generic:
      return true;
    case Isa::avx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
             __builtin_cpu_supports("f16c");
    case Isa::avx512:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
             __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
             __builtin_cpu_supports("f16c");
  }
  return false;
}

const KernelTable& active_table() {
  // A function-local static: thread-safe first use, and usable from other static initialisers.
  static const KernelTable* const table = [] {
    for (Isa isa : {Isa::avx512, Isa::avx2}) {
      if (cpu_supports(isa)) return &table_for(isa);
    }
    return &table_for(Isa::generic);
  }();
  return *table;
}

namespace {

// The size of the largest data cache, from sysfs (what lscpu shows). sysconf's
// _SC_LEVEL3_CACHE_SIZE decodes cpuid itself and is wrong under some hypervisors (ten times too
// large on the KVM guests this was measured on), so it is only the fallback. 0 if unknown.
size_t last_level_cache_bytes() {
  int best_level = 0;
  size_t best = 0;
  for (int i = 0;; ++i) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(i) + "/";
    std::ifstream level_file(dir + "level"), type_file(dir + "type"), size_file(dir + "size");
    int level = 0;
    std::string type, size_text;
    if (!(level_file >> level) || !(type_file >> type) || !(size_file >> size_text)) break;
    const std::optional<uint64_t> bytes = core::parse_size(size_text);  // "32768K"
    if (type != "Instruction" && bytes && level >= best_level) {
      best_level = level;
      best = static_cast<size_t>(*bytes);
    }
  }
  if (best == 0) {
    const long llc = sysconf(_SC_LEVEL3_CACHE_SIZE);
    if (llc > 0) best = static_cast<size_t>(llc);
  }
  return best;
}

}  // namespace

size_t stream_threshold_bytes() {
  // The last-level cache size: a single combine that writes more than that has evicted its own
  // first results before it finishes, so keeping them cached gains nothing, while streaming
  // stores save the read-for-ownership of every destination line (a quarter of the traffic of
  // dst = a + b). The ring's segments are far smaller, so it never gets here. glibc's memcpy
  // makes the same trade at a similar size. Clamped to a plausible range; 32 MiB if unknown.
  static const size_t threshold = [] {
    constexpr size_t kMin = size_t{4} << 20, kMax = size_t{512} << 20;
    const size_t llc = last_level_cache_bytes();
    if (llc == 0) return size_t{32} << 20;
    return llc < kMin ? kMin : (llc > kMax ? kMax : llc);
  }();
  return threshold;
}

}  // namespace internal

namespace {

void check(DataType type, ReduceOp op) {
  if (static_cast<int>(type) >= kNumDataTypes || static_cast<int>(op) >= kNumReduceOps) {
    throw InvalidArgument("reduce: unknown dtype " + std::to_string(static_cast<int>(type)) +
                          " or op " + std::to_string(static_cast<int>(op)));
  }
  if (!op_applies(op, type))
    throw InvalidArgument(std::string("reduce: ") + op_name(op) + " does not apply to " +
                          dtype_name(type));
}

}  // namespace

void combine(void* dst, const void* a, const void* b, size_t count, DataType type, ReduceOp op) {
  check(type, op);
  const internal::KernelTable& t = internal::active_table();
  const int ti = static_cast<int>(type), oi = static_cast<int>(op);
  internal::CombineFn stream = t.combine_stream[ti][oi];
  if (stream != nullptr && count * dtype_size(type) >= internal::stream_threshold_bytes()) {
    stream(dst, a, b, count);
  } else {
    t.combine[ti][oi](dst, a, b, count);
  }
}

size_t stream_output_threshold() {
  return internal::stream_threshold_bytes();
}

namespace {

// Whether the CPU has fast `rep movsb` (ERMS: cpuid leaf 7, EBX bit 9).
bool has_erms() {
  static const bool erms = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) != 0 && (b & (1u << 9)) != 0;
  }();
  return erms;
}

// From this size a cached copy is `rep movsb` (glibc 2.36's threshold on this machine). Not
// under the sanitizers: they see memcpy's bounds and accesses, not an asm statement's.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr size_t kRepMovsbMin = SIZE_MAX;
#else
constexpr size_t kRepMovsbMin = 2112;
#endif

}  // namespace

void copy(void* dst, const void* src, size_t bytes, bool stream) {
  if (stream) {
    internal::active_table().copy_stream(dst, src, bytes);
  } else if (bytes >= kRepMovsbMin && has_erms()) {
    // Not glibc's memcpy: which instructions it uses depends on the glibc release and CPU
    // vendor. On AMD, glibc 2.41 (Debian trixie) no longer uses `rep movsb` below ~400 MB and
    // copies through vector registers instead, which made the shared-memory ring 0.6x as fast
    // as the same binary under glibc 2.36 (bookworm) on this VM; `rep movsb` moves whole lines
    // without reading the destination first wherever the microcode can.
    asm volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(bytes) : : "memory");
  } else if (bytes > 0) {
    std::memcpy(dst, src, bytes);
  }
}

void divide(void* dst, const void* src, size_t count, DataType type, uint64_t divisor) {
  check(type, ReduceOp::avg);
  if (divisor == 0) throw InvalidArgument("reduce: divide by zero");
  internal::active_table().divide[static_cast<int>(type)](dst, src, count, divisor);
}

void scale(void* dst, const void* src, size_t count, DataType type, double factor) {
  check(type, ReduceOp::premul_sum);
  internal::active_table().scale[static_cast<int>(type)](dst, src, count, factor);
}

const char* isa() {
  return internal::active_table().name;
}

}  // namespace ringreduce::reduce
