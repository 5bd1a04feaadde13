// The C++ API: a Communicator over a group of ranks, with blocking and asynchronous collectives.
//
//   auto comm = ringreduce::Communicator::from_env();
//   comm.allreduce(std::span<float>(grad), ringreduce::ReduceOp::avg);      // in place
//   ringreduce::Work w = comm.allreduce_async(send, recv, ReduceOp::sum);   // out of place
//   w.wait();
//
// Collectives must be issued in the same order on every rank (MPI semantics). Ops run in issue
// order. Point-to-point sends and receives are matched by (peer, tag) in a space of their own:
// they may be issued in any order relative to the collectives and to the other ranks' calls. A
// failure raises ringreduce::Error (see error.h) naming the rank, the op and its sequence number
// (or, point to point, both ranks and the tag), and aborts the communicator: every pending and
// later op fails with it.
#pragma once

// The C++ API needs C++20 (std::span, concepts). Without it the first error would be deep in
// this header; say what is wrong instead. CMake's ringreduce::ringreduce target asks for C++20
// itself; with pkg-config or by hand, compile with -std=c++20 (C programs use ringreduce.h).
#if !defined(__cplusplus) || __cplusplus < 202002L
#error "ringreduce's C++ API needs C++20: compile with -std=c++20 (or include ringreduce.h from C)"
#endif

#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <vector>

#include "ringreduce/error.h"
#include "ringreduce/export.h"
#include "ringreduce/options.h"
#include "ringreduce/types.h"
#include "ringreduce/version.h"

namespace ringreduce {

namespace detail {
struct OpState;
class CommImpl;
struct EndpointImpl;
}  // namespace detail

// Where a call's buffers are (CallOptions::memory).
enum class Memory : uint8_t {
  // Device memory if the CUDA driver says so, asked only in a process that already uses CUDA
  // (a CPU-only program pays nothing); host memory otherwise.
  automatic,
  host,
  // Every buffer of the call is CUDA device memory (saves asking the driver).
  device,
};

// Per-call settings.
struct CallOptions {
  // Overrides the communicator's timeout for this op.
  std::optional<std::chrono::milliseconds> timeout = std::nullopt;
  // ReduceOp::premul_sum: this rank's input is multiplied by it before the sum (each rank may
  // pass its own, e.g. 1/N for an average that keeps f16's range).
  double premul_factor = 1.0;
  // Where the buffers are. A call on device memory is ordered on `stream` (NCCL's semantics):
  // the copy of its input is enqueued there when the call is issued, and the copy of its result
  // after the op has run, and later work on the stream sees the result. The async form returns
  // at once (its Work completes when the op has run and the copy back is enqueued; synchronise
  // the stream to read recv from the host); the blocking form returns when recv holds the
  // result. docs/GPU.md.
  Memory memory = Memory::automatic;
  // The cudaStream_t a call on device memory is ordered on; nullptr: the legacy default stream.
  void* stream = nullptr;
  // Device memory: run the call's copies on the communicator's own stream, after the work
  // enqueued on `stream` so far, instead of on `stream` itself, so that `stream` goes on at once
  // (a training step's later kernels are not held up by the communication: NCCL's internal
  // stream, DDP's overlap). The result is in recv once Work::wait_output() has returned.
  bool side_stream = false;
  // A narrow wire format for a float32 allreduce, reduce_scatter or allgather (sum, avg or
  // premul_sum): Wire in types.h, docs/WIRE.md. Unset: RINGREDUCE_WIRE (default none), which
  // applies only to the calls it can; set explicitly on any other call, InvalidArgument.
  std::optional<Wire> wire = std::nullopt;
};

// What Communicator::agree() returns: what the ranks still alive agreed on (ULFM's
// MPIX_Comm_agree). Every survivor gets the same values.
struct Agreement {
  bool flag = true;         // the AND of every survivor's flag
  std::vector<int> failed;  // the ranks taken as failed (dead, or silent until the timeout)
  // Over the survivors: the sequence numbers of the last collective each completed. Equal when
  // every survivor completed the same calls; a call completed on some survivors and failed on
  // others (a failure in its last steps) leaves them apart, so that the program can redo it or
  // roll back alike everywhere.
  uint64_t completed_min = 0;
  uint64_t completed_max = 0;
};

// How Communicator::shrink() treats this rank's outstanding ops (NCCL's ncclCommShrink flags,
// torch's SHRINK_DEFAULT and SHRINK_ABORT).
enum class ShrinkFlags : int {
  none = 0,   // none may be outstanding: an InvalidArgument on every survivor if one is
  abort = 1,  // abort them first (they fail with the reason), then shrink
};

// The handle of an asynchronous op. Buffers must stay valid until the op has completed.
class RINGREDUCE_API Work {
 public:
  Work() = default;
  // Blocks until the op has completed; throws its error if it failed.
  void wait();
  // Waits at most `timeout`; returns whether the op completed (throws its error if it failed).
  bool wait(std::chrono::milliseconds timeout);
  // Never blocks: whether the op has completed (throws its error if it failed).
  bool test();
  bool valid() const { return state_ != nullptr; }
  // Calls fn(error) once when the op has completed (error null on success): at once, in this
  // thread, if it already has; else in the thread that completes it (the progress thread, a
  // waiter driving it, or abort()). For bindings whose own futures must complete without anyone
  // waiting (torch's Work::getFuture). fn must not block on this communicator's ops. One
  // callback per op; a second replaces the first if it has not run yet.
  void then(std::function<void(std::exception_ptr)> fn);
  // For a call on device memory: waits (after the op itself) until the copy of its result into
  // recv has completed, so that the host and any stream may read it; at once otherwise.
  void wait_output();
  // The plan the tuner chose for this op, e.g. "ring seg=512K ch=1" ("p2p" for a send or receive).
  std::string algorithm() const;
  // For a completed receive: the rank whose message it took (its peer, or the sender when it
  // received from kAnySource); -1 otherwise.
  int source() const;

 private:
  friend class detail::CommImpl;
  explicit Work(std::shared_ptr<detail::OpState> s) : state_(std::move(s)) {}
  std::shared_ptr<detail::OpState> state_;
};

// This rank's side of a communicator made from handles rather than through a store (torch's
// reconfigure; ncclCommInitRank's unique id, per rank): its listeners, opened now, whose
// addresses its handle() carries. The ranks exchange handles by any means (a store, a file, a
// coordinator) and each passes the same list to Communicator::from_handles, which consumes it.
class RINGREDUCE_API Endpoint {
 public:
  // Settings from `options` (the token, the interface, RINGREDUCE_HOST_ID; its addr, else the
  // launcher's, picks the interface as for a store); rank, world size and store are not used.
  explicit Endpoint(const Options& options = {});
  ~Endpoint();
  Endpoint(Endpoint&&) noexcept;
  Endpoint& operator=(Endpoint&&) noexcept;
  // Opaque text; one per rank and per endpoint (a fresh endpoint has a fresh handle).
  const std::string& handle() const;

 private:
  friend class Communicator;
  std::unique_ptr<detail::EndpointImpl> impl_;
};

class RINGREDUCE_API Communicator {
 public:
  // Collective over the ranks whose handles are listed (each passes the same list): a
  // communicator of them, the owner of handles[i] being rank i. `uuid` names it: every member
  // passes the same, a fresh one each time (connections of another communicator are refused).
  // No store is involved, so split() and the stall reports are not available on it; the link
  // costs are measured on one host and the kinds' defaults across hosts. Bad lists (this rank's
  // handle missing or twice, a handle that is not one) are an InvalidArgument, naming it.
  static Communicator from_handles(Endpoint endpoint, uint64_t uuid,
                                   std::span<const std::string> handles,
                                   const Options& options = {});

  // recv()'s peer for a receive from whichever rank sends a message with its tag first.
  static constexpr int kAnySource = -1;
  // split()'s color for a rank that joins no new communicator.
  static constexpr int kNoColor = -1;

  // Rank, world size and store address from the environment: RINGREDUCE_*, then torchrun's,
  // OpenMPI's, Slurm's and PMI's variables (README). Options override the environment.
  static Communicator from_env(const Options& options = {});
  explicit Communicator(const Options& options);
  ~Communicator();
  Communicator(Communicator&&) noexcept;
  Communicator& operator=(Communicator&&) noexcept;

  // False for an empty communicator (moved from, or split() with kNoColor): every call on it is
  // an InvalidArgument.
  bool valid() const { return impl_ != nullptr; }
  int rank() const;
  int size() const;
  // The library's version ("0.2.0"), as rr_version(): what runs, not the header's
  // RINGREDUCE_VERSION_STRING.
  static const char* version();
  // How many collectives this rank has issued on this communicator (sends and receives do not
  // count). Ranks that are in step agree on it: a debugging aid for calls that diverge (torch's
  // _get_sequence_number_for_group).
  uint64_t sequence_number() const;
  // Collective: every rank calls it (in the same order as its other collectives). Ranks passing
  // the same color form a new communicator, ranked by key (ties: by rank here), through this
  // one's store (MPI_Comm_split, ncclCommSplit); a rank passing kNoColor gets an empty one. The
  // new communicator is independent: its ops, deadlines and failures are its own, and it may
  // outlive this one.
  Communicator split(int color, int key);
  // The link and reduction costs the tuner chooses algorithms by (measured at start-up, or from
  // RINGREDUCE_TUNING_FILE), in that file's format: what `ringreduce-perf --calibrate` writes.
  std::string tuning() const;
  // Collective (every rank, in order with its other collectives; sizes may differ by rank):
  // `bytes` of memory registered with this host's ranks (NCCL's registered buffers,
  // MPI_Win_allocate_shared). A large allreduce whose input and output lie in such memory on
  // every rank reads and writes the peers' buffers in place instead of staging them
  // (docs/PERFORMANCE.md: 1.2-4.7x the speed of the same call on other memory from 64 KiB, 2.9x
  // at 64 MiB with 2 ranks, on the development VM); any call may use it, and calls on other
  // memory run as before.
  // Page-aligned and zeroed. Unlike ncclMemAlloc's, it belongs to this communicator: valid until
  // free() or the communicator's end, and not registered with communicators split from it. Across
  // hosts (or with RINGREDUCE_SHM=0) it is ordinary memory. A failure (out of memory on some rank)
  // is raised on every rank and names the rank.
  void* alloc(size_t bytes);
  // Collective: frees what alloc() returned (every rank passes its pointer from the same
  // alloc() call; nullptr on every rank does nothing). InvalidArgument on every rank for a
  // pointer alloc() did not return.
  void free(void* p);

  // ---- untyped calls (bindings, the C API); counts are elements -------------------------------
  // Out of place unless send == recv.
  Work allreduce_async(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                       const CallOptions& call = {});
  // send holds size() * recv_count elements; rank r receives block r, reduced.
  Work reduce_scatter_async(const void* send, void* recv, size_t recv_count, DataType dtype,
                            ReduceOp op, const CallOptions& call = {});
  // recv holds size() * send_count elements; block r comes from rank r.
  Work allgather_async(const void* send, void* recv, size_t send_count, DataType dtype,
                       const CallOptions& call = {});
  Work broadcast_async(void* buffer, size_t count, DataType dtype, int root,
                       const CallOptions& call = {});
  // Out of place: the root sends from send (and copies it to its recv); the others receive into
  // recv. send is only read on the root.
  Work broadcast_async(const void* send, void* recv, size_t count, DataType dtype, int root,
                       const CallOptions& call = {});
  // recv is used on the root only (may be null elsewhere).
  Work reduce_async(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                    int root, const CallOptions& call = {});
  // send and recv hold size() * count elements; block j of send goes to rank j. send != recv.
  Work alltoall_async(const void* send, void* recv, size_t count, DataType dtype,
                      const CallOptions& call = {});
  Work barrier_async(const CallOptions& call = {});
  // send holds count elements; recv (on the root only; may be null elsewhere) holds size() * count,
  // block r from rank r. In place: the root's send is block root of its recv.
  Work gather_async(const void* send, void* recv, size_t count, DataType dtype, int root,
                    const CallOptions& call = {});
  // send (on the root only; may be null elsewhere) holds size() * count elements, block r for
  // rank r; recv holds count. In place: the root's recv is block root of its send.
  Work scatter_async(const void* send, void* recv, size_t count, DataType dtype, int root,
                     const CallOptions& call = {});
  // Blocks of their own sizes, the same `counts` (one per rank) on every rank: recv holds their
  // total, block r (counts[r] elements) from rank r, one after another; send holds counts[rank()].
  Work allgatherv_async(const void* send, void* recv, std::span<const size_t> counts,
                        DataType dtype, const CallOptions& call = {});
  // send holds the total of `counts` (the same on every rank), block r for rank r; recv gets this
  // rank's block (counts[rank()] elements), reduced.
  Work reduce_scatterv_async(const void* send, void* recv, std::span<const size_t> counts,
                             DataType dtype, ReduceOp op, const CallOptions& call = {});
  // send holds send_counts[j] elements for rank j, one block after another; recv gets
  // recv_counts[j] from rank j. Each rank passes its own counts; rank j's send_counts[i] must
  // equal rank i's recv_counts[j] (else a MismatchError on the receiver). send != recv.
  Work alltoallv_async(const void* send, std::span<const size_t> send_counts, void* recv,
                       std::span<const size_t> recv_counts, DataType dtype,
                       const CallOptions& call = {});

  void allreduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                 const CallOptions& call = {});
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype, ReduceOp op,
                      const CallOptions& call = {});
  void allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                 const CallOptions& call = {});
  void broadcast(void* buffer, size_t count, DataType dtype, int root,
                 const CallOptions& call = {});
  void broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                 const CallOptions& call = {});
  void reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op, int root,
              const CallOptions& call = {});
  void alltoall(const void* send, void* recv, size_t count, DataType dtype,
                const CallOptions& call = {});
  void barrier(const CallOptions& call = {});
  void gather(const void* send, void* recv, size_t count, DataType dtype, int root,
              const CallOptions& call = {});
  void scatter(const void* send, void* recv, size_t count, DataType dtype, int root,
               const CallOptions& call = {});
  void allgatherv(const void* send, void* recv, std::span<const size_t> counts, DataType dtype,
                  const CallOptions& call = {});
  void reduce_scatterv(const void* send, void* recv, std::span<const size_t> counts, DataType dtype,
                       ReduceOp op, const CallOptions& call = {});
  void alltoallv(const void* send, std::span<const size_t> send_counts, void* recv,
                 std::span<const size_t> recv_counts, DataType dtype, const CallOptions& call = {});

  // ---- point to point: counts are elements ---------------------------------------------------
  // A message of `count` elements to `peer`, received there by a recv with this rank (or
  // kAnySource) and this tag and the same size. Messages from one sender with one tag arrive in
  // the order they were sent; other tags and other senders in any order. Small messages leave at
  // once (send completes when they have); larger ones wait for the receiver to post its recv and
  // then go straight into its buffer. buf must stay valid until the send has completed.
  Work send_async(const void* buf, size_t count, DataType dtype, int peer, uint64_t tag = 0,
                  const CallOptions& call = {});
  // Receives a message of exactly `count` elements from `peer` (kAnySource: any rank) with `tag`;
  // Work::source() then says who sent it. A message of another size is a MismatchError on the
  // receiver, which fails the communicator (every rank learns why).
  Work recv_async(void* buf, size_t count, DataType dtype, int peer, uint64_t tag = 0,
                  const CallOptions& call = {});
  void send(const void* buf, size_t count, DataType dtype, int peer, uint64_t tag = 0,
            const CallOptions& call = {});
  // Returns the rank whose message it took.
  int recv(void* buf, size_t count, DataType dtype, int peer, uint64_t tag = 0,
           const CallOptions& call = {});

  // ---- typed calls: the dtype is deduced from T ------------------------------------------------
  template <typename T>
  void allreduce(std::span<T> buffer, ReduceOp op) {
    allreduce(buffer.data(), buffer.data(), buffer.size(), DataTypeOf<std::remove_cv_t<T>>::value,
              op);
  }
  template <typename T>
  void allreduce(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    check_same_size(send.size(), recv.size(), "allreduce");
    allreduce(send.data(), recv.data(), recv.size(), DataTypeOf<T>::value, op);
  }
  template <typename T>
  Work allreduce_async(std::span<T> buffer, ReduceOp op) {
    return allreduce_async(buffer.data(), buffer.data(), buffer.size(),
                           DataTypeOf<std::remove_cv_t<T>>::value, op);
  }
  template <typename T>
  Work allreduce_async(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    check_same_size(send.size(), recv.size(), "allreduce");
    return allreduce_async(send.data(), recv.data(), recv.size(), DataTypeOf<T>::value, op);
  }
  template <typename T>
  void broadcast(std::span<T> buffer, int root) {
    broadcast(buffer.data(), buffer.size(), DataTypeOf<T>::value, root);
  }
  template <typename T>
  void reduce_scatter(std::span<const T> send, std::span<T> recv, ReduceOp op) {
    check_same_size(send.size(), recv.size() * static_cast<size_t>(size()), "reduce_scatter");
    reduce_scatter(send.data(), recv.data(), recv.size(), DataTypeOf<T>::value, op);
  }
  template <typename T>
  void send(std::span<const T> buf, int peer, uint64_t tag = 0) {
    send(buf.data(), buf.size(), DataTypeOf<T>::value, peer, tag);
  }
  template <typename T>
  int recv(std::span<T> buf, int peer, uint64_t tag = 0) {
    return recv(buf.data(), buf.size(), DataTypeOf<std::remove_cv_t<T>>::value, peer, tag);
  }
  template <typename T>
  void allgather(std::span<const T> send, std::span<T> recv) {
    check_same_size(send.size() * static_cast<size_t>(size()), recv.size(), "allgather");
    allgather(send.data(), recv.data(), send.size(), DataTypeOf<T>::value);
  }

  // Fails every pending and later op with `reason` within milliseconds; callable from any
  // thread, also while others are blocked in its calls, and returns at once. The peers it is
  // linked with fail their ops with it too. Destroying an aborted communicator never waits for
  // its peers.
  void abort(const std::string& reason);
  // The error that aborted the communicator (an op's failure, a peer's, abort(), a shrink), or
  // null while it is healthy. Never blocks.
  std::exception_ptr error() const;
  // The timeout of later calls that do not set CallOptions::timeout (Options::timeout).
  void set_timeout(std::chrono::milliseconds timeout);
  // Calls fn(error) once, when the communicator is aborted (an op's failure, a peer's notice,
  // abort(), a shrink), in the thread that aborts it, before its ops fail with the error: for
  // debug information (torch's abort hooks). fn must not call this communicator. One hook; a
  // second replaces the first. Set after the abort, it is not called.
  void on_abort(std::function<void(std::exception_ptr)> fn);

  // ---- fault tolerance (docs/RELIABILITY.md, "When a rank dies") ------------------------------
  // Collective over the ranks still alive, callable on a communicator that a failure aborted:
  // they agree, over connections of their own (never through the store, which may have died
  // with its host), on which ranks are gone and on the AND of `flag`. Tolerates failures while
  // it runs; a rank silent for the timeout is taken as failed. Every survivor returns the same
  // Agreement. The communicator itself stays as it was (aborted or not).
  Agreement agree(bool flag = true, const CallOptions& call = {});
  // Collective over the ranks still alive (the excluded ones do not call it): a new
  // communicator of the survivors, ranked densely in their old order (ncclCommShrink,
  // MPIX_Comm_shrink). `exclude` empty: the ranks the survivors agree have failed; otherwise
  // those ranks, and any that turn out to have failed as well. Needs no store. Every survivor
  // must pass the same `exclude` (else an InvalidArgument on all). With ShrinkFlags::none no op
  // may be outstanding on this rank (else an InvalidArgument on every survivor); with abort they
  // are aborted first. Afterwards this communicator is aborted (the excluded ranks that are
  // still alive fail their ops, naming the shrink) and may be destroyed at once. A rank that
  // dies during the shrink is found and left out: the survivors retry within the timeout.
  Communicator shrink(std::span<const int> exclude = {}, ShrinkFlags flags = ShrinkFlags::none,
                      const CallOptions& call = {});
  // For a communicator made by shrink(): each rank's rank in the communicator it was shrunk
  // from (empty otherwise).
  std::vector<int> parent_ranks() const;
  // Collective over this communicator's ranks (ncclCommGrow): a communicator of them and
  // `newcomers` new processes, which call join(name); the members keep their ranks, the
  // newcomers follow in the order they arrive. They meet in the job's store (which this
  // communicator keeps since its start, whatever split or shrink made it): a replacement for a
  // dead rank, or more capacity. `name` is this grow's, the same on every member and newcomer,
  // and fresh per grow. Members that disagree on `newcomers` get an InvalidArgument each; a
  // newcomer that never comes (or that the store refuses: another RINGREDUCE_TOKEN) is named in
  // a TimeoutError at the timeout.
  Communicator grow(const std::string& name, int newcomers, const CallOptions& call = {});
  // A new process's side of grow(): joins the communicator the members grow under `name`,
  // reaching the job's store as from_env would (Options, RINGREDUCE_ADDR, MASTER_ADDR and
  // MASTER_PORT, the job id; options.store in-process); rank and world size come from the grow.
  static Communicator join(const std::string& name, const Options& options = {});

 private:
  explicit Communicator(std::unique_ptr<detail::CommImpl> impl);
  void check_same_size(size_t a, size_t b, const char* call) const;
  // The implementation; InvalidArgument for an empty communicator.
  detail::CommImpl& impl() const;
  std::unique_ptr<detail::CommImpl> impl_;
};

}  // namespace ringreduce
