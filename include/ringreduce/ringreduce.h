/* ringreduce C ABI: a stable interface over the C++ Communicator for C, Fortran and FFI users.
 * No exception crosses it: every call returns an rr_result_t, and rr_last_error() gives the
 * message of the last failure ("rank 3: allreduce #812 (float x 4194304, sum): peer rank 2 closed
 * the connection").
 *
 * Handles: a call on a communicator or work handle that was destroyed or freed already, or that
 * this library never made, returns RR_ERR_INVALID_ARGUMENT (rr_comm_rank/size: -1) and
 * rr_last_error(NULL) says so; a second destroy or free does nothing. Not detected: a handle
 * destroyed while another thread is inside a call on it, and a destroyed handle whose address a
 * newer handle has been given. */
#ifndef RINGREDUCE_H_
#define RINGREDUCE_H_

#include <stddef.h>
#include <stdint.h>

#include "ringreduce/export.h"
#include "ringreduce/version.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rr_comm rr_comm_t;
typedef struct rr_work rr_work_t;

typedef enum {
  RR_OK = 0,
  RR_ERR_INTERNAL = 1,
  RR_ERR_INVALID_ARGUMENT = 2,
  RR_ERR_TIMEOUT = 3,
  RR_ERR_PEER = 4,
  RR_ERR_MISMATCH = 5,
  RR_ERR_ABORTED = 6
} rr_result_t;

/* Same order as ringreduce::DataType and ringreduce::ReduceOp. RR_BOOL: one byte, 0 or 1. */
typedef enum {
  RR_F16,
  RR_BF16,
  RR_F32,
  RR_F64,
  RR_I8,
  RR_U8,
  RR_I32,
  RR_U32,
  RR_I64,
  RR_U64,
  RR_I16,
  RR_BOOL
} rr_dtype_t;
/* RR_BAND, RR_BOR, RR_BXOR: integers and bool. RR_PREMUL_SUM: floating point, each rank's input
 * multiplied by a factor of its own first (rr_allreduce_premul_sum; through the other calls the
 * factor is 1). */
typedef enum {
  RR_SUM,
  RR_PROD,
  RR_MIN,
  RR_MAX,
  RR_AVG,
  RR_BAND,
  RR_BOR,
  RR_BXOR,
  RR_PREMUL_SUM
} rr_op_t;

/* Narrow wire formats for float32 allreduce, reduce_scatter and allgather (docs/WIRE.md):
 * RR_WIRE_DEFAULT is RINGREDUCE_WIRE's value, RR_WIRE_NONE the data as it is. */
typedef enum {
  RR_WIRE_NONE,
  RR_WIRE_BF16,
  RR_WIRE_F16,
  RR_WIRE_FP8E4M3,
  RR_WIRE_FP8E5M2,
  RR_WIRE_AUTO,
  RR_WIRE_DEFAULT = -1
} rr_wire_t;

/* Rank, size and rendezvous from the environment (RINGREDUCE_*, torchrun, OpenMPI, Slurm, PMI). */
RINGREDUCE_API rr_result_t rr_comm_init_from_env(rr_comm_t** comm);
/* Explicit: addr is the store's "host:port"; token may be NULL; timeout_s <= 0 keeps the default.
 */
RINGREDUCE_API rr_result_t rr_comm_init(rr_comm_t** comm, int rank, int size, const char* addr,
                                        const char* token, double timeout_s);
RINGREDUCE_API void rr_comm_destroy(rr_comm_t* comm);
RINGREDUCE_API int rr_comm_rank(const rr_comm_t* comm);
RINGREDUCE_API int rr_comm_size(const rr_comm_t* comm);
/* Fails every pending and later op with reason; callable from any thread. */
RINGREDUCE_API rr_result_t rr_comm_abort(rr_comm_t* comm, const char* reason);
/* Collective (MPI_Comm_split): ranks passing one color form a new communicator, ranked by key
 * (ties by rank); *out is NULL for color RR_NO_COLOR. The new communicator is destroyed with
 * rr_comm_destroy, independently of this one. */
#define RR_NO_COLOR (-1)
RINGREDUCE_API rr_result_t rr_comm_split(rr_comm_t* comm, int color, int key, rr_comm_t** out);
/* The timeout of later calls, in seconds (> 0). */
RINGREDUCE_API rr_result_t rr_comm_set_timeout(rr_comm_t* comm, double timeout_s);
/* RR_OK while comm is healthy; else the code of the error that aborted it (an op's, a peer's,
 * rr_comm_abort, a shrink), its message in rr_last_error(comm). Never blocks. */
RINGREDUCE_API rr_result_t rr_comm_get_error(rr_comm_t* comm);

/* Fault tolerance (docs/RELIABILITY.md, "When a rank dies"); Communicator::agree and ::shrink.
 * rr_comm_agree: collective over the ranks still alive, on a communicator a failure may have
 * aborted: *flag becomes the AND of every survivor's *flag; failed (may be NULL), room for
 * max_failed ranks, receives the ranks taken as failed, their number in *n_failed (may be
 * NULL). rr_comm_shrink: collective over the ranks still alive: *out is a new communicator of
 * the survivors, ranked in their old order; exclude (n_exclude ranks; NULL and 0: the ranks the
 * survivors agree have failed); flags RR_SHRINK_DEFAULT (no op may be outstanding) or
 * RR_SHRINK_ABORT (abort them first). comm is aborted afterwards; destroy it at any time. */
#define RR_SHRINK_DEFAULT 0
#define RR_SHRINK_ABORT 1
RINGREDUCE_API rr_result_t rr_comm_agree(rr_comm_t* comm, int* flag, int* failed, size_t max_failed,
                                         size_t* n_failed);
RINGREDUCE_API rr_result_t rr_comm_shrink(rr_comm_t* comm, const int* exclude, size_t n_exclude,
                                          int flags, rr_comm_t** out);
/* Communicator::grow and ::join: collective over comm, *out a communicator of its ranks and
 * `newcomers` new processes, each of which calls rr_comm_join(name, &out) (the job's store from
 * the environment, as rr_comm_init_from_env finds it; its error in rr_last_error(NULL)). */
RINGREDUCE_API rr_result_t rr_comm_grow(rr_comm_t* comm, const char* name, int newcomers,
                                        rr_comm_t** out);
RINGREDUCE_API rr_result_t rr_comm_join(const char* name, rr_comm_t** out);
/* Collective: `bytes` of memory registered with this host's ranks (Communicator::alloc: large
 * allreduces on it read and write the peers' buffers in place); *ptr is NULL on an error. Valid
 * until rr_mem_free or the communicator's destruction. */
RINGREDUCE_API rr_result_t rr_mem_alloc(rr_comm_t* comm, size_t bytes, void** ptr);
/* Collective: frees what rr_mem_alloc returned (every rank its pointer from the same call; NULL
 * on every rank does nothing). */
RINGREDUCE_API rr_result_t rr_mem_free(rr_comm_t* comm, void* ptr);

/* Blocking collectives; counts are elements (see the C++ header for each collective's layout). */
RINGREDUCE_API rr_result_t rr_allreduce(rr_comm_t* comm, const void* send, void* recv, size_t count,
                                        rr_dtype_t dtype, rr_op_t op);
/* op RR_PREMUL_SUM with this rank's factor. */
RINGREDUCE_API rr_result_t rr_allreduce_premul_sum(rr_comm_t* comm, const void* send, void* recv,
                                                   size_t count, rr_dtype_t dtype, double factor);
RINGREDUCE_API rr_result_t rr_reduce_scatter(rr_comm_t* comm, const void* send, void* recv,
                                             size_t recv_count, rr_dtype_t dtype, rr_op_t op);
RINGREDUCE_API rr_result_t rr_allgather(rr_comm_t* comm, const void* send, void* recv,
                                        size_t send_count, rr_dtype_t dtype);
/* The same three with a wire format (RR_INVALID_ARGUMENT where it cannot apply: not float32, or
 * an op other than sum, avg, premul_sum). */
RINGREDUCE_API rr_result_t rr_allreduce_wire(rr_comm_t* comm, const void* send, void* recv,
                                             size_t count, rr_dtype_t dtype, rr_op_t op,
                                             rr_wire_t wire);
RINGREDUCE_API rr_result_t rr_reduce_scatter_wire(rr_comm_t* comm, const void* send, void* recv,
                                                  size_t recv_count, rr_dtype_t dtype, rr_op_t op,
                                                  rr_wire_t wire);
RINGREDUCE_API rr_result_t rr_allgather_wire(rr_comm_t* comm, const void* send, void* recv,
                                             size_t send_count, rr_dtype_t dtype, rr_wire_t wire);
RINGREDUCE_API rr_result_t rr_broadcast(rr_comm_t* comm, void* buffer, size_t count,
                                        rr_dtype_t dtype, int root);
RINGREDUCE_API rr_result_t rr_reduce(rr_comm_t* comm, const void* send, void* recv, size_t count,
                                     rr_dtype_t dtype, rr_op_t op, int root);
RINGREDUCE_API rr_result_t rr_alltoall(rr_comm_t* comm, const void* send, void* recv, size_t count,
                                       rr_dtype_t dtype);
RINGREDUCE_API rr_result_t rr_barrier(rr_comm_t* comm);
/* recv (root only; may be NULL elsewhere) holds size * count elements, block r from rank r. */
RINGREDUCE_API rr_result_t rr_gather(rr_comm_t* comm, const void* send, void* recv, size_t count,
                                     rr_dtype_t dtype, int root);
/* send (root only; may be NULL elsewhere) holds size * count elements, block r for rank r. */
RINGREDUCE_API rr_result_t rr_scatter(rr_comm_t* comm, const void* send, void* recv, size_t count,
                                      rr_dtype_t dtype, int root);
/* Blocks of their own sizes: counts has one entry per rank (the same on every rank); recv holds
 * their total, one block after another; send holds counts[rank]. */
RINGREDUCE_API rr_result_t rr_allgatherv(rr_comm_t* comm, const void* send, void* recv,
                                         const size_t* counts, rr_dtype_t dtype);
/* send holds the total of counts (the same on every rank); recv gets counts[rank], reduced. */
RINGREDUCE_API rr_result_t rr_reduce_scatterv(rr_comm_t* comm, const void* send, void* recv,
                                              const size_t* counts, rr_dtype_t dtype, rr_op_t op);
/* send_counts[j] elements to rank j, recv_counts[j] from rank j, blocks one after another. */
RINGREDUCE_API rr_result_t rr_alltoallv(rr_comm_t* comm, const void* send,
                                        const size_t* send_counts, void* recv,
                                        const size_t* recv_counts, rr_dtype_t dtype);

/* Point to point: messages matched by (sender, tag) in their own space, in any order relative to
 * the collectives. peer RR_ANY_SOURCE receives from whichever rank sends first; *source (may be
 * NULL) gets the rank whose message was taken. Sizes must agree (a mismatch fails the
 * communicator with RR_ERR_MISMATCH on every rank). */
#define RR_ANY_SOURCE (-1)
RINGREDUCE_API rr_result_t rr_send(rr_comm_t* comm, const void* buf, size_t count, rr_dtype_t dtype,
                                   int peer, uint64_t tag);
RINGREDUCE_API rr_result_t rr_recv(rr_comm_t* comm, void* buf, size_t count, rr_dtype_t dtype,
                                   int peer, uint64_t tag, int* source);
RINGREDUCE_API rr_result_t rr_send_async(rr_comm_t* comm, const void* buf, size_t count,
                                         rr_dtype_t dtype, int peer, uint64_t tag,
                                         rr_work_t** work);
RINGREDUCE_API rr_result_t rr_recv_async(rr_comm_t* comm, void* buf, size_t count, rr_dtype_t dtype,
                                         int peer, uint64_t tag, rr_work_t** work);
/* For a completed receive: the rank whose message it took; -1 otherwise. */
RINGREDUCE_API int rr_work_source(const rr_work_t* work);

/* Asynchronous allreduce; the handle must be released with rr_work_free. */
RINGREDUCE_API rr_result_t rr_allreduce_async(rr_comm_t* comm, const void* send, void* recv,
                                              size_t count, rr_dtype_t dtype, rr_op_t op,
                                              rr_work_t** work);
RINGREDUCE_API rr_result_t rr_work_wait(rr_work_t* work);
/* *done = 1 when complete; never blocks. */
RINGREDUCE_API rr_result_t rr_work_test(rr_work_t* work, int* done);
RINGREDUCE_API void rr_work_free(rr_work_t* work);

/* Stream-ordered calls on CUDA device memory (NCCL's semantics): the call is enqueued on
 * `stream` (a cudaStream_t; NULL: the legacy default stream) and returns at once; the stream's
 * later work sees the result. A call refused at once (a bad argument, a communicator that has
 * failed) returns its error; a failure after it has returned is what rr_comm_async_error reports,
 * and fails every later call. Without a usable CUDA device they fail with
 * RR_ERR_INVALID_ARGUMENT. docs/GPU.md. */
RINGREDUCE_API rr_result_t rr_allreduce_on_stream(rr_comm_t* comm, const void* send, void* recv,
                                                  size_t count, rr_dtype_t dtype, rr_op_t op,
                                                  void* stream);
RINGREDUCE_API rr_result_t rr_reduce_scatter_on_stream(rr_comm_t* comm, const void* send,
                                                       void* recv, size_t recv_count,
                                                       rr_dtype_t dtype, rr_op_t op, void* stream);
RINGREDUCE_API rr_result_t rr_allgather_on_stream(rr_comm_t* comm, const void* send, void* recv,
                                                  size_t send_count, rr_dtype_t dtype,
                                                  void* stream);
/* Out of place: the root sends from send; every rank receives into recv (send == recv: in place).
 */
RINGREDUCE_API rr_result_t rr_broadcast_on_stream(rr_comm_t* comm, const void* send, void* recv,
                                                  size_t count, rr_dtype_t dtype, int root,
                                                  void* stream);
RINGREDUCE_API rr_result_t rr_reduce_on_stream(rr_comm_t* comm, const void* send, void* recv,
                                               size_t count, rr_dtype_t dtype, rr_op_t op, int root,
                                               void* stream);
/* A send waits in the calling thread until the stream has reached it (its data leaves from host
 * staging); a receive is enqueued like the collectives. Issue a send before a receive on one
 * stream: a receive holds its stream until its message has arrived. */
RINGREDUCE_API rr_result_t rr_send_on_stream(rr_comm_t* comm, const void* buf, size_t count,
                                             rr_dtype_t dtype, int peer, uint64_t tag,
                                             void* stream);
RINGREDUCE_API rr_result_t rr_recv_on_stream(rr_comm_t* comm, void* buf, size_t count,
                                             rr_dtype_t dtype, int peer, uint64_t tag,
                                             void* stream);
/* RR_OK, or the error of the first stream-ordered call that failed after returning (its message
 * in rr_last_error(comm)); never blocks (ncclCommGetAsyncError). */
RINGREDUCE_API rr_result_t rr_comm_async_error(rr_comm_t* comm);

/* The message of the last failure on comm, or of the last failed init in this thread when comm is
 * NULL. Valid until the next call on comm (or init in this thread). */
RINGREDUCE_API const char* rr_last_error(const rr_comm_t* comm);
RINGREDUCE_API const char* rr_strerror(rr_result_t result);

/* The library's version, "0.2.0": the one it was built as, which may differ from the header's
 * RINGREDUCE_VERSION_STRING when an application runs with another release of the library. */
RINGREDUCE_API const char* rr_version(void);

#ifdef __cplusplus
}
#endif

#endif /* RINGREDUCE_H_ */
