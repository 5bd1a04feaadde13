// Pairwise-exchange alltoall: at step s rank r sends its block for rank r+s and receives the block
// from rank r-s. Every pair has its own connection, so all steps are posted at once and the
// transport overlaps them; the step order keeps every rank's first messages going to distinct
// peers. alltoallv's blocks of their own sizes go the same way (send block j: counts[j] elements,
// receive block j: recv_counts[j], each laid out one after another).
#include <cstring>

#include "algorithms/algorithm.h"
#include "algorithms/ring_phases.h"

namespace ringreduce::algorithms {

void pairwise_alltoall(Context& ctx, const Args& a) {
  const int n = ctx.size, r = ctx.rank;
  const size_t elem = dtype_size(a.dtype);
  const bool uneven = !a.counts.empty();
  const std::vector<size_t> send_off = uneven ? offsets_of(a.counts) : std::vector<size_t>{};
  const std::vector<size_t> recv_off = uneven ? offsets_of(a.recv_counts) : std::vector<size_t>{};
  // Byte offset and size of the block for (or from) rank q.
  auto sent = [&](int q) -> Range {
    const auto j = static_cast<size_t>(q);
    return uneven ? Range{send_off[j] * elem, a.counts[j] * elem}
                  : Range{j * a.count * elem, a.count * elem};
  };
  auto received = [&](int q) -> Range {
    const auto j = static_cast<size_t>(q);
    return uneven ? Range{recv_off[j] * elem, a.recv_counts[j] * elem}
                  : Range{j * a.count * elem, a.count * elem};
  };
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  // Our own block (the communicator checked that both sides of it agree in size).
  const Range own = sent(r);
  if (own.count > 0) std::memmove(out + received(r).offset, in + own.offset, own.count);
  if (n == 1 || (!uneven && a.count == 0)) return;

  transport::Completion done;
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    const Range out_block = sent(to), in_block = received(from);
    ctx.link(to).send(in + out_block.offset, out_block.count, &done);
    ctx.link(from).recv(out + in_block.offset, in_block.count, &done);
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
