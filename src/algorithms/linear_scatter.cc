// Linear scatter: the root sends each rank its block straight, all at once; the others receive
// one message (gloo's and MPICH's short-message scatter, the mirror of linear_gather).
#include <cstring>

#include "algorithms/algorithm.h"

namespace ringreduce::algorithms {

void linear_scatter(Context& ctx, const Args& a) {
  const size_t bytes = a.count * dtype_size(a.dtype);
  const char* in = static_cast<const char*>(a.send);
  char* out = static_cast<char*>(a.recv);
  if (ctx.rank != a.root) {
    if (bytes == 0) return;
    transport::Completion done;
    ctx.link(a.root).recv(out, bytes, &done);
    ctx.wait(done);
    return;
  }
  const char* mine = in + static_cast<size_t>(ctx.rank) * bytes;
  if (mine != out && bytes > 0) std::memmove(out, mine, bytes);
  if (bytes == 0) return;
  transport::Completion done;
  for (int q = 0; q < ctx.size; ++q)
    if (q != ctx.rank) ctx.link(q).send(in + static_cast<size_t>(q) * bytes, bytes, &done);
  ctx.wait(done);
}

}  // namespace ringreduce::algorithms
