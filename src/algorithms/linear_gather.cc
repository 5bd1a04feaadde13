// Linear gather: every rank sends its block straight to the root, which receives the N-1 blocks at
// once, each into its place (gloo's and MPICH's short-message gather; on one host every pair has
// its own FIFO, across hosts its own connection, so the blocks arrive side by side).
#include <cstring>

#include "algorithms/algorithm.h"

namespace ringreduce::algorithms {

void linear_gather(Context& ctx, const Args& a) {
  const size_t bytes = a.count * dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  if (ctx.rank != a.root) {
    if (bytes == 0) return;
    transport::Completion done;
    ctx.link(a.root).send(in, bytes, &done);
    ctx.wait(done);
    return;
  }
  char* mine = out + static_cast<size_t>(ctx.rank) * bytes;
  if (mine != in && bytes > 0) std::memmove(mine, in, bytes);
  if (bytes == 0) return;
  transport::Completion done;
  for (int q = 0; q < ctx.size; ++q)
    if (q != ctx.rank) ctx.link(q).recv(out + static_cast<size_t>(q) * bytes, bytes, &done);
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
