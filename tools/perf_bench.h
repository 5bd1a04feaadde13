// ringreduce-perf's benchmark shape (perf.cc times it): the buffers of one collective, dtype,
// op and size, how a call on them is issued, its inputs and how its result is checked. Split from
// perf.cc (607 lines) along that line: perf.cc times and reports, this sets up and checks.
#pragma once

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <utility>

#include "exact_data.h"
#include "perf_args.h"
#include "reduce/cuda/reduce_cuda.h"
#include "reduce/wire.h"
#include "ringreduce/ringreduce.hpp"

namespace perf {

using ringreduce::CallOptions;
using ringreduce::Communicator;
using ringreduce::DataType;
using ringreduce::Memory;
using ringreduce::ReduceOp;
using ringreduce::Wire;
using ringreduce::Work;
namespace reduce = ringreduce::reduce;
namespace exact = ringreduce::exact;

// One benchmark shape: buffers sized for `count` total elements.
struct Bench {
  Communicator& comm;
  const Args& args;
  DataType dtype;
  ReduceOp op;
  size_t count;  // total elements (size / elem), a multiple of n where the collective needs it
  size_t block;  // per-rank elements for the block collectives
  // Page-aligned, like the buffers users pass (torch allocates 64-byte aligned tensors, nccl-tests
  // cudaMalloc'd ones); malloc's 16-byte offset would time split vector loads instead.
  // --buffers device: the buffers are device memory (cudaMalloc), with a host copy that the checks
  // fill and read (uploaded before a checked run, downloaded after).
  // --buffers registered: the buffers come from Communicator::alloc (page-aligned too), and are
  // freed with it (a collective: every rank frees its buffers in the same order).
  struct Buffer {
    std::unique_ptr<char, decltype(&std::free)> p{nullptr, &std::free};
    std::unique_ptr<reduce::cuda::DeviceBuffer> dev;
    Communicator* registered = nullptr;
    char* reg = nullptr;
    size_t n = 0;
    Buffer() = default;
    Buffer(const Buffer&) = delete;
    Buffer& operator=(const Buffer&) = delete;
    ~Buffer() {
      try {
        unregister();
      } catch (const std::exception&) {  // the communicator failed: its end frees the memory
      }
    }
    void unregister() {
      if (reg) registered->free(std::exchange(reg, nullptr));
    }
    void assign(size_t bytes, char v, bool device, Communicator* comm) {
      unregister();
      p.reset();
      n = bytes;
      if (comm) {
        reg = static_cast<char*>(comm->alloc(bytes));
        registered = comm;
      } else {
        p.reset(static_cast<char*>(std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096)));
        if (!p) throw std::bad_alloc();
      }
      std::memset(host(), v, bytes);
      if (device) dev = std::make_unique<reduce::cuda::DeviceBuffer>(bytes);
    }
    // What the calls are given: device memory with --buffers device.
    char* data() { return dev ? static_cast<char*>(dev->data()) : host(); }
    char* host() { return reg ? reg : p.get(); }
    size_t size() const { return n; }
    void upload() {
      if (dev) dev->upload(p.get(), n);
    }
    void download() {
      if (dev) dev->download(p.get(), n);
    }
  };
  Buffer send, recv;

  size_t elem() const { return dtype_size(dtype); }
  int n() const { return comm.size(); }
  int r() const { return comm.rank(); }
  size_t send_elems() const { return args.coll == Coll::allgather ? block : count; }
  size_t recv_elems() const { return args.coll == Coll::reduce_scatter ? block : count; }

  void allocate() {
    Communicator* reg = args.registered ? &comm : nullptr;
    send.assign(std::max<size_t>(1, send_elems() * elem()), 0, args.device, reg);
    recv.assign(std::max<size_t>(1, count * elem()), 0, args.device, reg);
  }

  // The receive pointer of the in-place variant (nccl-tests conventions).
  void* in_place_recv() { return args.coll == Coll::allgather ? recv.data() : send.data(); }
  const void* in_place_send() {
    if (args.coll == Coll::allgather)
      return recv.data() + static_cast<size_t>(r()) * block * elem();
    return send.data();
  }
  void* in_place_dst() {
    if (args.coll == Coll::reduce_scatter)
      return send.data() + static_cast<size_t>(r()) * block * elem();
    return in_place_recv();
  }

  CallOptions call() const {
    CallOptions c;
    // Host buffers take the default (automatic) path, so rows time what a user's call pays.
    c.memory = args.device ? Memory::device : Memory::automatic;
    if (args.wire_set) c.wire = args.wire;
    return c;
  }
  Work issue(bool in_place) {
    const void* s = in_place ? in_place_send() : send.data();
    void* d = in_place ? in_place_dst() : recv.data();
    switch (args.coll) {
      case Coll::allreduce:
        return comm.allreduce_async(s, d, count, dtype, op, call());
      case Coll::reduce_scatter:
        return comm.reduce_scatter_async(s, d, block, dtype, op, call());
      case Coll::allgather:
        return comm.allgather_async(s, d, block, dtype, call());
      case Coll::broadcast:
        return comm.broadcast_async(s, d, count, dtype, args.root, call());
      case Coll::reduce:
        return comm.reduce_async(s, d, count, dtype, op, args.root, call());
      case Coll::alltoall:
        return comm.alltoall_async(s, d, block, dtype, call());
    }
    return {};
  }
  // Blocking variant for the timed loop: the caller drives progress itself.
  void run(bool in_place) {
    const void* s = in_place ? in_place_send() : send.data();
    void* d = in_place ? in_place_dst() : recv.data();
    switch (args.coll) {
      case Coll::allreduce:
        comm.allreduce(s, d, count, dtype, op, call());
        break;
      case Coll::reduce_scatter:
        comm.reduce_scatter(s, d, block, dtype, op, call());
        break;
      case Coll::allgather:
        comm.allgather(s, d, block, dtype, call());
        break;
      case Coll::broadcast:
        comm.broadcast(s, d, count, dtype, args.root, call());
        break;
      case Coll::reduce:
        comm.reduce(s, d, count, dtype, op, args.root, call());
        break;
      case Coll::alltoall:
        comm.alltoall(s, d, block, dtype, call());
        break;
    }
  }

  // Fills the inputs with exact data for one checked run.
  void fill(bool in_place) {
    using namespace exact;
    switch (args.coll) {
      case Coll::allreduce:
      case Coll::reduce:
      case Coll::reduce_scatter:
        fill_input(send.host(), count, r(), dtype, op);
        break;
      case Coll::allgather:
        fill_input(in_place ? recv.host() + static_cast<size_t>(r()) * block * elem() : send.host(),
                   block, r(), dtype, op, static_cast<size_t>(r()) * block);
        break;
      case Coll::broadcast:
        if (r() == args.root) fill_input(send.host(), count, r(), dtype, op);
        if (in_place && r() != args.root) std::memset(send.host(), 0, count * elem());
        break;
      case Coll::alltoall:
        // Block j goes to rank j; its content identifies the sender (rank r) and position.
        for (int j = 0; j < n(); ++j)
          fill_input(send.host() + static_cast<size_t>(j) * block * elem(), block, r(), dtype, op,
                     static_cast<size_t>(j) * block);
        break;
    }
    if (!in_place) std::memset(recv.host(), 0, recv.size());
    send.upload();
    recv.upload();
  }

  // The host's view of a pointer into send or recv.
  const char* host_of(const void* p) {
    const char* c = static_cast<const char*>(p);
    for (Buffer* b : {&send, &recv})
      if (c >= b->data() && c < b->data() + b->size()) return b->host() + (c - b->data());
    return c;
  }

  // Whether a call of this row may run coded (Tuner::wire_applies): float32, sum-like.
  bool coded() const {
    const bool summing = op == ReduceOp::sum || op == ReduceOp::avg || op == ReduceOp::premul_sum;
    return args.wire_set && args.wire != Wire::none && dtype == DataType::f32 &&
           (args.coll == Coll::allgather ||
            (summing && (args.coll == Coll::allreduce || args.coll == Coll::reduce_scatter)));
  }
  // The relative error a coded result may carry: one rounding of the widest format auto may
  // pick (bf16) or of the format asked for.
  double roundoff() const {
    return reduce::wire_layout(args.wire == Wire::automatic ? Wire::bf16 : args.wire).roundoff;
  }
  size_t wrong(bool in_place) {
    using namespace exact;
    send.download();
    recv.download();
    const char* out = host_of(in_place ? in_place_dst() : recv.data());
    switch (args.coll) {
      case Coll::allreduce:
        // A coded allreduce rounds its result once (its inputs, small integers, code exactly).
        if (coded()) return count_wrong_reduced(out, count, n(), dtype, op, 0, roundoff());
        return count_wrong_reduced(out, count, n(), dtype, op);
      case Coll::reduce:
        return r() == args.root ? count_wrong_reduced(out, count, n(), dtype, op) : 0;
      case Coll::reduce_scatter:
        return count_wrong_reduced(out, block, n(), dtype, op, static_cast<size_t>(r()) * block);
      case Coll::broadcast:
        return count_wrong_input(out, count, args.root, dtype, op);
      case Coll::allgather: {
        size_t w = 0;
        for (int j = 0; j < n(); ++j)
          w += count_wrong_input(out + static_cast<size_t>(j) * block * elem(), block, j, dtype, op,
                                 static_cast<size_t>(j) * block);
        return w;
      }
      case Coll::alltoall: {
        size_t w = 0;
        for (int j = 0; j < n(); ++j)
          w += count_wrong_input(out + static_cast<size_t>(j) * block * elem(), block, j, dtype, op,
                                 static_cast<size_t>(r()) * block);
        return w;
      }
    }
    return 0;
  }
};

}  // namespace perf
