// Staging device buffers through page-locked host memory (device.h).
#include "comm/device.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "algorithms/collectives.h"
#include "comm/comm_impl.h"
#include "reduce/cuda/reduce_cuda.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {
namespace {

// Staging regions start on their own cache lines (and keep a vector load's alignment).
constexpr size_t kAlign = 64;
size_t align_up(size_t n) {
  return (n + kAlign - 1) / kAlign * kAlign;
}

}  // namespace

// ---- StagingPool -----------------------------------------------------------------------------

StagingPool::Slot* StagingPool::acquire(size_t bytes) {
  std::lock_guard<std::mutex> lk(mu_);
  Slot* best = nullptr;
  for (auto& s : slots_)
    if (!s->busy && s->bytes >= bytes && (!best || s->bytes < best->bytes) && s->done->done())
      best = s.get();
  if (!best) {
    // Free slots too small for this call would only grow the pool: a new, larger one replaces
    // them (the pool holds at most what the ops in flight at once need).
    std::erase_if(slots_, [&](const std::unique_ptr<Slot>& s) {
      return !s->busy && s->bytes < bytes && s->done->done();
    });
    auto s = std::make_unique<Slot>();
    s->bytes = std::max<size_t>(align_up(bytes), 64 << 10);
    s->memory = runtime_.host_memory(kFlagBytes + s->bytes);
    s->done = runtime_.event();
    std::atomic_ref<uint32_t>(*s->flag()).store(0, std::memory_order_release);
    best = s.get();
    slots_.push_back(std::move(s));
  }
  best->busy = true;
  ++best->generation;
  if (best->generation == 0) best->generation = 1;  // 0 is the flag's value before any release
  return best;
}

StagingPool::~StagingPool() {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (auto& s : slots_) {
    try {
      while (!s->done->done() && std::chrono::steady_clock::now() < until)
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    } catch (...) {
      // A failed stream has stopped copying: the memory can go.
    }
  }
  if (have_side_) runtime_.destroy_stream(side_);
}

void* StagingPool::side_stream() {
  std::lock_guard<std::mutex> lk(mu_);
  if (!have_side_) {
    side_ = runtime_.create_stream();
    have_side_ = true;
  }
  return side_;
}

void StagingPool::release(Slot* slot) {
  std::lock_guard<std::mutex> lk(mu_);
  slot->busy = false;
}

size_t StagingPool::slots() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slots_.size();
}

// ---- DeviceStage -----------------------------------------------------------------------------

namespace {

// The stream a call is ordered on: the caller's, or with CallOptions::side_stream the
// communicator's, which takes the call after what the caller's stream has so far (the caller's
// goes on at once; it waits only if it asks: Work::wait_output).
void* order_stream(const CallOptions& call, DeviceRuntime& runtime, StagingPool& pool) {
  if (!call.side_stream) return call.stream;
  auto begin = runtime.event();
  begin->record(call.stream);
  void* side = pool.side_stream();
  runtime.stream_wait(side, *begin);
  return side;
}

}  // namespace

DeviceStage::DeviceStage(const CallOptions& call, DeviceRuntime& runtime, StagingPool& pool)
    : runtime_(runtime), pool_(pool), stream_(order_stream(call, runtime, pool)), direct_(true) {
  // A slot of the pool for its flag only (the pool's smallest).
  slot_ = pool.acquire(0);
  inputs_.push_back(runtime.event());
  output_ = runtime.event();
  try {
    inputs_.back()->record(stream_);
    runtime.wait_value(stream_, slot_->flag(), slot_->generation);
    slot_->done->record(stream_);
    output_->record(stream_);
  } catch (...) {
    release();
    throw;
  }
}

bool DeviceStage::wanted(const algorithms::Args& args, const CallOptions& call) {
  switch (call.memory) {
    case Memory::host:
      return false;
    case Memory::device:
      return true;
    case Memory::automatic:
      break;
  }
  DeviceRuntime& rt = device_runtime();
  if (!rt.in_use()) return false;
  return (args.send && rt.is_device(args.send)) ||
         (args.recv && args.recv != args.send && rt.is_device(args.recv));
}

DeviceStage::DeviceStage(algorithms::Args& args, size_t send_bytes, size_t recv_bytes,
                         const CallOptions& call, DeviceRuntime& runtime, StagingPool& pool,
                         size_t piece_elems)
    : runtime_(runtime), pool_(pool), stream_(order_stream(call, runtime, pool)) {
  auto on_device = [&](const void* p, size_t bytes) {
    if (!p || bytes == 0) return false;
    return call.memory == Memory::device || runtime.is_device(p);
  };
  const auto* send = static_cast<const char*>(args.send);
  auto* recv = static_cast<char*>(args.recv);
  const bool send_dev = on_device(send, send_bytes), recv_dev = on_device(recv, recv_bytes);
  // One region for buffers that overlap (in place, or a block of the other as NCCL's in-place
  // convention has it), so that the host op sees the same placement; else one region each.
  const bool overlap = send_dev && recv_dev && send < recv + recv_bytes && recv < send + send_bytes;
  const char* lo = nullptr;
  size_t total = 0, recv_at = 0;
  if (overlap) {
    lo = std::min<const char*>(send, recv);
    total = static_cast<size_t>(
        std::max(send + send_bytes, const_cast<const char*>(recv) + recv_bytes) - lo);
  } else {
    total = send_dev ? align_up(send_bytes) : 0;
    recv_at = total;
    total += recv_dev ? recv_bytes : 0;
  }
  // Pieces only where both sides hold the call's elements alike (allreduce's send and recv).
  const size_t elem = dtype_size(args.dtype);
  size_t pieces = 1;
  if (piece_elems > 0 && piece_elems < args.count && send_bytes == recv_bytes &&
      send_bytes == args.count * elem) {
    pieces = (args.count + piece_elems - 1) / piece_elems;
    piece_elems_ = piece_elems;
  }
  for (size_t p = 0; p < pieces; ++p) inputs_.push_back(runtime.event());
  output_ = runtime.event();
  if (!send_dev && !recv_dev) {
    for (auto& e : inputs_) e->record(stream_);
    output_->record(stream_);
    released_ = true;  // nothing waits for this op on the stream
    return;
  }
  slot_ = pool.acquire(total);
  // The piece's releases take the generations from the slot's: the last is what release() stores.
  first_release_ = slot_->generation;
  slot_->generation += static_cast<uint32_t>(pieces - 1);
  char* base = slot_->data();
  char* host_send = nullptr;
  char* host_recv = nullptr;
  if (overlap) {
    host_send = base + (send - lo);
    host_recv = base + (recv - lo);
  } else {
    host_send = send_dev ? base : nullptr;
    host_recv = recv_dev ? base + recv_at : nullptr;
  }
  try {
    // Piece p's bytes of a buffer of `bytes`: (offset, length); the whole in one piece.
    auto part = [&](size_t p, size_t bytes) -> std::pair<size_t, size_t> {
      if (pieces == 1) return {0, bytes};
      const size_t from = p * piece_elems * elem;
      return {from, std::min(bytes - from, piece_elems * elem)};
    };
    for (size_t p = 0; p < pieces; ++p) {
      const auto [from, n] = part(p, send_bytes);
      if (send_dev) runtime.copy(host_send + from, send + from, n, stream_);
      inputs_[p]->record(stream_);
    }
    for (size_t p = 0; p < pieces; ++p) {
      runtime.wait_value(stream_, slot_->flag(), first_release_ + static_cast<uint32_t>(p));
      const auto [from, n] = part(p, recv_bytes);
      if (recv_dev) runtime.copy(recv + from, host_recv + from, n, stream_);
    }
    // The slot's event first: a caller that saw its output arrive finds the slot free for its
    // next call (else a quick next call would take a new slot).
    slot_->done->record(stream_);
    output_->record(stream_);
  } catch (...) {
    // Whatever was enqueued must not wait for a release that will never come.
    release();
    throw;
  }
  if (send_dev) args.send = host_send;
  if (recv_dev) args.recv = host_recv;
}

DeviceStage::~DeviceStage() {
  release();
}

bool DeviceStage::input_ready() {
  return inputs_.back()->done();
}

namespace {

// Spin briefly (the stream is usually there already), then poll gently: the op's driver has
// nothing else to do until its input is in host memory.
void wait_event(DeviceRuntime::Event& e, const core::Deadline& deadline) {
  for (int spins = 0;; ++spins) {
    if (e.done()) return;
    if (deadline.expired())
      throw TimeoutError(
          "the call's input was not ready on its CUDA stream within the timeout "
          "(the stream is blocked, or waits for work issued after this call)");
    if (spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

}  // namespace

void DeviceStage::wait_input(const core::Deadline& deadline) {
  for (auto& e : inputs_) wait_event(*e, deadline);
}

void DeviceStage::run_pieces(const algorithms::Args& args, const core::Deadline& deadline,
                             const std::function<void(const algorithms::Args&)>& run) {
  const size_t elem = dtype_size(args.dtype);
  for (size_t p = 0; p < pieces(); ++p) {
    wait_event(*inputs_[p], deadline);
    algorithms::Args piece = args;
    const size_t from = p * piece_elems_;
    piece.count = std::min(piece_elems_, args.count - from);
    piece.send = static_cast<const char*>(args.send) + from * elem;
    piece.recv = static_cast<char*>(args.recv) + from * elem;
    run(piece);
    // Piece p's output is final: the stream may copy it out while the next piece runs.
    if (slot_ && p + 1 < pieces())
      std::atomic_ref<uint32_t>(*slot_->flag())
          .store(first_release_ + static_cast<uint32_t>(p), std::memory_order_release);
  }
}

void DeviceStage::wait_output() {
  for (int spins = 0; !output_->done(); ++spins) {
    if (spins < 64)
      std::this_thread::yield();
    else
      std::this_thread::sleep_for(std::chrono::microseconds(20));
  }
}

void DeviceStage::release() {
  if (released_) return;
  released_ = true;
  // Free in the pool before the stream goes on, so the caller woken by its output finds the slot
  // free; its done event (not yet passed: it follows the wait) keeps it from being reused early.
  pool_.release(slot_);
  std::atomic_ref<uint32_t>(*slot_->flag()).store(slot_->generation, std::memory_order_release);
}

// ---- the communicator's side ------------------------------------------------------------

bool CommImpl::runs_on_device(const OpState& op, const CallOptions& call,
                              DeviceRuntime& runtime) const {
  const algorithms::Args& a = op.args;
  if (op.is_p2p || a.kind != algorithms::Collective::allreduce || a.op == ReduceOp::premul_sum ||
      a.wire != Wire::none || a.count == 0 || !transport_->takes(transport::MemorySpace::device))
    return false;
  // Both buffers on the device (an allreduce's are the same size).
  auto on_device = [&](const void* p) {
    return call.memory == Memory::device || runtime.is_device(p);
  };
  return on_device(a.send) && on_device(a.recv);
}

void CommImpl::stage_device(OpState& op, const CallOptions& call) {
  DeviceRuntime& runtime = device_runtime();
  if (!runtime.in_use()) {
    const std::string why = reduce::cuda::unavailable_reason();
    throw InvalidArgument(
        "device memory, but this process does not use CUDA (no CUDA driver initialised, so no "
        "pointer can be device memory" +
        (why.empty() ? std::string(")") : "; " + why + ")"));
  }
  if (!staging_) staging_ = std::make_unique<StagingPool>(runtime);
  algorithms::Args& a = op.args;
  if (runs_on_device(op, call, runtime)) {
    // Every peer has a device link (transport/device/): the ring runs on the buffers themselves,
    // its link doing the copies and the reductions on the device; nothing is staged.
    const transport::KindTraits& t = transport_->device_traits();
    op.plan = tuner::Plan{};
    op.plan.algorithm = algorithms::find_algorithm(algorithms::Collective::allreduce, "ring");
    // Slice by slice, slices of one slot: each forward then waits only for the slice before it,
    // and a few slots per inbox carry any size. (Step by step, a rank's whole first step would
    // have to fit its neighbour's inbox before either could forward.)
    op.plan.segment_bytes = t.segment_bytes;
    op.plan.sliced = true;
    op.tag.algo = op.plan.algorithm->id;
    op.tag.segment_bytes = op.plan.segment_bytes;
    op.tag.channels = 1;
    // A rank that staged the same call would wait on other links: the flag tells the tags apart
    // (the stall monitor then names the mismatch).
    op.tag.flags = transport::kTagSliced | transport::kTagDevice;
    op.stage = std::make_shared<DeviceStage>(call, runtime, *staging_);
    return;
  }
  const size_t elem = dtype_size(a.dtype);
  size_t send_bytes = 0, recv_bytes = 0;
  if (op.is_p2p) {
    (op.p2p.is_send ? send_bytes : recv_bytes) = op.p2p.bytes;
  } else {
    send_bytes = algorithms::send_elements(a, rank_, size_) * elem;
    recv_bytes = algorithms::recv_elements(a, rank_, size_) * elem;
  }
  // Large allreduces in pieces (DeviceStage): pieces of at least 4 MiB, at most 8 of them (the
  // copies the op does not hide are one piece's each way; each piece costs the algorithm's
  // latency once more). Not through the shared window (its algorithms stamp each op's sequence
  // number once), nor premul_sum (its scaling reads the whole input first), nor coded calls.
  size_t piece_elems = 0;
  constexpr size_t kPieceMin = 4 << 20, kMaxPieces = 8;
  if (!op.is_p2p && a.kind == algorithms::Collective::allreduce && a.op != ReduceOp::premul_sum &&
      a.wire == Wire::none && !op.plan.algorithm->needs_window && !op.plan.fallback &&
      send_bytes >= 2 * kPieceMin) {
    const size_t pieces = std::min(kMaxPieces, send_bytes / kPieceMin);
    const size_t per = (a.count + pieces - 1) / pieces;
    piece_elems = (per * elem + 63) / 64 * 64 / elem;  // whole cache lines where elem divides 64
  }
  op.stage = std::make_shared<DeviceStage>(a, send_bytes, recv_bytes, call, runtime, *staging_,
                                           piece_elems);
}

}  // namespace ringreduce::detail
