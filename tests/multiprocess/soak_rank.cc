// One rank of the soak test (issue 6 item 8; soak.sh runs it under ringrun): K collectives of
// random kind, dtype, reduce op, root and size, in place and out of place, blocking and async
// with several outstanding, every result checked exactly, and the process's descriptors, threads,
// resident memory and heap compared between the end of the warm-up and the end of the run.
//
//   soak_rank --ops K --seed S [--max-bytes B] [--outstanding M] [--rss-bound-mib X]
//             [--heap-bound-kib Y] [--warmup-frac F] [--timeout-s T] [--trace 0|1]
//             [--inject result|guard|fd|thread|heap|rss]
//
// What every rank agrees on comes from one generator seeded with S, drawn in the same order on
// every rank: the collective, dtype, op, root, count and the data's offset into the exact
// pattern (tools/exact_data.h), so every rank can compute every other rank's input. What may
// differ between ranks comes from a second generator seeded with S and the rank: blocking or
// async, in place or not, the buffers' misalignment, null pointers where the API allows them, and
// when and in which order outstanding ops are waited on (wait(), wait(timeout), test()).
//
// Checks, per op: the output exactly (bitwise) against the known answer; the input of an out of
// place op unchanged (send is const); a reduce's recv on a non-root and a broadcast's send on a
// non-root untouched ("used on the root only"); 64 guard bytes before and after every buffer
// untouched; outputs are pre-filled with 0xA5 bytes, which is no answer in any dtype, and each op
// shifts the pattern by a random offset, so an output left unwritten or stale from an earlier op
// is wrong. At the end: descriptors and threads equal to those at the end of the warm-up, RSS
// and heap in use within the bounds below; after destroying the communicator, descriptors and
// threads equal to those before creating it. Exits 0 only if all of that held. An error thrown
// by the library fails the rank at once, naming the op it came from.
//
// The warm-up (the first 10% of the ops) ends with two barriers that one rank enters 1.6 s late,
// so that the stall monitor's store connection (opened for good by the first op that waits a
// second) is part of the steady state, not counted as a descriptor leaked later.
//
// Why the memory bounds are what they are: the test's own buffers are one pool allocated and
// touched before the warm-up, so after it the test itself allocates nothing that grows with the
// number of ops; the first op of each kind is of the largest size, so the library's scratch
// buffer (CommImpl::scratch, kept at the largest size ever asked for) is allocated at its
// high-water mark too. Heap in use (mallinfo2: bytes in allocated chunks, whatever RSS the
// allocator keeps) then stays flat: measured -1 to +11 KiB over 5,000 and 50,000 ops alike.
// Bound +256 KiB: a leak of 64 bytes per op shows after 4,500 ops. RSS still grows a little,
// legitimately and boundedly: the scratch buffer is touched only as far as ops write into it
// (on shared memory most ops never do), so its pages become resident slowly, up to --max-bytes;
// shared-memory FIFO pages are touched for the first time; malloc's freed memory is given back
// before each measurement (malloc_trim). Measured before that trim: +0 to +3.6 MiB after 5,000
// ops, flat after ~10,000 (smaps: the 4 MiB scratch mapping). Bound: +8 MiB or twice
// --max-bytes, whichever is larger; 8 MiB over 4,500 ops is a leak of about 2 KiB per op.
#include <malloc.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../tools/exact_data.h"
#include "proc_self.h"
#include "ringreduce/ringreduce.hpp"

namespace {

using namespace ringreduce;
using Clock = std::chrono::steady_clock;
using exact::kPeriod;

// ---- the process's resources --------------------------------------------------------------------

size_t rss_bytes() {
  FILE* f = std::fopen("/proc/self/statm", "r");
  if (!f) return 0;
  unsigned long size = 0, resident = 0;
  const int got = std::fscanf(f, "%lu %lu", &size, &resident);
  std::fclose(f);
  return got == 2 ? resident * static_cast<size_t>(sysconf(_SC_PAGESIZE)) : 0;
}

// RssAnon, RssFile and RssShmem from /proc/self/status, in bytes: where RSS growth would be.
struct RssParts {
  size_t anon = 0, file = 0, shmem = 0;
};
RssParts rss_parts() {
  RssParts p;
  FILE* f = std::fopen("/proc/self/status", "r");
  if (!f) return p;
  char line[256];
  while (std::fgets(line, sizeof line, f)) {
    unsigned long kb = 0;
    if (std::sscanf(line, "RssAnon: %lu kB", &kb) == 1) p.anon = kb << 10;
    if (std::sscanf(line, "RssFile: %lu kB", &kb) == 1) p.file = kb << 10;
    if (std::sscanf(line, "RssShmem: %lu kB", &kb) == 1) p.shmem = kb << 10;
  }
  std::fclose(f);
  return p;
}

size_t heap_in_use() {
  const struct mallinfo2 m = mallinfo2();  // every arena: sbrk'd chunks in use + mmapped chunks
  return m.uordblks + m.hblkhd;
}

struct Snapshot {
  size_t fds = 0, threads = 0, rss = 0, heap = 0;
  RssParts parts;
  static Snapshot take() {
    // Freed memory that malloc keeps (its arenas, and the heap it grows once its dynamic mmap
    // threshold has risen past the 4 MiB buffers) is given back first: what RSS then shows is
    // what is used. Without it, a run of 2,000 ops once measured +9.5 MiB of RSS (7 of it anon)
    // with heap in use flat (+16 KiB).
    malloc_trim(0);
    return {static_cast<size_t>(rrtest::open_fds()), static_cast<size_t>(rrtest::thread_count()),
            rss_bytes(), heap_in_use(), rss_parts()};
  }
};

double mib(size_t b) {
  return static_cast<double>(b) / (1 << 20);
}

// ---- random draws: splitmix64, the same sequence wherever it runs -------------------------------

struct Rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  size_t below(size_t n) { return static_cast<size_t>(next() % n); }
  bool chance(double p) { return uniform() < p; }
};

// ---- ops ----------------------------------------------------------------------------------------

enum class Coll { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall, barrier };
constexpr int kNumColls = 7;
const char* coll_name(Coll c) {
  static const char* const names[] = {"allreduce", "reduce_scatter", "allgather", "broadcast",
                                      "reduce",    "alltoall",       "barrier"};
  return names[static_cast<int>(c)];
}
bool has_op(Coll c) {
  return c == Coll::allreduce || c == Coll::reduce_scatter || c == Coll::reduce;
}
bool has_root(Coll c) {
  return c == Coll::broadcast || c == Coll::reduce;
}
// Collectives whose count is per rank (buffers of size() * count elements).
bool blocked(Coll c) {
  return c == Coll::reduce_scatter || c == Coll::allgather || c == Coll::alltoall;
}

struct OpSpec {
  size_t index = 0;  // this run's op number, from 0
  Coll coll = Coll::barrier;
  DataType dtype = DataType::f32;
  ReduceOp op = ReduceOp::sum;
  size_t count = 0;  // the API's count: per rank for the blocked collectives
  int root = 0;
  size_t shift = 0;  // offset into the exact pattern, so consecutive ops' answers differ
  // Per rank:
  bool in_place = false;
  bool async = false;
  size_t misalign = 0;       // bytes (a multiple of the element size) added to each buffer's start
  bool null_unused = false;  // pass nullptr where the API allows it (unused buffers, count 0)

  std::string describe() const {
    char s[256];
    int len = std::snprintf(s, sizeof s, "op %zu %s", index, coll_name(coll));
    if (coll != Coll::barrier) {
      len += std::snprintf(s + len, sizeof s - static_cast<size_t>(len), " (%s x %zu",
                           dtype_name(dtype), count);
      if (has_op(coll))
        len += std::snprintf(s + len, sizeof s - static_cast<size_t>(len), ", %s", op_name(op));
      if (has_root(coll))
        len += std::snprintf(s + len, sizeof s - static_cast<size_t>(len), ", root %d", root);
      std::snprintf(s + len, sizeof s - static_cast<size_t>(len), ", %s, %s, shift %zu, +%zu B)",
                    in_place ? "in place" : "out of place", async ? "async" : "blocking", shift,
                    misalign);
    } else {
      std::snprintf(s + len, sizeof s - static_cast<size_t>(len), " (%s)",
                    async ? "async" : "blocking");
    }
    return s;
  }
};

// ---- buffers and patterns -----------------------------------------------------------------------

constexpr size_t kGuard = 64;           // guard bytes checked on each side of a buffer
constexpr size_t kFront = 4096;         // the buffer's start within its allocation
constexpr size_t kMaxMisalign = 8 * 8;  // 8 elements of the widest dtype
constexpr unsigned char kGuardByte = 0x5A;
// Pre-fill of outputs and of buffers that must not be read: 0xA5.. is no answer in any dtype
// (answers are small integers: 0xA5 is -91 or 165, 0xA5A5 a tiny negative f16/bf16, and so on).
constexpr unsigned char kUnwritten = 0xA5;
constexpr unsigned char kNotRead = 0x3C;

// Page-aligned, touched once at start-up so that the pool's pages are resident before the warm-up
// ends and its RSS never changes afterwards.
struct Buffer {
  std::unique_ptr<char, decltype(&std::free)> mem{nullptr, &std::free};
  size_t capacity = 0;
  explicit Buffer(size_t bytes) : capacity(bytes) {
    const size_t total = (kFront + kMaxMisalign + bytes + kGuard + 4095) / 4096 * 4096;
    mem.reset(static_cast<char*>(std::aligned_alloc(4096, total)));
    if (!mem) throw std::bad_alloc();
    std::memset(mem.get(), kGuardByte, total);
  }
};

// The bytes of an element-periodic pattern: element i of a region holds bytes[i % kPeriod].
struct Pattern {
  unsigned char bytes[kPeriod * 8];
};

Pattern input_pattern(int rank, DataType t, ReduceOp op, size_t first) {
  Pattern p;
  for (size_t k = 0; k < kPeriod; ++k)
    exact::store_value(t, p.bytes, k, exact::input_value(rank, first + k, t, op));
  return p;
}
Pattern reduced_pattern(int size, DataType t, ReduceOp op, size_t first) {
  Pattern p;
  for (size_t k = 0; k < kPeriod; ++k)
    exact::store_value(t, p.bytes, k, exact::expected_value(size, first + k, t, op));
  return p;
}
Pattern byte_pattern(unsigned char b) {
  Pattern p;
  std::memset(p.bytes, b, sizeof p.bytes);
  return p;
}

// kTile periods of a pattern, so that filling and comparing go by memcpy/memcmp of ~kTile * 15
// elements at a time.
constexpr size_t kTile = 256;
struct Tiled {
  std::vector<unsigned char> bytes;
  Tiled(const Pattern& p, size_t elem) : bytes(kTile * kPeriod * elem) {
    for (size_t i = 0; i < kTile * kPeriod; ++i)
      std::memcpy(bytes.data() + i * elem, p.bytes + (i % kPeriod) * elem, elem);
  }
};

void fill(void* dst, size_t count, DataType t, const Pattern& p) {
  const size_t elem = dtype_size(t);
  const Tiled tile(p, elem);
  const size_t chunk = tile.bytes.size();
  char* q = static_cast<char*>(dst);
  for (size_t off = 0, total = count * elem; off < total; off += chunk)
    std::memcpy(q + off, tile.bytes.data(), std::min(chunk, total - off));
}

std::string show(DataType t, const void* p, size_t i) {
  const size_t elem = dtype_size(t);
  uint64_t bits = 0;
  std::memcpy(&bits, static_cast<const char*>(p) + i * elem, elem);
  char s[64];
  std::snprintf(s, sizeof s, "%.17g (0x%0*" PRIx64 ")", exact::load_value(t, p, i),
                static_cast<int>(2 * elem), bits);
  return s;
}

struct Checker {
  int rank = 0;
  size_t failures = 0;
  bool corrupt_next = false;  // --inject result: flip a byte of the next region checked
  static constexpr size_t kMaxReports = 20;

  void report(const OpSpec& s, const std::string& what) {
    ++failures;
    if (failures <= kMaxReports)
      std::printf("FAIL rank %d: %s: %s\n", rank, s.describe().c_str(), what.c_str());
    else if (failures == kMaxReports + 1)
      std::printf("FAIL rank %d: more failures, not shown\n", rank);
  }

  // region[0, count) against the pattern; `what` names the region, e.g. "recv block 2".
  void expect(const OpSpec& s, const char* what, const void* region, size_t count,
              const Pattern& p) {
    const size_t elem = dtype_size(s.dtype);
    const Tiled tile(p, elem);
    const size_t chunk = tile.bytes.size();
    const char* q = static_cast<const char*>(region);
    if (corrupt_next && count > 0) {
      const_cast<char*>(q)[count / 2 * elem] ^= 0x40;  // the test's own buffer
      corrupt_next = false;
    }
    size_t wrong = 0, first_wrong = 0;
    for (size_t off = 0, total = count * elem; off < total; off += chunk) {
      const size_t n = std::min(chunk, total - off);
      if (std::memcmp(q + off, tile.bytes.data(), n) == 0) continue;
      for (size_t b = 0; b < n; b += elem)
        if (std::memcmp(q + off + b, tile.bytes.data() + b, elem) != 0) {
          if (wrong++ == 0) first_wrong = (off + b) / elem;
        }
    }
    if (wrong == 0) return;
    report(s, std::string(what) + "[" + std::to_string(first_wrong) +
                  "] = " + show(s.dtype, q, first_wrong) + ", expected " +
                  show(s.dtype, p.bytes, first_wrong % kPeriod) + " (" + std::to_string(wrong) +
                  " of " + std::to_string(count) + " elements wrong)");
  }

  void guards(const OpSpec& s, const char* what, const char* start, size_t bytes) {
    for (size_t i = 0; i < kGuard; ++i) {
      if (static_cast<unsigned char>(start[-1 - static_cast<ptrdiff_t>(i)]) != kGuardByte) {
        report(s, std::string("the byte ") + std::to_string(i + 1) + " before " + what +
                      " was overwritten");
        return;
      }
      if (static_cast<unsigned char>(start[bytes + i]) != kGuardByte) {
        report(s, std::string("the byte ") + std::to_string(i) + " after the " +
                      std::to_string(bytes) + " bytes of " + what + " was overwritten");
        return;
      }
    }
  }
};

// One op's buffers: `a` is the send buffer (or the in-place buffer), `b` the receive buffer.
struct Slot {
  Buffer a, b;
  bool busy = false;
  explicit Slot(size_t bytes) : a(bytes), b(bytes) {}
};

struct Pending {
  OpSpec spec;
  Work work;
  Slot* slot;
};

// ---- the soak -----------------------------------------------------------------------------------

struct Args {
  size_t ops = 500;
  uint64_t seed = 1;
  size_t max_bytes = 4 << 20;
  size_t outstanding = 4;
  double rss_bound_mib = 0;  // 0: max(8 MiB, 2 * max_bytes)
  double heap_bound_kib = 256;
  double warmup_frac = 0.1;
  double timeout_s = 60;
  bool trace = false;  // every rank prints its resources every tenth of the run
  // Self-test of the checks (soak.sh selftest): rank 1 makes one fault of this kind at the first
  // op past the middle of the run that has data, and must fail with the matching message.
  // result: flips a byte of an output; guard: overwrites a byte after a receive buffer; fd: leaks
  // a descriptor; thread: leaks a thread; heap: leaks 1 MiB of malloc; rss: maps and touches
  // 16 MiB outside malloc.
  std::string inject;
};

class Soak {
 public:
  Soak(Communicator& comm, const Args& args)
      : comm_(comm),
        args_(args),
        n_(comm.size()),
        r_(comm.rank()),
        shared_{args.seed},
        local_{args.seed * 0x2545F4914F6CDD1DULL + static_cast<uint64_t>(r_) + 1} {
    checker_.rank = r_;
    for (size_t i = 0; i <= args.outstanding; ++i)
      slots_.push_back(std::make_unique<Slot>(args.max_bytes));
  }

  // Draws op i: the shared part first (same on every rank), then this rank's choices.
  OpSpec draw(size_t i) {
    OpSpec s;
    s.index = i;
    // Weights: allreduce is what training runs most; the others equally; barriers a few.
    static const int weights[kNumColls] = {30, 12, 12, 12, 12, 12, 10};  // sum 100
    int pick = static_cast<int>(shared_.below(100)), c = 0;
    while (pick >= weights[c]) pick -= weights[c++];
    s.coll = static_cast<Coll>(c);
    s.dtype = static_cast<DataType>(shared_.below(kNumDataTypes));
    // Only ops that apply to the dtype (bitwise on integers and bool, premul_sum, whose default
    // factor 1 makes it a sum, on floating point).
    do {
      s.op = static_cast<ReduceOp>(shared_.below(kNumReduceOps));
    } while (!op_applies(s.op, s.dtype));
    s.root = static_cast<int>(shared_.below(static_cast<size_t>(n_)));
    s.shift = shared_.below(kPeriod);
    // Log-uniform in elements from 1 to max_bytes (total over the ranks' blocks for the blocked
    // collectives), so 1-element calls and MiB calls are equally common per octave; 2% are empty.
    const size_t elem = dtype_size(s.dtype);
    const size_t max_elems = args_.max_bytes / elem;
    size_t total = static_cast<size_t>(
        std::exp(shared_.uniform() * std::log(static_cast<double>(max_elems) + 1.0)));
    total = std::clamp<size_t>(total, 1, max_elems);
    if (shared_.chance(0.02)) total = 0;
    // The first op of each kind is as large as any later one, so that what the library keeps at
    // its high-water mark (CommImpl's scratch buffer: up to a whole reduce_scatter's send size,
    // a reduce's count) has reached it before the warm-up ends.
    if (i < static_cast<size_t>(kNumColls)) {
      s.coll = static_cast<Coll>(i);
      total = max_elems;
    }
    s.count = blocked(s.coll) ? total / static_cast<size_t>(n_) : total;
    if (s.coll == Coll::barrier) s.count = 0;
    // This rank's choices.
    s.in_place = s.coll != Coll::alltoall && s.coll != Coll::barrier && local_.chance(0.5);
    // Op 0 is async on every rank: the progress thread, started by a rank's first async call,
    // then exists before the warm-up ends, as it does in any steady state that uses async calls.
    s.async = local_.chance(0.4) || i == 0;
    s.misalign = local_.chance(0.5) ? elem * local_.below(kMaxMisalign / elem) : 0;
    s.null_unused = local_.chance(0.5);
    return s;
  }

  // Runs ops [from, to); returns with nothing outstanding. Throws what the library throws.
  void run(size_t from, size_t to) {
    for (size_t i = from; i < to; ++i) {
      const OpSpec s = draw(i);
      ++by_coll_[static_cast<int>(s.coll)];
      if (s.coll != Coll::barrier)
        bytes_ +=
            (blocked(s.coll) ? s.count * static_cast<size_t>(n_) : s.count) * dtype_size(s.dtype);
      if (s.async && pending_.size() >= args_.outstanding) finish(0);  // the oldest
      Slot* slot = free_slot();
      prepare(s, *slot);
      current_ = &s;  // what an error names
      if (s.async) {
        slot->busy = true;
        pending_.push_back({s, issue(s, *slot, /*async=*/true), slot});
        ++async_;
        max_pending_ = std::max(max_pending_, pending_.size());
      } else {
        issue(s, *slot, /*async=*/false);
        check(s, *slot);
      }
      current_ = nullptr;
      // Now and then finish some outstanding op, not necessarily the oldest, in one of the ways
      // the API offers.
      if (!pending_.empty()) {
        const double u = local_.uniform();
        if (u < 0.25) {
          finish(local_.below(pending_.size()));
        } else if (u < 0.35) {
          poll(local_.below(pending_.size()));
        } else if (u < 0.40) {
          const size_t k = local_.below(pending_.size());
          waiting_ = &pending_[k];
          const bool done = pending_[k].work.wait(std::chrono::milliseconds(1));
          waiting_ = nullptr;
          if (done) finish(k);
        }
      }
    }
    while (!pending_.empty()) finish(local_.below(pending_.size()));
  }

  // Two barriers, each entered 1.6 s late by one rank (the last, then the first), so that every
  // rank has one op that waits more than a second. Such an op makes the stall monitor open its
  // own store connection (stall_monitor.cc: publish after 1 s), which it then keeps for the
  // communicator's life: one descriptor more, once. Done in the warm-up, it is part of the
  // steady state; otherwise any op that happened to wait a second on a loaded machine after the
  // warm-up would show as a leaked descriptor.
  void stall_monitor_warm_up() {
    for (const int late : {n_ - 1, 0}) {
      if (r_ == late) std::this_thread::sleep_for(std::chrono::milliseconds(1600));
      comm_.barrier();
    }
  }

  const OpSpec* current() const {
    return current_ ? current_ : (waiting_ ? &waiting_->spec : nullptr);
  }
  size_t failures() const { return checker_.failures; }
  std::string algorithms() const {
    std::string s;
    for (const auto& [name, n] : algorithms_)
      s += (s.empty() ? "" : " ") + name + " " + std::to_string(n);
    return s;
  }
  std::string mix() const {
    std::string s;
    for (int c = 0; c < kNumColls; ++c)
      s += std::string(c ? " " : "") + coll_name(static_cast<Coll>(c)) + " " +
           std::to_string(by_coll_[c]);
    char moved[32];
    std::snprintf(moved, sizeof moved, "%.0f MiB", mib(bytes_));
    return s + "; async " + std::to_string(async_) + ", up to " + std::to_string(max_pending_) +
           " outstanding; buffers " + moved;
  }

 private:
  Slot* free_slot() {
    for (auto& s : slots_)
      if (!s->busy) return s.get();
    throw std::logic_error("no free buffer slot");  // outstanding + 1 slots: cannot happen
  }

  static char* at(Buffer& b, const OpSpec& s) { return b.mem.get() + kFront + s.misalign; }

  // Pre-fills guards and buffers for op s.
  void prepare(const OpSpec& s, Slot& slot) {
    if (s.coll == Coll::barrier) return;
    const size_t elem = dtype_size(s.dtype), nn = static_cast<size_t>(n_),
                 rr = static_cast<size_t>(r_);
    const size_t a_elems = s.coll == Coll::allgather ? s.count
                           : blocked(s.coll)         ? s.count * nn
                                                     : s.count;
    const size_t b_elems = s.coll == Coll::reduce_scatter ? s.count
                           : blocked(s.coll)              ? s.count * nn
                                                          : s.count;
    char* a = at(slot.a, s);
    char* b = at(slot.b, s);
    std::memset(a - kGuard, kGuardByte, kGuard);
    std::memset(a + a_elems * elem, kGuardByte, kGuard);
    std::memset(b - kGuard, kGuardByte, kGuard);
    std::memset(b + b_elems * elem, kGuardByte, kGuard);
    const Pattern unwritten = byte_pattern(kUnwritten);
    switch (s.coll) {
      case Coll::allreduce:
      case Coll::reduce:
        fill(a, s.count, s.dtype, input_pattern(r_, s.dtype, s.op, s.shift));
        if (!s.in_place) fill(b, s.count, s.dtype, unwritten);
        break;
      case Coll::reduce_scatter:
        fill(a, s.count * nn, s.dtype, input_pattern(r_, s.dtype, s.op, s.shift));
        if (!s.in_place) fill(b, s.count, s.dtype, unwritten);
        break;
      case Coll::allgather:
        fill(b, s.count * nn, s.dtype, unwritten);
        fill(s.in_place ? b + rr * s.count * elem : a, s.count, s.dtype,
             input_pattern(r_, s.dtype, s.op, s.shift + rr * s.count));
        break;
      case Coll::broadcast:
        if (r_ == s.root)
          fill(a, s.count, s.dtype, input_pattern(r_, s.dtype, s.op, s.shift));
        else
          fill(a, s.count, s.dtype, byte_pattern(s.in_place ? kUnwritten : kNotRead));
        if (!s.in_place) fill(b, s.count, s.dtype, unwritten);
        break;
      case Coll::alltoall:
        for (size_t j = 0; j < nn; ++j)
          fill(a + j * s.count * elem, s.count, s.dtype,
               input_pattern(r_, s.dtype, s.op, s.shift + j * s.count));
        fill(b, s.count * nn, s.dtype, unwritten);
        break;
      case Coll::barrier:
        break;
    }
  }

  Work issue(const OpSpec& s, Slot& slot, bool async) {
    const size_t elem = dtype_size(s.dtype), rr = static_cast<size_t>(r_);
    char* a = at(slot.a, s);
    char* b = at(slot.b, s);
    const bool empty = s.count == 0;
    const bool nulls = s.null_unused;
    const void* send = nullptr;
    void* recv = nullptr;
    switch (s.coll) {
      case Coll::allreduce:
        send = empty && nulls ? nullptr : a;
        recv = empty && nulls ? nullptr : s.in_place ? a : b;
        return async ? comm_.allreduce_async(send, recv, s.count, s.dtype, s.op)
                     : (comm_.allreduce(send, recv, s.count, s.dtype, s.op), Work());
      case Coll::reduce_scatter:
        send = empty && nulls ? nullptr : a;
        recv = empty && nulls ? nullptr : s.in_place ? a + rr * s.count * elem : b;
        return async ? comm_.reduce_scatter_async(send, recv, s.count, s.dtype, s.op)
                     : (comm_.reduce_scatter(send, recv, s.count, s.dtype, s.op), Work());
      case Coll::allgather:
        send = empty && nulls ? nullptr : s.in_place ? b + rr * s.count * elem : a;
        recv = empty && nulls ? nullptr : b;
        return async ? comm_.allgather_async(send, recv, s.count, s.dtype)
                     : (comm_.allgather(send, recv, s.count, s.dtype), Work());
      case Coll::broadcast:
        if (s.in_place) {
          recv = empty && nulls ? nullptr : a;
          return async ? comm_.broadcast_async(recv, s.count, s.dtype, s.root)
                       : (comm_.broadcast(recv, s.count, s.dtype, s.root), Work());
        }
        send = (empty || r_ != s.root) && nulls ? nullptr : a;  // read on the root only
        recv = empty && nulls ? nullptr : b;
        return async ? comm_.broadcast_async(send, recv, s.count, s.dtype, s.root)
                     : (comm_.broadcast(send, recv, s.count, s.dtype, s.root), Work());
      case Coll::reduce:
        send = empty && nulls ? nullptr : a;
        if (s.in_place)
          recv = empty && nulls ? nullptr : a;
        else
          recv = (empty || r_ != s.root) && nulls ? nullptr : b;  // used on the root only
        return async ? comm_.reduce_async(send, recv, s.count, s.dtype, s.op, s.root)
                     : (comm_.reduce(send, recv, s.count, s.dtype, s.op, s.root), Work());
      case Coll::alltoall:
        send = empty && nulls ? nullptr : a;
        recv = empty && nulls ? nullptr : b;
        return async ? comm_.alltoall_async(send, recv, s.count, s.dtype)
                     : (comm_.alltoall(send, recv, s.count, s.dtype), Work());
      case Coll::barrier:
        return async ? comm_.barrier_async() : (comm_.barrier(), Work());
    }
    return Work();
  }

  // Checks op s's results in its slot (the op has completed).
  void check(const OpSpec& s, Slot& slot) {
    if (s.coll == Coll::barrier) return;
    const size_t elem = dtype_size(s.dtype), nn = static_cast<size_t>(n_),
                 rr = static_cast<size_t>(r_);
    char* a = at(slot.a, s);
    char* b = at(slot.b, s);
    const size_t a_elems = s.coll == Coll::allgather ? s.count
                           : blocked(s.coll)         ? s.count * nn
                                                     : s.count;
    const size_t b_elems = s.coll == Coll::reduce_scatter ? s.count
                           : blocked(s.coll)              ? s.count * nn
                                                          : s.count;
    if (!args_.inject.empty() && !injected_ && r_ == 1 && s.index >= args_.ops / 2 && s.count > 0)
      inject(b + b_elems * elem);
    checker_.guards(s, "send", a, a_elems * elem);
    checker_.guards(s, "recv", b, b_elems * elem);
    const Pattern input = input_pattern(r_, s.dtype, s.op, s.shift);
    switch (s.coll) {
      case Coll::allreduce:
        checker_.expect(s, s.in_place ? "buffer" : "recv", s.in_place ? a : b, s.count,
                        reduced_pattern(n_, s.dtype, s.op, s.shift));
        if (!s.in_place) checker_.expect(s, "send (must be unchanged)", a, s.count, input);
        break;
      case Coll::reduce_scatter:
        checker_.expect(s, s.in_place ? "own block of buffer" : "recv",
                        s.in_place ? a + rr * s.count * elem : b, s.count,
                        reduced_pattern(n_, s.dtype, s.op, s.shift + rr * s.count));
        if (!s.in_place) checker_.expect(s, "send (must be unchanged)", a, s.count * nn, input);
        break;
      case Coll::allgather:
        for (size_t j = 0; j < nn; ++j) {
          const std::string what = "recv block " + std::to_string(j);
          checker_.expect(s, what.c_str(), b + j * s.count * elem, s.count,
                          input_pattern(static_cast<int>(j), s.dtype, s.op, s.shift + j * s.count));
        }
        if (!s.in_place)
          checker_.expect(s, "send (must be unchanged)", a, s.count,
                          input_pattern(r_, s.dtype, s.op, s.shift + rr * s.count));
        break;
      case Coll::broadcast: {
        const Pattern root_input = input_pattern(s.root, s.dtype, s.op, s.shift);
        checker_.expect(s, s.in_place ? "buffer" : "recv", s.in_place ? a : b, s.count, root_input);
        if (!s.in_place)
          checker_.expect(s, r_ == s.root ? "send (must be unchanged)" : "send (never read)", a,
                          s.count, r_ == s.root ? root_input : byte_pattern(kNotRead));
        break;
      }
      case Coll::reduce:
        if (r_ == s.root) {
          checker_.expect(s, s.in_place ? "buffer" : "recv", s.in_place ? a : b, s.count,
                          reduced_pattern(n_, s.dtype, s.op, s.shift));
          if (!s.in_place) checker_.expect(s, "send (must be unchanged)", a, s.count, input);
        } else {
          // Not the root: send is only read, and recv is "used on the root only".
          checker_.expect(s, "send (must be unchanged)", a, s.count, input);
          if (!s.in_place)
            checker_.expect(s, "recv (unused off the root)", b, s.count, byte_pattern(kUnwritten));
        }
        break;
      case Coll::alltoall:
        for (size_t j = 0; j < nn; ++j) {
          const std::string what = "recv block " + std::to_string(j);
          checker_.expect(
              s, what.c_str(), b + j * s.count * elem, s.count,
              input_pattern(static_cast<int>(j), s.dtype, s.op, s.shift + rr * s.count));
        }
        for (size_t j = 0; j < nn; ++j)
          checker_.expect(s, "send (must be unchanged)", a + j * s.count * elem, s.count,
                          input_pattern(r_, s.dtype, s.op, s.shift + j * s.count));
        break;
      case Coll::barrier:
        break;
    }
  }

  // --inject: one deliberate fault (`after_recv` is the first byte past this op's receive
  // buffer). The leaks are never undone: the process ends soon after.
  void inject(char* after_recv) {
    injected_ = true;
    const std::string& kind = args_.inject;
    if (kind == "result") {
      checker_.corrupt_next = true;
    } else if (kind == "guard") {
      after_recv[3] = static_cast<char>(~kGuardByte);
    } else if (kind == "fd") {
      if (dup(1) < 0) std::perror("dup");
    } else if (kind == "thread") {
      std::thread([] {
        for (;;) std::this_thread::sleep_for(std::chrono::hours(1));
      }).detach();
    } else if (kind == "heap") {
      leaked_ = std::malloc(1 << 20);
      if (leaked_) std::memset(leaked_, 1, 1 << 20);
    } else if (kind == "rss") {
      const size_t bytes = 16 << 20;
      void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      if (p != MAP_FAILED) std::memset(p, 1, bytes);
    }
  }

  // Waits for pending op k, checks it and frees its slot.
  void finish(size_t k) {
    waiting_ = &pending_[k];
    pending_[k].work.wait();
    waiting_ = nullptr;
    // Which algorithms ran (known for async ops only: a blocking call returns no Work).
    const std::string plan = pending_[k].work.algorithm();
    ++algorithms_[std::string(coll_name(pending_[k].spec.coll)) + ":" +
                  plan.substr(0, plan.find(' '))];
    check(pending_[k].spec, *pending_[k].slot);
    pending_[k].slot->busy = false;
    pending_.erase(pending_.begin() + static_cast<ptrdiff_t>(k));
  }

  // test() until pending op k has completed, yielding between tries; bounded: after a second of
  // polling, wait() (which drives the op itself if nobody does).
  void poll(size_t k) {
    waiting_ = &pending_[k];
    const auto give_up = Clock::now() + std::chrono::seconds(1);
    while (!pending_[k].work.test() && Clock::now() < give_up) sched_yield();
    finish(k);
  }

  Communicator& comm_;
  const Args& args_;
  const int n_, r_;
  Rng shared_, local_;
  Checker checker_;
  std::vector<std::unique_ptr<Slot>> slots_;
  std::deque<Pending> pending_;
  const OpSpec* current_ = nullptr;
  const Pending* waiting_ = nullptr;
  size_t by_coll_[kNumColls] = {};
  size_t async_ = 0, max_pending_ = 0;
  size_t bytes_ = 0;  // this rank's buffer bytes over all ops (the larger of send and recv)
  std::map<std::string, size_t> algorithms_;  // "allreduce:ring" -> async ops that ran it
  bool injected_ = false;
  void* leaked_ = nullptr;
};

bool parse_args(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    if (i + 1 >= argc) return false;
    const char* v = argv[++i];
    if (k == "--ops")
      a->ops = std::strtoull(v, nullptr, 10);
    else if (k == "--seed")
      a->seed = std::strtoull(v, nullptr, 10);
    else if (k == "--max-bytes")
      a->max_bytes = std::strtoull(v, nullptr, 10);
    else if (k == "--outstanding")
      a->outstanding = std::strtoull(v, nullptr, 10);
    else if (k == "--rss-bound-mib")
      a->rss_bound_mib = std::atof(v);
    else if (k == "--heap-bound-kib")
      a->heap_bound_kib = std::atof(v);
    else if (k == "--warmup-frac")
      a->warmup_frac = std::atof(v);
    else if (k == "--timeout-s")
      a->timeout_s = std::atof(v);
    else if (k == "--trace")
      a->trace = std::atoi(v) != 0;
    else if (k == "--inject")
      a->inject = v;
    else
      return false;
  }
  const std::string kinds[] = {"", "result", "guard", "fd", "thread", "heap", "rss"};
  if (std::find(std::begin(kinds), std::end(kinds), a->inject) == std::end(kinds)) return false;
  if (a->rss_bound_mib <= 0)
    a->rss_bound_mib = std::max(8.0, 2 * static_cast<double>(a->max_bytes) / (1 << 20));
  return a->ops > 0 && a->max_bytes >= 8 && a->outstanding >= 1 && a->warmup_frac > 0 &&
         a->warmup_frac < 1 && a->timeout_s > 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args args;
  if (!parse_args(argc, argv, &args)) {
    std::fprintf(stderr,
                 "usage: soak_rank --ops K --seed S [--max-bytes B] [--outstanding M] "
                 "[--rss-bound-mib X] [--heap-bound-kib Y] [--warmup-frac F] [--timeout-s T] "
                 "[--trace 0|1] [--inject result|guard|fd|thread|heap|rss]\n");
    return 2;
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // whole lines, in order with the library's logs
  const Snapshot before = Snapshot::take();
  int rank = -1;
  bool ok = true;
  Snapshot warm, end;
  double seconds = 0;
  auto fail = [&](const char* why) {
    std::printf("FAIL rank %d: %s\n", rank, why);
    ok = false;
  };
  {
    Options o;
    o.timeout = std::chrono::milliseconds(static_cast<int64_t>(args.timeout_s * 1000));
    Communicator comm = Communicator::from_env(o);
    rank = comm.rank();
    Soak soak(comm, args);
    const size_t warm_ops =
        std::max<size_t>(1, static_cast<size_t>(static_cast<double>(args.ops) * args.warmup_frac));
    const auto t0 = Clock::now();
    try {
      soak.run(0, warm_ops);
      soak.stall_monitor_warm_up();
      warm = Snapshot::take();
      // Progress on rank 0 every tenth of the run, so a slow or stuck run shows where it is.
      const size_t step = std::max<size_t>(1, args.ops / 10);
      for (size_t i = warm_ops; i < args.ops; i = std::min(args.ops, i + step)) {
        soak.run(i, std::min(args.ops, i + step));
        const double t = std::chrono::duration<double>(Clock::now() - t0).count();
        if (args.trace) {
          const Snapshot now = Snapshot::take();
          std::printf(
              "trace rank %d: %zu/%zu ops, %.1f s: fds %zu threads %zu rss %.2f MiB "
              "heap %.1f KiB\n",
              rank, std::min(args.ops, i + step), args.ops, t, now.fds, now.threads, mib(now.rss),
              static_cast<double>(now.heap) / 1024);
        } else if (rank == 0) {
          std::printf("progress: %zu/%zu ops, %.1f s\n", std::min(args.ops, i + step), args.ops, t);
        }
      }
      end = Snapshot::take();
    } catch (const std::exception& e) {
      const OpSpec* s = soak.current();
      std::printf("FAIL rank %d: %s: %s\n", rank, s ? s->describe().c_str() : "(no op)", e.what());
      return 1;
    }
    seconds = std::chrono::duration<double>(Clock::now() - t0).count();
    std::printf("SOAK rank %d: %zu ops in %.1f s (%s), %zu wrong\n", rank, args.ops, seconds,
                soak.mix().c_str(), soak.failures());
    std::printf("SOAK rank %d: algorithms of the async ops: %s\n", rank, soak.algorithms().c_str());
    ok = soak.failures() == 0;
    const double rss_growth = mib(end.rss) - mib(warm.rss);
    const double heap_growth_kib =
        (static_cast<double>(end.heap) - static_cast<double>(warm.heap)) / 1024;
    std::printf(
        "SOAK rank %d: after warm-up -> end: fds %zu -> %zu, threads %zu -> %zu, rss %.1f -> %.1f "
        "MiB (%+.2f, bound +%.0f), heap %.1f -> %.1f KiB (%+.1f, bound +%.0f)\n",
        rank, warm.fds, end.fds, warm.threads, end.threads, mib(warm.rss), mib(end.rss), rss_growth,
        args.rss_bound_mib, static_cast<double>(warm.heap) / 1024,
        static_cast<double>(end.heap) / 1024, heap_growth_kib, args.heap_bound_kib);
    std::printf(
        "SOAK rank %d: rss parts after warm-up -> end: anon %.1f -> %.1f, file %.1f -> "
        "%.1f, shmem %.1f -> %.1f MiB\n",
        rank, mib(warm.parts.anon), mib(end.parts.anon), mib(warm.parts.file), mib(end.parts.file),
        mib(warm.parts.shmem), mib(end.parts.shmem));
    if (end.fds != warm.fds) fail("descriptors changed between the warm-up and the end");
    if (end.threads != warm.threads) fail("threads changed between the warm-up and the end");
    if (rss_growth > args.rss_bound_mib) fail("RSS grew past its bound");
    if (heap_growth_kib > args.heap_bound_kib) fail("heap in use grew past its bound");
    // Every rank has printed its results before any can exit: ringrun stops the job when a rank
    // exits non-zero, which would otherwise cut off the lines of ranks still printing.
    try {
      comm.barrier();
    } catch (const std::exception& e) {
      std::printf("FAIL rank %d: the final barrier: %s\n", rank, e.what());
      return 1;
    }
  }
  const Snapshot after = Snapshot::take();
  std::printf(
      "SOAK rank %d: before the communicator -> after destroying it: fds %zu -> %zu, "
      "threads %zu -> %zu\n",
      rank, before.fds, after.fds, before.threads, after.threads);
  if (after.fds != before.fds) fail("descriptors left after destroying the communicator");
  if (after.threads != before.threads) fail("threads left after destroying the communicator");
  std::printf("SOAK rank %d: %s\n", rank, ok ? "OK" : "FAILED");
  return ok ? 0 : 1;
}
