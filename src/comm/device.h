// Device memory in collectives (issue 17): the runtime the communicator stages device buffers
// through, and the staging itself.
//
// A call on device memory is stream-ordered (NCCL's semantics): when it is issued, the copy of
// its input into page-locked host memory, a wait for the communicator, and the copy of the
// output back are enqueued on the caller's stream, and the call returns. The op runs on the host
// buffers like any other, in issue order, once the stream has reached the call (the op's driver
// polls an event; a stream that does not get there within the op's timeout fails it); finishing
// it (done or failed) releases the stream, whose later work then sees the result. So a training
// loop may issue an allreduce right after the kernels that compute its input, without waiting
// for them.
//
// Host staging is the path every transport can take; device-to-device links between the ranks
// of a host are the next step (docs/GPU.md).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "core/deadline.h"
#include "core/fd.h"
#include "reduce/device_runtime.h"
#include "ringreduce/communicator.h"

namespace ringreduce::detail {

// The device runtime (reduce/device_runtime.h) under the names staging has always used.
using reduce::device_runtime;
using reduce::DeviceRuntime;
using reduce::set_device_runtime;

// Page-locked staging memory, kept per communicator and reused: a buffer is taken by an op and
// can be taken again once the stream has passed the op's last copy out of it, so that only the
// first call of a size pays for allocating and pinning (what made Baidu's first call 7.5x slower
// than its median).
class StagingPool {
 public:
  struct Slot {
    std::unique_ptr<DeviceRuntime::HostMemory> memory;
    size_t bytes = 0;                            // usable bytes after the flag's line
    std::unique_ptr<DeviceRuntime::Event> done;  // recorded after the op's last copy out
    uint32_t generation = 0;                     // the flag's value that releases the stream
    bool busy = false;
    uint32_t* flag() { return reinterpret_cast<uint32_t*>(memory->data()); }
    char* data() { return memory->data() + kFlagBytes; }
  };
  static constexpr size_t kFlagBytes = 64;  // the flag's own cache line

  explicit StagingPool(DeviceRuntime& runtime) : runtime_(runtime) {}
  // Waits (up to 10 s) for the streams to finish their copies out of the slots before freeing.
  ~StagingPool();
  // The communicator's own stream, for calls with CallOptions::side_stream (made on first use).
  void* side_stream();
  // A free slot of at least `bytes` whose stream has passed its last use; else a new one.
  Slot* acquire(size_t bytes);
  void release(Slot* slot);
  size_t slots() const;

 private:
  DeviceRuntime& runtime_;
  mutable std::mutex mu_;
  std::vector<std::unique_ptr<Slot>> slots_;
  void* side_ = nullptr;
  bool have_side_ = false;
};

// One call's staging: which of its buffers are on the device, the host buffers that stand in for
// them, and the stream it is ordered on.
class DeviceStage {
 public:
  // Whether the call has device buffers (CallOptions::memory, or asking the runtime).
  static bool wanted(const algorithms::Args& args, const CallOptions& call);
  // Maps args' device buffers to host staging (rewriting args.send/recv) and enqueues on
  // call.stream: the input's copy, the input event, the wait for release(), the output's copy,
  // the slot's done event. send_bytes/recv_bytes: what this rank's buffers hold.
  //
  // piece_elems > 0 (an element-wise call whose algorithm can run on any part of it: allreduce
  // over links, not the shared window): the call is staged in pieces of that many elements, so
  // that the copies overlap the op (issue 44, the staged path overlapped): every piece's copy in
  // and its input event first, then per piece a wait for its release and its copy out. The op
  // runs the algorithm piece by piece (run_pieces): piece p reduces while the stream copies p+1
  // in and p-1 out, and a call costs its op plus one piece's copies, not two whole copies more.
  DeviceStage(algorithms::Args& args, size_t send_bytes, size_t recv_bytes, const CallOptions& call,
              DeviceRuntime& runtime, StagingPool& pool, size_t piece_elems = 0);
  // A call whose links take device memory (transport/device/): nothing is staged; the stream
  // only orders the op: an input event where the call was issued, then a wait for release().
  DeviceStage(const CallOptions& call, DeviceRuntime& runtime, StagingPool& pool);
  // Releases the stream if release() was not called (an op dropped on the way).
  ~DeviceStage();
  DeviceStage(const DeviceStage&) = delete;
  DeviceStage& operator=(const DeviceStage&) = delete;

  // Whether the op runs on the device buffers themselves (the constructor above).
  bool direct() const { return direct_; }
  // How many pieces the call is staged in (1: whole).
  size_t pieces() const { return inputs_.size(); }
  // Runs `run` on each piece of args in turn (the call's elements [p x piece, ...)), each after
  // its input is in host memory, releasing each piece's output to the stream as it is done. A
  // TimeoutError (as wait_input's) if a piece's input does not arrive by the deadline.
  void run_pieces(const algorithms::Args& args, const core::Deadline& deadline,
                  const std::function<void(const algorithms::Args&)>& run);
  // Whether the input has been copied to host memory (the stream reached the call).
  bool input_ready();
  // Waits until input_ready(); a TimeoutError (naming the stream) at the deadline.
  void wait_input(const core::Deadline& deadline);
  // The op has finished (done or failed): the stream may copy the output and go on.
  void release();
  // Waits until the copy of the output into the caller's buffers has completed (the blocking
  // form's return, Work::wait_output). Polls this call's own event: waiting for the whole stream
  // could wait for later calls, whose release may need this thread.
  void wait_output();

 private:
  DeviceRuntime& runtime_;
  StagingPool& pool_;
  StagingPool::Slot* slot_ = nullptr;
  // One input event per piece (the last is the whole input's); the flag's value releasing piece
  // p is first_release_ + p.
  std::vector<std::unique_ptr<DeviceRuntime::Event>> inputs_;
  std::unique_ptr<DeviceRuntime::Event> output_;  // after the copy out
  size_t piece_elems_ = 0;
  uint32_t first_release_ = 0;
  void* stream_ = nullptr;
  bool released_ = false;
  bool direct_ = false;
};

}  // namespace ringreduce::detail
