// Direct allreduce on one host: a reduce-scatter in which every rank reduces its 1/N slice by
// reading all N ranks' copies of it out of the shared window (transport/link.h), then an
// allgather in which every rank copies each reduced slice out of its owner's window. Where the
// ring passes every byte through 2(N-1) steps, each through a FIFO slot, here a rank reads each
// staged byte once and synchronises twice per round, whatever N.
//
// The buffer is cut into N slices as the ring cuts it into chunks (split(): the first count % N
// slices one element longer; slices may be empty), and the slices are processed in rounds of at
// most `piece` bytes each: round k covers elements [k p, (k+1) p) of every slice. Per round, rank
// r:
//   stage:  copies its input's piece of every slice j != r into slot j of its staging buffer and
//           stamps "staged" (rank j reads slot j of every rank);
//   reduce: waits until every peer has staged, combines the N pieces of slice r in rank order
//           (in_0 op in_1 op ... in_{N-1}; our own piece straight from the input) into slot r of
//           its buffer, divides for avg, copies the result to the output and stamps "reduced";
//   gather: copies every peer q's reduced piece (slot q of q's buffer) to the output as soon as q
//           has stamped it.
// Rank r posts stage(k+1) between reduce(k) and gather(k): staging the next round fills the time
// the slowest peer still takes to reduce this one. Each slice is reduced by one rank only, so all
// ranks get its bits; the fixed order keeps them the same from run to run.
//
// Layout of a rank's direct area (window bytes [kAreaOffset, end), after the flat collectives'
// two areas and the registered allreduce's page: window_areas.h): a 4 KiB header (below), then two
// buffers of N slots of `piece` bytes. Round number g counts every direct round this communicator
// has run (the same on every rank: ranks run the same ops, and a direct op's round count depends
// only on N, count and dtype), so stamps never repeat and consecutive rounds, across ops too,
// alternate buffers: round g uses buffer g % 2. Its stamps hold g + 1, stored with release after
// the data; readers wait for equality. The window's fingerprint of the op is stored beside every
// staged stamp, and a reader that finds another one there (a peer in another call at the same
// round, e.g. another count) throws the MismatchError; a peer in another kind of call never stamps,
// and the window's wait names it.
//
// Reuse guard: round g rewrites buffer b = g % 2, last written in round g - 2 (of this op or an
// earlier direct op; other algorithms never touch the direct area). Every peer is done with
// round g - 2's data by then, and this rank has seen the proof:
//   - staging slots j != r were read by rank j in reduce(g-2), which it finished before stamping
//     reduced(g-2); our gather(g-2), which precedes stage(g), waited for every peer's reduced
//     stamp of round g - 2;
//   - slot r (our result) was read by every peer in gather(g-2); a peer stages round g only after
//     that (its order: gather(g-2), reduce(g-1), stage(g)), and we write slot r in reduce(g) only
//     after every peer's staged stamp of round g. (Our gather(g-1) proves it as well: a peer
//     stamps reduced(g-1) after its gather(g-2).)
// Nothing else guards the area, so ops in between (flat, ring, rooted ones whose root races
// ahead) change nothing. Equality waits cannot miss their value: a peer overwrites staged(g) with
// staged(g+2) only after its reduce(g+1), which needs our staged(g+1), stamped after our
// reduce(g) read staged(g); and reduced(g) with reduced(g+2) only after our staged(g+2), stamped
// after our gather(g).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <vector>

#include "algorithms/algorithm.h"
#include "algorithms/flat_window.h"
#include "algorithms/peer_wait.h"
#include "algorithms/ring_schedule.h"
#include "reduce/reduce.h"

namespace ringreduce::algorithms {
namespace {

// After the flat collectives' areas and the registered allreduce's page (window_areas.h).
constexpr size_t kAreaOffset = window_areas::kDirectOffset;
constexpr size_t kHeaderBytes = 4096;
// Largest piece of a slice per round; 2 N pieces must fit the area (N = 4: 236 KiB, N = 8:
// 116 KiB). Interleaved medians of 3 rounds at N = 2, 1-4 MiB (in-place busbw): 256 KiB 6.1
// GB/s, 128 KiB 4.2, 512 KiB (476 KiB) 5.5-5.9; at N = 4 within noise of each other.
constexpr size_t kMaxPiece = 256 << 10;

// The header's words, each stamp on its own cache line (peers poll them while the owner writes
// the next one).
struct Header {
  char* base;
  uint64_t* word(size_t line) const { return reinterpret_cast<uint64_t*>(base + 64 * line); }
  // Read and written by the owner only: the rounds run so far.
  uint64_t& rounds() const { return *word(0); }
  std::atomic_ref<uint64_t> staged(size_t b) const { return std::atomic_ref(*word(1 + 2 * b)); }
  std::atomic_ref<uint64_t> fingerprint(size_t b) const {
    return std::atomic_ref(*(word(1 + 2 * b) + 1));
  }
  std::atomic_ref<uint64_t> reduced(size_t b) const { return std::atomic_ref(*word(2 + 2 * b)); }
};

// Bytes of each slot: the largest multiple of 4 KiB (64 bytes when that small) such that two
// buffers of n slots fit the area; 0 when not even 64 bytes do. Every dtype divides it.
size_t piece_bytes(size_t window_bytes, int n) {
  if (window_bytes < kAreaOffset + kHeaderBytes) return 0;
  const size_t fit = (window_bytes - kAreaOffset - kHeaderBytes) / (2 * static_cast<size_t>(n));
  if (fit >= kMaxPiece) return kMaxPiece;
  return fit >= 4096 ? fit / 4096 * 4096 : fit / 64 * 64;
}

}  // namespace

// Cost: per round of one piece of each slice, two steps (staged, reduced). A rank copies its input
// into its staging buffer (one local copy: beta / 2, as flat's publish), reads the N-1 peers'
// copies of its own slice and combines them, and copies the N-1 other reduced slices out of
// their owners' windows. Those 2 (N-1)/N K bytes read from other cores cost 3/4 beta each:
// between flat's beta / 2 (a few KiB, cache to cache) and a message's beta, because direct
// streams the whole buffer through the window. Fitted to the forced-algorithm sweeps at N = 2, 4,
// 8 (docs/TUNING.md): it puts direct ahead of the ring from 16 KiB to about 1 MiB at N = 4 and 8
// and level with it at N = 2, as measured, and behind it from a few MiB.
double direct_allreduce_cost(const CostInputs& in, double k, double /*segment*/) {
  const int n = in.n;
  if (n <= 1) return 0;
  const Costs& c = in.costs;
  // The pieces of a 2 MiB window (shared memory's), as piece_bytes() cuts it, unrounded.
  const double piece =
      std::min(256.0 * 1024,
               static_cast<double>((size_t{2} << 20) - kAreaOffset - kHeaderBytes) / (2.0 * n));
  const double rounds = std::max(1.0, std::ceil(k / n / piece));
  const double others = (n - 1) * (k / n);
  return 2 * rounds * c.link.alpha + k * c.link.beta / 2 + others * (1.5 * c.link.beta + c.gamma);
}

void direct_allreduce(Context& ctx, const Args& a) {
  const size_t elem = dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const int n = ctx.size, r = ctx.rank;
  if (trivial_reduction(ctx, a)) return;
  transport::Window& w = *ctx.transport.window();
  const size_t piece = piece_bytes(w.bytes(), n);
  if (piece == 0) return ring_allreduce(ctx, a);  // tens of thousands of ranks: no room
  const size_t per = piece / elem;                // elements per slot
  const auto un = static_cast<size_t>(n);
  const size_t rounds = (split(a.count, un, 0).count + per - 1) / per;  // slice 0 is the longest

  auto header = [&](int q) {
    return Header{(q == r ? w.mine() : const_cast<char*>(w.of(q))) + kAreaOffset};
  };
  // Slot j of buffer b in rank q's area.
  auto slot = [&](int q, size_t b, int j) {
    return header(q).base + kHeaderBytes + (b * un + static_cast<size_t>(j)) * piece;
  };
  // Round k's piece of slice j: element offset into the buffer and count (possibly 0).
  auto piece_of = [&](int j, size_t k) {
    const Range s = split(a.count, un, static_cast<size_t>(j));
    const size_t begin = k * per < s.count ? k * per : s.count;
    const size_t end = begin + per < s.count ? begin + per : s.count;
    return Range{s.offset + begin, end - begin};
  };

  const Header mine = header(r);
  const uint64_t first = mine.rounds();
  const uint64_t fp = w.fingerprint();

  auto stage = [&](size_t k) {
    const uint64_t g = first + k;
    const size_t b = g % 2;
    for (int j = 0; j < n; ++j) {
      if (j == r) continue;
      const Range p = piece_of(j, k);
      if (p.count > 0) std::memcpy(slot(r, b, j), in + p.offset * elem, p.count * elem);
    }
    mine.fingerprint(b).store(fp, std::memory_order_relaxed);
    mine.staged(b).store(g + 1, std::memory_order_release);
    w.notify();
  };

  // Waits until every peer has stamped staged(g), checking that it did so in this call.
  auto wait_staged = [&](uint64_t g) {
    const size_t b = g % 2;
    wait_all_peers(ctx, w, [&](int q) {
      return [&w, q, g, fp, h = header(q), b] {
        if (h.staged(b).load(std::memory_order_acquire) != g + 1) return false;
        if (h.fingerprint(b).load(std::memory_order_relaxed) != fp) w.mismatch(q);
        return true;
      };
    });
  };

  auto reduce_own = [&](size_t k) {
    const uint64_t g = first + k;
    const size_t b = g % 2;
    wait_staged(g);
    // Every peer has begun this op: a later flat op's reuse guard need not wait.
    if (k == 0) w.note_all_reached(ctx.seq);
    const Range p = piece_of(r, k);
    if (p.count > 0) {
      auto input = [&](int q) -> const char* {
        return q == r ? in + p.offset * elem : slot(q, b, r);
      };
      // Written only now: every peer's staged(g) says it is done with round g - 2's result.
      char* result = slot(r, b, r);
      reduce::combine(result, input(0), input(1), p.count, a.dtype, a.op);
      for (int q = 2; q < n; ++q) reduce::combine(result, result, input(q), p.count, a.dtype, a.op);
      if (a.op == ReduceOp::avg)
        reduce::divide(result, result, p.count, a.dtype, static_cast<uint64_t>(n));
      std::memcpy(out + p.offset * elem, result, p.count * elem);
    }
    mine.reduced(b).store(g + 1, std::memory_order_release);
    w.notify();
  };

  // Copies each peer's reduced piece as soon as that peer has stamped it, in any order.
  std::vector<uint8_t> copied(un);
  auto gather = [&](size_t k) {
    const uint64_t g = first + k;
    const size_t b = g % 2;
    std::fill(copied.begin(), copied.end(), 0);
    copied[static_cast<size_t>(r)] = 1;
    int left = n - 1;
    auto copy_ready = [&] {
      for (int i = 1; i < n; ++i) {
        const int q = (r + i) % n;  // peers in a rotated order, so that ranks spread their reads
        if (copied[static_cast<size_t>(q)] ||
            header(q).reduced(b).load(std::memory_order_acquire) != g + 1)
          continue;
        const Range p = piece_of(q, k);
        if (p.count > 0) std::memcpy(out + p.offset * elem, slot(q, b, q), p.count * elem);
        copied[static_cast<size_t>(q)] = 1;
        --left;
      }
      return left == 0;
    };
    while (!copy_ready()) {
      // Blame, on a timeout, the first peer not yet copied; while ranks outnumber cores, one
      // that needs this core (the window then gives it up at once, see peer_wait.h).
      int q = (r + 1) % n;
      while (copied[static_cast<size_t>(q)]) q = (q + 1) % n;
      for (int i = 0; i < n && !w.shares_core(q); ++i)
        if (!copied[static_cast<size_t>(i)] && w.shares_core(i)) q = i;
      auto any = [&] {
        for (int i = 0; i < n; ++i)
          if (!copied[static_cast<size_t>(i)] &&
              header(i).reduced(b).load(std::memory_order_acquire) == g + 1)
            return true;
        return false;
      };
      w.wait(any, q, ctx.deadline);
    }
  };

  stage(0);
  for (size_t k = 0; k < rounds; ++k) {
    reduce_own(k);
    if (k + 1 < rounds) stage(k + 1);
    gather(k);
  }
  mine.rounds() = first + rounds;
}

}  // namespace ringreduce::algorithms
