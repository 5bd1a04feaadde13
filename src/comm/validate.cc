// How an op is named in errors (describe) and what a call's arguments must be before it is
// issued (validate): both run on the caller's thread, before the op has a place in the queue.
// Apart from comm_impl.cc, which runs the queue, since neither touches its state.
#include <cstdio>
#include <sstream>

#include "comm/comm_impl.h"
#include "comm/errors.h"

namespace ringreduce::detail {

using algorithms::Collective;

std::string CommImpl::describe(const transport::OpTag& t) const {
  // A peer's tag: its kind may be none we know.
  const algorithms::CollectiveFacts* f = algorithms::find_facts(static_cast<Collective>(t.kind));
  std::ostringstream s;
  s << (f ? f->name : "op") << " #" << t.seq;
  if (!f || f->send_blocks != algorithms::Blocks::none) {
    s << " (" << dtype_name(static_cast<DataType>(t.dtype));
    // The "v" collectives: alltoallv's tag carries no count (each rank's counts are its own);
    // allgatherv's and reduce_scatterv's carry their total and a digest of the blocks, shown
    // short so that two calls that split the same total differently read differently.
    const bool uneven = f && (f->send_blocks == algorithms::Blocks::all_blocks ||
                              f->recv_blocks == algorithms::Blocks::all_blocks);
    if (!uneven || t.count > 0) s << " x " << t.count;
    if (uneven) s << " in uneven blocks";
    if (uneven && t.reserved2 != 0) {
      char digest[8];
      std::snprintf(digest, sizeof digest, "%04x", static_cast<unsigned>(t.reserved2 & 0xffff));
      s << ", counts #" << digest;
    }
    if (f && f->has_op) s << ", " << op_name(static_cast<ReduceOp>(t.op));
    if (f && f->has_root) s << ", root " << t.root;
    if (t.wire != 0) s << ", wire " << wire_name(static_cast<Wire>(t.wire));
    s << ")";
  }
  return s.str();
}

void CommImpl::validate(const OpState& op) const {
  using algorithms::Blocks;
  using algorithms::Holder;
  using algorithms::InPlace;
  const algorithms::Args& a = op.args;
  auto bad = [&](const std::string& why) {
    throw InvalidArgument("rank " + std::to_string(rank_) + ": " + describe(op.tag) + ": " + why);
  };
  const algorithms::CollectiveFacts* f = algorithms::find_facts(a.kind);
  if (!f) bad("unknown collective");
  if (static_cast<int>(a.dtype) >= kNumDataTypes) bad("unknown data type");
  if (static_cast<int>(a.op) >= kNumReduceOps) bad("unknown reduce op");
  if (f->has_op && !op_applies(a.op, a.dtype))
    bad(std::string(op_name(a.op)) + " does not apply to " + dtype_name(a.dtype) +
        " (band, bor, bxor: integers and bool; premul_sum: floating point; avg: all but bool)");
  if (op.wire_requested && *op.wire_requested != Wire::none) {
    if (static_cast<int>(*op.wire_requested) >= kNumWires) bad("unknown wire format");
    if (!tuner::Tuner::wire_applies(a))
      bad(std::string("wire format ") + wire_name(*op.wire_requested) +
          " applies to float32 allreduce, reduce_scatter and allgather (reducing by sum, avg or "
          "premul_sum), not to this call");
  }
  if (f->has_root && (a.root < 0 || a.root >= size_))
    bad("root " + std::to_string(a.root) + " is not a rank of this communicator (0.." +
        std::to_string(size_ - 1) + ")");
  const size_t elem = dtype_size(a.dtype);
  if (a.count > (SIZE_MAX / elem) / static_cast<size_t>(size_)) bad("count is too large");
  // Blocks of their own sizes: one per rank, and their total within reach.
  const bool uneven = f->send_blocks == Blocks::own || f->send_blocks == Blocks::all_blocks;
  if (uneven) {
    auto check_counts = [&](const std::vector<size_t>& v, const char* name) {
      if (v.size() != static_cast<size_t>(size_))
        bad(std::string(name) + " has " + std::to_string(v.size()) +
            " entries, not one per rank (" + std::to_string(size_) + ")");
      size_t total = 0;
      for (size_t c : v) {
        if (c > SIZE_MAX / elem - total) bad(std::string(name) + " add up to too many elements");
        total += c;
      }
    };
    check_counts(a.counts, a.kind == Collective::alltoallv ? "send counts" : "counts");
    if (a.kind == Collective::alltoallv) {
      check_counts(a.recv_counts, "recv counts");
      const auto me = static_cast<size_t>(rank_);
      if (a.counts[me] != a.recv_counts[me])
        bad("this rank sends itself " + std::to_string(a.counts[me]) + " elements but receives " +
            std::to_string(a.recv_counts[me]) + " from itself");
    }
  }
  auto here = [&](Holder h) {
    return h == Holder::all || (h == Holder::root) == (rank_ == a.root);
  };
  const bool sends = f->send_blocks != Blocks::none && here(f->send_on);
  const bool recvs = f->recv_blocks != Blocks::none && here(f->recv_on);
  auto elements = [&](Blocks b, bool recv_side) -> size_t {
    switch (b) {
      case Blocks::none:
        return 0;
      case Blocks::one:
        return a.count;
      case Blocks::per_rank:
        return a.count * static_cast<size_t>(size_);
      case Blocks::own:
        return a.counts[static_cast<size_t>(rank_)];
      case Blocks::all_blocks: {
        size_t n = 0;
        for (size_t c : recv_side&& a.kind == Collective::alltoallv ? a.recv_counts : a.counts)
          n += c;
        return n;
      }
    }
    return 0;
  };
  if (sends && elements(f->send_blocks, false) > 0 && a.send == nullptr) bad("send buffer is null");
  if (recvs && elements(f->recv_blocks, true) > 0 && a.recv == nullptr)
    bad("receive buffer is null");
  if (size_ > 1 && (a.count > 0 || uneven) && sends && recvs && a.send == a.recv) {
    if (f->in_place == InPlace::never)
      bad(std::string(f->name) + " cannot run in place (send and receive buffers are the same)");
    // In place means the one-block buffer is block `rank` of the per-rank one (NCCL's
    // convention); the same address would overwrite block 0 while it may still be on its way.
    // (Where the blocks before this rank's are all empty, its block starts at the same address.)
    size_t before = static_cast<size_t>(rank_) * a.count;
    if (uneven) {
      before = 0;
      for (int q = 0; q < rank_; ++q) before += a.counts[static_cast<size_t>(q)];
    }
    if (f->in_place == InPlace::offset && before != 0) {
      const bool send_is_whole =
          f->send_blocks == Blocks::per_rank || f->send_blocks == Blocks::all_blocks;
      const std::string whole = send_is_whole ? "send" : "recv",
                        part = send_is_whole ? "recv" : "send";
      const std::string offset = uneven          ? "the blocks before this rank's"
                                 : send_is_whole ? "rank * recv_count"
                                                 : "rank * send_count";
      bad(std::string(f->name) + " in place needs " + part + " = " + whole + " + " + offset +
          ", not " + part + " = " + whole);
    }
  }
}

}  // namespace ringreduce::detail
