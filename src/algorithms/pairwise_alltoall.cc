// Pairwise-exchange alltoall: at step s rank r sends its block for rank r+s and receives the block
// from rank r-s. Every pair has its own connection, so all steps are posted at once and the
// transport overlaps them; the step order keeps every rank's first messages going to distinct
// peers.
#include <cstring>

#include "algorithms/algorithm.h"

namespace ringreduce::algorithms {

void pairwise_alltoall(Context& ctx, const Args& a) {
  const int n = ctx.size, r = ctx.rank;
  const size_t block = a.count * dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  const size_t mine = static_cast<size_t>(r) * block;
  if (block > 0) std::memmove(out + mine, in + mine, block);
  if (n == 1 || block == 0) return;

  transport::Completion done;
  for (int s = 1; s < n; ++s) {
    const int to = (r + s) % n, from = (r - s + n) % n;
    ctx.link(to).send(in + static_cast<size_t>(to) * block, block, &done);
    ctx.link(from).recv(out + static_cast<size_t>(from) * block, block, &done);
  }
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
