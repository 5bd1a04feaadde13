// Allreduce in registered memory on one host (Communicator::alloc; NCCL's registered user
// buffers): when every rank's input and output lie in memory every peer has mapped
// (transport::Window's regions), rank r reduces its 1/N slice by reading it straight out of all N
// inputs and writes the result straight into all N outputs. Nothing is staged: each rank reads K
// bytes and writes K bytes (the DRAM traffic of an allreduce's floor, 2 K per rank), where the
// ring moves every byte through FIFO slots that the next core must pull out of this one's cache
// (four passes of K/2 per rank at N = 2) and the direct allreduce copies each input into the
// window first.
//
// Per call, rank r:
//   handshake: writes where its input and output are (region and offset, or none) beside a stamp
//              and the op's fingerprint, and waits for every peer's;
//   reduce:    if every rank's buffers are registered, combines slice r of the N inputs (in rank
//              order, in chunks that stay in L1/L2) and copies each chunk into every output;
//              a large call is instead cut into units that ranks take as they come free
//              (claim_unit below), each from its own range first, so that a slow or descheduled
//              core holds no one up;
//              streaming stores for an output that is not its rank's input and is larger than
//              the caches (its lines are not cached; in place, the lines were just read);
//   done:      stamps "done" and waits for every peer's: only then has every peer finished
//              writing into this rank's output and reading its input, and the call may return.
// If some rank's buffers are not registered (a rank passed other memory), every rank sees it in
// the handshake and runs the tuner's choice without this algorithm instead (Context::fallback,
// the same on every rank), so the ranks never disagree and plain buffers lose nothing but the
// handshake.
//
// Each slice (or unit) is reduced by one rank, in rank order, so every rank gets the same bits,
// and the same as the direct allreduce's. In place, the rank that reduces a slice is the only one
// to read or write it in any buffer, so no rank's writes race another's reads.
//
// The stamps live in one page of each rank's window region (window_areas.h): a counter of
// registered calls g (the same on every rank: every rank runs the same calls, each counted once
// whether it reduced or fell back), two sets of lines used alternately (set g % 2), each a "ready"
// line (stamp g + 1 stored with release after the fingerprint and the buffers' places) and a "done"
// line. Reuse guard: a rank rewrites set b in call g + 2, after call g + 1's handshake saw every
// peer's ready(g + 1), which each peer stamped only after finishing call g (both of its reads of
// this rank's set b). Equality waits cannot miss their value for the same reason. Each rank's page
// also holds the counter of its range of a large call's units (taken()), tagged with the call it
// counts for, so a count left by an earlier call reads as none taken.
//
// After an error (a peer's death, a timeout) a peer may still be writing this rank's output for a
// moment: a failed call's output is undefined, as with any algorithm, and the memory stays mapped
// until it is freed, so nothing outside it is touched.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/peer_wait.h"
#include "algorithms/ring_schedule.h"
#include "algorithms/window_areas.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {
namespace {

// Reduced per step: the result of one chunk stays in L1/L2 while it is copied into N outputs.
constexpr size_t kRegisteredChunkBytes = 32 << 10;
// From here the tuner takes a registered call: below, the flat allreduce's copies through the
// window cost less than a second handshake. Forced sweeps, in-place us, registered / the
// tuner's usual choice: N = 2 16 KiB 1.72 / 2.83 (flat), 4 KiB 1.11 / 1.28; N = 4 64 KiB 28.6 /
// 32.9 (direct), 16 KiB 27.5 / 16.5 (flat); N = 8 64 KiB 95.9 / 101.9, 16 KiB 76.1 / 48.1.
constexpr size_t kRegisteredMinBytes = 64 << 10;
constexpr size_t kRegisteredMinBytesTwoRanks = 16 << 10;

using Region = transport::Window::Region;

struct Stamps {
  char* base;
  uint64_t* word(size_t line) const { return reinterpret_cast<uint64_t*>(base + 64 * line); }
  // Read and written by the owner only: the registered calls run so far.
  uint64_t& calls() const { return *word(0); }
  std::atomic_ref<uint64_t> ready(size_t b) const { return std::atomic_ref(*word(1 + 2 * b)); }
  // Beside the ready stamp: the fingerprint, then the input's and the output's region and offset.
  std::atomic_ref<uint64_t> field(size_t b, size_t i) const {
    return std::atomic_ref(word(1 + 2 * b)[1 + i]);
  }
  std::atomic_ref<uint64_t> done(size_t b) const { return std::atomic_ref(*word(2 + 2 * b)); }
  // The units of this rank's range of a large call taken so far, by any rank (take_unit()).
  std::atomic_ref<uint64_t> taken() const { return std::atomic_ref(*word(5)); }
};
static_assert(6 * 64 <= window_areas::kRegisteredBytes);

// Large calls are cut into units that ranks take as they come free, rather than one slice per
// rank: this VM's two cores run at speeds 1.2-1.5x apart for tenths of a second at a time (the
// host's doing; docs/PERFORMANCE.md, "Where a large N = 2 ring waits"), and with ranks sharing
// cores a rank may not run at all for a while; a static slice makes every call wait for the
// slowest. Each unit is still reduced by one rank, in rank order (the same bits), and its traffic
// is the same whoever takes it. A claim is one atomic on a line the ranks share (~0.1-0.3 us):
// units of at least kUnitBytes, about 16 per rank, keep that under 0.1% of the call; below
// kMinUnits units per rank the static slices are kept (the call is too short for the cores'
// speeds to drift, and every rank works from the first microsecond).
//
// Every rank takes the units of its own 1/N range first and only then those left in the others'
// ranges (its successors' first). Taken from one counter in buffer order, every rank touched
// every page of every buffer in each call: at N = 8, 256 MiB out of place that ran 2.5-3x slower
// than static slices on one host (docs/PERFORMANCE.md). The likeliest cost is the page walks:
// each process has its own page tables for the peers' regions, and N times the pages per call
// no longer fit the caches (the VM shows no TLB counters to confirm it).
constexpr size_t kUnitBytes = 256 << 10;
constexpr size_t kUnitsPerRank = 16;
constexpr size_t kMinUnitsPerRank = 4;
// Elements per unit (a multiple of a cache line's worth), or 0 for static slices.
size_t claim_unit(size_t count, size_t n, size_t elem) {
  const size_t bytes = count * elem;
  if (bytes < kMinUnitsPerRank * n * kUnitBytes) return 0;
  size_t unit = std::max(kUnitBytes, bytes / (kUnitsPerRank * n));
  unit = (unit + 63) / 64 * 64;
  return unit / elem;
}

// A range's counter holds the call it counts for (the low 40 bits of its number) above the units
// taken so far (24 bits; claim_unit gives a range about 16). A count tagged with another
// call is that call's leftover and reads as none taken: no rank can still be taking units of an
// earlier call, since every rank finished it before stamping this call's "ready".
constexpr unsigned kTakenBits = 24;
constexpr uint64_t kTakenMask = (uint64_t{1} << kTakenBits) - 1;
// Takes the next of `units` units from counter c for call `call`: its index in the range, or
// `units` when all are taken. A failed exchange means another rank took one, so this ends after
// at most `units` rounds.
size_t take_unit(std::atomic_ref<uint64_t> c, uint64_t call, size_t units) {
  const uint64_t tag = (call & ((uint64_t{1} << 40) - 1)) << kTakenBits;
  uint64_t v = c.load(std::memory_order_relaxed);
  for (;;) {
    const uint64_t taken = (v & ~kTakenMask) == tag ? v & kTakenMask : 0;
    if (taken >= units) return units;
    if (c.compare_exchange_strong(v, tag | (taken + 1), std::memory_order_relaxed))
      return static_cast<size_t>(taken);
  }
}

}  // namespace

bool registered_allreduce_applies(const CostInputs& in, size_t bytes) {
  return bytes >= (in.n == 2 ? kRegisteredMinBytesTwoRanks : kRegisteredMinBytes);
}

void registered_allreduce(Context& ctx, const Args& a) {
  if (trivial_reduction(ctx, a)) return;
  transport::Window& w = *ctx.transport.window();
  const int n = ctx.size, r = ctx.rank;
  const auto un = static_cast<size_t>(n);
  const size_t elem = dtype_size(a.dtype);
  const size_t bytes = a.count * elem;
  auto stamps = [&](int q) {
    return Stamps{(q == r ? w.mine() : const_cast<char*>(w.of(q))) +
                  window_areas::kRegisteredOffset};
  };
  const Stamps mine = stamps(r);
  const uint64_t g = mine.calls();
  const size_t b = g % 2;
  const uint64_t fp = w.fingerprint();

  ctx.phase("handshake");
  const Region in = w.find_region(a.send, bytes), out = w.find_region(a.recv, bytes);
  mine.field(b, 0).store(fp, std::memory_order_relaxed);
  mine.field(b, 1).store(in.id, std::memory_order_relaxed);
  mine.field(b, 2).store(in.offset, std::memory_order_relaxed);
  mine.field(b, 3).store(out.id, std::memory_order_relaxed);
  mine.field(b, 4).store(out.offset, std::memory_order_relaxed);
  mine.ready(b).store(g + 1, std::memory_order_release);
  w.notify();
  // Waits until every peer has stamped `stamp` of set b with g + 1.
  auto wait_all = [&](std::atomic_ref<uint64_t> (Stamps::*stamp)(size_t) const, bool check_fp) {
    wait_all_peers(ctx, w, [&](int q) {
      return [&w, q, g, fp, h = stamps(q), b, stamp, check_fp] {
        if ((h.*stamp)(b).load(std::memory_order_acquire) != g + 1) return false;
        if (check_fp && h.field(b, 0).load(std::memory_order_relaxed) != fp) w.mismatch(q);
        return true;
      };
    });
  };
  wait_all(&Stamps::ready, true);
  mine.calls() = g + 1;
  w.note_all_reached(ctx.seq);  // every peer has begun this op

  // Every rank's input and output, as mapped here; and whether each output takes streaming
  // stores.
  std::vector<const char*> ins(un);
  std::vector<char*> outs(un);
  std::vector<uint8_t> stream(un);
  const bool large = bytes >= reduce::stream_output_threshold();
  for (int q = 0; q < n; ++q) {
    const Stamps h = stamps(q);
    const Region qin{static_cast<uint32_t>(h.field(b, 1).load(std::memory_order_relaxed)),
                     h.field(b, 2).load(std::memory_order_relaxed)};
    const Region qout{static_cast<uint32_t>(h.field(b, 3).load(std::memory_order_relaxed)),
                      h.field(b, 4).load(std::memory_order_relaxed)};
    if (qin.id == Region::kNone || qout.id == Region::kNone) {
      ctx.phase("fallback: a rank's buffers are not registered");
      return (ctx.fallback ? ctx.fallback : ring_allreduce)(ctx, a);
    }
    const auto uq = static_cast<size_t>(q);
    ins[uq] = w.region_of(q, qin);
    outs[uq] = w.region_of(q, qout);
    stream[uq] = large && ins[uq] != outs[uq];
  }

  ctx.phase("reduce");
  const size_t per = kRegisteredChunkBytes / elem;
  char* tmp = static_cast<char*>(ctx.scratch(kRegisteredChunkBytes));
  // Elements [begin, end) of every output: reduced from every input, chunk by chunk.
  auto reduce_range = [&](size_t begin, size_t end) {
    for (size_t done = begin; done < end; done += per) {
      const size_t c = end - done < per ? end - done : per;
      const size_t at = done * elem;
      reduce::combine(tmp, ins[0] + at, ins[1] + at, c, a.dtype, a.op);
      for (size_t q = 2; q < un; ++q) reduce::combine(tmp, tmp, ins[q] + at, c, a.dtype, a.op);
      if (a.op == ReduceOp::avg) reduce::divide(tmp, tmp, c, a.dtype, static_cast<uint64_t>(n));
      // Our own output last: the peers' first, so that they can finish sooner.
      for (int i = 1; i <= n; ++i) {
        const auto q = static_cast<size_t>((r + i) % n);
        reduce::copy(outs[q] + at, tmp, c * elem, stream[q] != 0);
      }
    }
  };
  if (const size_t unit = claim_unit(a.count, un, elem); unit == 0) {
    const Range slice = split(a.count, un, static_cast<size_t>(r));
    reduce_range(slice.offset, slice.offset + slice.count);
  } else {
    // Range q is units [q * per, (q + 1) * per) (the last ones may be short or empty).
    const size_t units = (a.count + unit - 1) / unit, per = (units + un - 1) / un;
    for (size_t i = 0; i < un; ++i) {
      const size_t q = (static_cast<size_t>(r) + i) % un;
      const size_t first = std::min(units, q * per),
                   in_range = std::min(units, first + per) - first;
      const std::atomic_ref<uint64_t> counter = stamps(static_cast<int>(q)).taken();
      for (size_t k; (k = take_unit(counter, g + 1, in_range)) < in_range;) {
        const size_t begin = (first + k) * unit;
        reduce_range(begin, std::min(a.count, begin + unit));
      }
    }
  }

  ctx.phase("done");
  mine.done(b).store(g + 1, std::memory_order_release);  // copy's streaming stores are fenced
  w.notify();
  wait_all(&Stamps::done, false);
}

}  // namespace ringreduce::algorithms
