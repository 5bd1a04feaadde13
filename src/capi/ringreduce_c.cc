// The C ABI: every entry point catches everything, so no exception crosses into C.
#include "ringreduce/ringreduce.h"

#include <cstdio>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "ringreduce/communicator.h"

struct rr_comm {
  std::unique_ptr<ringreduce::Communicator> comm;
  mutable std::mutex mu;
  std::string last_error;
  // Stream-ordered calls not yet known to have completed, and the first failure among them
  // (rr_comm_async_error). Guarded by mu.
  std::vector<ringreduce::Work> on_stream;
  rr_result_t async_result = RR_OK;
  std::string async_error;
};

struct rr_work {
  rr_comm* owner;
  ringreduce::Work work;
};

namespace {

thread_local std::string t_init_error;

// The handles this library made and has not destroyed. A call on any other pointer (destroyed,
// freed, or never made here) is an error code, not a crash. A shared lock: calls from many
// threads do not serialise on it. What it cannot catch: a handle destroyed while another thread
// is inside a call on it (the caller's contract), and a destroyed handle whose address a new one
// has been given since.
std::shared_mutex g_live_mu;
std::unordered_set<const void*> g_live;

void make_live(const void* h) {
  std::unique_lock<std::shared_mutex> lk(g_live_mu);
  g_live.insert(h);
}
// False if h was not live (a second destroy is then a no-op).
bool make_dead(const void* h) {
  std::unique_lock<std::shared_mutex> lk(g_live_mu);
  return g_live.erase(h) > 0;
}
bool live(const void* h) {
  if (h == nullptr) return false;
  std::shared_lock<std::shared_mutex> lk(g_live_mu);
  return g_live.count(h) > 0;
}
// The error a call on a handle that is not live reports (rr_last_error with that handle, or
// with NULL, returns it).
rr_result_t not_live(const void* h, const char* what) {
  char buf[160];
  std::snprintf(buf, sizeof buf,
                "%s %p is not a live handle (destroyed or freed already, or not made by "
                "ringreduce)",
                what, h);
  t_init_error = buf;
  return RR_ERR_INVALID_ARGUMENT;
}

rr_result_t code_of(const ringreduce::Error& e) {
  return static_cast<rr_result_t>(e.code());
}

// Runs fn, turning any exception into a result code and a message kept in *error.
template <typename Fn>
rr_result_t guarded(std::string* error, std::mutex* mu, Fn&& fn) {
  try {
    fn();
    return RR_OK;
  } catch (const ringreduce::Error& e) {
    if (mu) {
      std::lock_guard<std::mutex> lock(*mu);
      *error = e.what();
    } else {
      *error = e.what();
    }
    return code_of(e);
  } catch (const std::exception& e) {
    if (mu) {
      std::lock_guard<std::mutex> lock(*mu);
      *error = e.what();
    } else {
      *error = e.what();
    }
    return RR_ERR_INTERNAL;
  } catch (...) {
    *error = "unknown error";
    return RR_ERR_INTERNAL;
  }
}

#define RR_CHECK_COMM(c)                              \
  if ((c) == nullptr) return RR_ERR_INVALID_ARGUMENT; \
  if (!live(c)) return not_live(c, "rr_comm_t")
#define RR_ON(c, body) guarded(&(c)->last_error, &(c)->mu, [&] { body; })

// The C enums mirror the C++ ones value for value (the casts below rely on it).
static_assert(RR_U64 == static_cast<int>(ringreduce::DataType::u64) &&
              RR_I16 == static_cast<int>(ringreduce::DataType::i16) &&
              RR_BOOL == static_cast<int>(ringreduce::DataType::boolean) &&
              RR_BOOL + 1 == ringreduce::kNumDataTypes);
static_assert(RR_AVG == static_cast<int>(ringreduce::ReduceOp::avg) &&
              RR_BXOR == static_cast<int>(ringreduce::ReduceOp::bxor) &&
              RR_PREMUL_SUM == static_cast<int>(ringreduce::ReduceOp::premul_sum) &&
              RR_PREMUL_SUM + 1 == ringreduce::kNumReduceOps);

ringreduce::DataType dt(rr_dtype_t t) {
  return static_cast<ringreduce::DataType>(t);
}
ringreduce::ReduceOp op_of(rr_op_t o) {
  return static_cast<ringreduce::ReduceOp>(o);
}

// Makes a Work handle for an async call; the handle is released with rr_work_free.
template <typename Fn>
rr_result_t start_async(rr_comm_t* c, rr_work_t** work, Fn&& fn) {
  RR_CHECK_COMM(c);
  if (work == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *work = nullptr;
  return RR_ON(c, {
    auto w = std::make_unique<rr_work>();
    w->owner = c;
    w->work = fn();
    make_live(w.get());
    *work = w.release();
  });
}

// A Work may outlive its communicator (its op is its own): its error then goes where an init's
// does (rr_last_error(NULL)).
template <typename Fn>
rr_result_t on_work(rr_work_t* w, Fn&& fn) {
  if (w == nullptr) return RR_ERR_INVALID_ARGUMENT;
  if (!live(w)) return not_live(w, "rr_work_t");
  if (live(w->owner)) return RR_ON(w->owner, fn());
  return guarded(&t_init_error, nullptr, fn);
}

}  // namespace

extern "C" {

rr_result_t rr_comm_init_from_env(rr_comm_t** out) {
  if (out == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded(&t_init_error, nullptr, [&] {
    auto c = std::make_unique<rr_comm>();
    c->comm = std::make_unique<ringreduce::Communicator>(ringreduce::Communicator::from_env());
    make_live(c.get());
    *out = c.release();
  });
}

rr_result_t rr_comm_init(rr_comm_t** out, int rank, int size, const char* addr, const char* token,
                         double timeout_s) {
  if (out == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded(&t_init_error, nullptr, [&] {
    ringreduce::Options o;
    o.rank = rank;
    o.world_size = size;
    if (addr) o.addr = addr;
    if (token) o.token = token;
    if (timeout_s > 0)
      o.timeout = std::chrono::milliseconds(static_cast<int64_t>(timeout_s * 1000));
    auto c = std::make_unique<rr_comm>();
    c->comm = std::make_unique<ringreduce::Communicator>(o);
    make_live(c.get());
    *out = c.release();
  });
}

void rr_comm_destroy(rr_comm_t* comm) {
  if (make_dead(comm)) delete comm;
}
int rr_comm_rank(const rr_comm_t* comm) {
  return live(comm) ? comm->comm->rank() : -1;
}
int rr_comm_size(const rr_comm_t* comm) {
  return live(comm) ? comm->comm->size() : -1;
}

rr_result_t rr_comm_abort(rr_comm_t* c, const char* reason) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->abort(reason ? reason : "rr_comm_abort"));
}

rr_result_t rr_comm_split(rr_comm_t* c, int color, int key, rr_comm_t** out) {
  RR_CHECK_COMM(c);
  if (out == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return RR_ON(c, {
    ringreduce::Communicator child = c->comm->split(color, key);
    if (!child.valid()) return;
    auto w = std::make_unique<rr_comm>();
    w->comm = std::make_unique<ringreduce::Communicator>(std::move(child));
    make_live(w.get());
    *out = w.release();
  });
}

rr_result_t rr_comm_set_timeout(rr_comm_t* c, double timeout_s) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->set_timeout(std::chrono::milliseconds(
                      static_cast<int64_t>(std::max(0.0, timeout_s) * 1000))));
}

rr_result_t rr_comm_get_error(rr_comm_t* c) {
  RR_CHECK_COMM(c);
  std::exception_ptr e = c->comm->error();
  if (!e) return RR_OK;
  return RR_ON(c, std::rethrow_exception(e));
}

rr_result_t rr_comm_agree(rr_comm_t* c, int* flag, int* failed, size_t max_failed,
                          size_t* n_failed) {
  RR_CHECK_COMM(c);
  if (flag == nullptr || (failed == nullptr && max_failed > 0)) return RR_ERR_INVALID_ARGUMENT;
  return RR_ON(c, {
    const ringreduce::Agreement a = c->comm->agree(*flag != 0);
    *flag = a.flag ? 1 : 0;
    for (size_t i = 0; i < a.failed.size() && i < max_failed; ++i) failed[i] = a.failed[i];
    if (n_failed) *n_failed = a.failed.size();
  });
}

rr_result_t rr_comm_shrink(rr_comm_t* c, const int* exclude, size_t n_exclude, int flags,
                           rr_comm_t** out) {
  RR_CHECK_COMM(c);
  if (out == nullptr || (exclude == nullptr && n_exclude > 0)) return RR_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return RR_ON(c, {
    ringreduce::Communicator child = c->comm->shrink(std::span<const int>(exclude, n_exclude),
                                                     static_cast<ringreduce::ShrinkFlags>(flags));
    auto w = std::make_unique<rr_comm>();
    w->comm = std::make_unique<ringreduce::Communicator>(std::move(child));
    make_live(w.get());
    *out = w.release();
  });
}

rr_result_t rr_comm_grow(rr_comm_t* c, const char* name, int newcomers, rr_comm_t** out) {
  RR_CHECK_COMM(c);
  if (out == nullptr || name == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return RR_ON(c, {
    auto w = std::make_unique<rr_comm>();
    w->comm = std::make_unique<ringreduce::Communicator>(c->comm->grow(name, newcomers));
    make_live(w.get());
    *out = w.release();
  });
}

rr_result_t rr_comm_join(const char* name, rr_comm_t** out) {
  if (out == nullptr || name == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *out = nullptr;
  return guarded(&t_init_error, nullptr, [&] {
    auto w = std::make_unique<rr_comm>();
    w->comm = std::make_unique<ringreduce::Communicator>(ringreduce::Communicator::join(name));
    make_live(w.get());
    *out = w.release();
  });
}

rr_result_t rr_mem_alloc(rr_comm_t* c, size_t bytes, void** ptr) {
  RR_CHECK_COMM(c);
  if (ptr == nullptr) return RR_ERR_INVALID_ARGUMENT;
  *ptr = nullptr;
  return RR_ON(c, *ptr = c->comm->alloc(bytes));
}

rr_result_t rr_mem_free(rr_comm_t* c, void* ptr) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->free(ptr));
}

rr_result_t rr_allreduce(rr_comm_t* c, const void* send, void* recv, size_t count, rr_dtype_t dtype,
                         rr_op_t op) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->allreduce(send, recv, count, dt(dtype), op_of(op)));
}

rr_result_t rr_allreduce_premul_sum(rr_comm_t* c, const void* send, void* recv, size_t count,
                                    rr_dtype_t dtype, double factor) {
  RR_CHECK_COMM(c);
  ringreduce::CallOptions call;
  call.premul_factor = factor;
  return RR_ON(
      c, c->comm->allreduce(send, recv, count, dt(dtype), ringreduce::ReduceOp::premul_sum, call));
}

namespace {

static_assert(RR_WIRE_AUTO == static_cast<int>(ringreduce::Wire::automatic) &&
              RR_WIRE_FP8E5M2 == static_cast<int>(ringreduce::Wire::fp8e5m2) &&
              RR_WIRE_AUTO + 1 == ringreduce::kNumWires);

// A call's options with its wire format (RR_WIRE_DEFAULT: unset, RINGREDUCE_WIRE decides).
ringreduce::CallOptions wire_call(rr_wire_t w, const char* fn) {
  ringreduce::CallOptions call;
  if (w == RR_WIRE_DEFAULT) return call;
  if (w < RR_WIRE_NONE || w > RR_WIRE_AUTO)
    throw ringreduce::InvalidArgument(std::string(fn) + ": unknown wire format " +
                                      std::to_string(static_cast<int>(w)));
  call.wire = static_cast<ringreduce::Wire>(w);
  return call;
}

}  // namespace

rr_result_t rr_allreduce_wire(rr_comm_t* c, const void* send, void* recv, size_t count,
                              rr_dtype_t dtype, rr_op_t op, rr_wire_t wire) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->allreduce(send, recv, count, dt(dtype), op_of(op),
                                     wire_call(wire, "rr_allreduce_wire")));
}

rr_result_t rr_reduce_scatter_wire(rr_comm_t* c, const void* send, void* recv, size_t recv_count,
                                   rr_dtype_t dtype, rr_op_t op, rr_wire_t wire) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->reduce_scatter(send, recv, recv_count, dt(dtype), op_of(op),
                                          wire_call(wire, "rr_reduce_scatter_wire")));
}

rr_result_t rr_allgather_wire(rr_comm_t* c, const void* send, void* recv, size_t send_count,
                              rr_dtype_t dtype, rr_wire_t wire) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->allgather(send, recv, send_count, dt(dtype),
                                     wire_call(wire, "rr_allgather_wire")));
}

rr_result_t rr_reduce_scatter(rr_comm_t* c, const void* send, void* recv, size_t recv_count,
                              rr_dtype_t dtype, rr_op_t op) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->reduce_scatter(send, recv, recv_count, dt(dtype), op_of(op)));
}

rr_result_t rr_allgather(rr_comm_t* c, const void* send, void* recv, size_t send_count,
                         rr_dtype_t dtype) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->allgather(send, recv, send_count, dt(dtype)));
}

rr_result_t rr_broadcast(rr_comm_t* c, void* buffer, size_t count, rr_dtype_t dtype, int root) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->broadcast(buffer, count, dt(dtype), root));
}

rr_result_t rr_reduce(rr_comm_t* c, const void* send, void* recv, size_t count, rr_dtype_t dtype,
                      rr_op_t op, int root) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->reduce(send, recv, count, dt(dtype), op_of(op), root));
}

rr_result_t rr_alltoall(rr_comm_t* c, const void* send, void* recv, size_t count,
                        rr_dtype_t dtype) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->alltoall(send, recv, count, dt(dtype)));
}

rr_result_t rr_gather(rr_comm_t* c, const void* send, void* recv, size_t count, rr_dtype_t dtype,
                      int root) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->gather(send, recv, count, dt(dtype), root));
}

rr_result_t rr_scatter(rr_comm_t* c, const void* send, void* recv, size_t count, rr_dtype_t dtype,
                       int root) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->scatter(send, recv, count, dt(dtype), root));
}

// One count per rank (size() entries); a null array is an error, not a crash.
#define RR_COUNTS(c, p) std::span<const size_t>(p, p ? static_cast<size_t>(c->comm->size()) : 0)

rr_result_t rr_allgatherv(rr_comm_t* c, const void* send, void* recv, const size_t* counts,
                          rr_dtype_t dtype) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->allgatherv(send, recv, RR_COUNTS(c, counts), dt(dtype)));
}

rr_result_t rr_reduce_scatterv(rr_comm_t* c, const void* send, void* recv, const size_t* counts,
                               rr_dtype_t dtype, rr_op_t op) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->reduce_scatterv(send, recv, RR_COUNTS(c, counts), dt(dtype), op_of(op)));
}

rr_result_t rr_alltoallv(rr_comm_t* c, const void* send, const size_t* send_counts, void* recv,
                         const size_t* recv_counts, rr_dtype_t dtype) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->alltoallv(send, RR_COUNTS(c, send_counts), recv,
                                     RR_COUNTS(c, recv_counts), dt(dtype)));
}
#undef RR_COUNTS

rr_result_t rr_barrier(rr_comm_t* c) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->barrier());
}

rr_result_t rr_send(rr_comm_t* c, const void* buf, size_t count, rr_dtype_t dtype, int peer,
                    uint64_t tag) {
  RR_CHECK_COMM(c);
  return RR_ON(c, c->comm->send(buf, count, dt(dtype), peer, tag));
}

rr_result_t rr_recv(rr_comm_t* c, void* buf, size_t count, rr_dtype_t dtype, int peer, uint64_t tag,
                    int* source) {
  RR_CHECK_COMM(c);
  return RR_ON(c, {
    const int from = c->comm->recv(buf, count, dt(dtype), peer, tag);
    if (source) *source = from;
  });
}

rr_result_t rr_send_async(rr_comm_t* c, const void* buf, size_t count, rr_dtype_t dtype, int peer,
                          uint64_t tag, rr_work_t** work) {
  return start_async(c, work,
                     [&] { return c->comm->send_async(buf, count, dt(dtype), peer, tag); });
}

rr_result_t rr_recv_async(rr_comm_t* c, void* buf, size_t count, rr_dtype_t dtype, int peer,
                          uint64_t tag, rr_work_t** work) {
  return start_async(c, work,
                     [&] { return c->comm->recv_async(buf, count, dt(dtype), peer, tag); });
}

rr_result_t rr_allreduce_async(rr_comm_t* c, const void* send, void* recv, size_t count,
                               rr_dtype_t dtype, rr_op_t op, rr_work_t** work) {
  return start_async(
      c, work, [&] { return c->comm->allreduce_async(send, recv, count, dt(dtype), op_of(op)); });
}

int rr_work_source(const rr_work_t* w) {
  return live(w) ? w->work.source() : -1;
}

rr_result_t rr_work_wait(rr_work_t* w) {
  return on_work(w, [&] { w->work.wait(); });
}

rr_result_t rr_work_test(rr_work_t* w, int* done) {
  if (done == nullptr) return RR_ERR_INVALID_ARGUMENT;
  return on_work(w, [&] { *done = w->work.test() ? 1 : 0; });
}

void rr_work_free(rr_work_t* w) {
  if (make_dead(w)) delete w;
}

const char* rr_last_error(const rr_comm_t* c) {
  if (c == nullptr || !live(c)) return t_init_error.c_str();
  std::lock_guard<std::mutex> lock(c->mu);
  return c->last_error.c_str();
}

const char* rr_version(void) {
  return RINGREDUCE_VERSION_STRING;
}

const char* rr_strerror(rr_result_t r) {
  switch (r) {
    case RR_OK:
      return "success";
    case RR_ERR_INTERNAL:
      return "internal error";
    case RR_ERR_INVALID_ARGUMENT:
      return "invalid argument";
    case RR_ERR_TIMEOUT:
      return "timeout";
    case RR_ERR_PEER:
      return "peer failure";
    case RR_ERR_MISMATCH:
      return "mismatched collective";
    case RR_ERR_ABORTED:
      return "aborted";
  }
  return "unknown result";
}

}  // extern "C"

// ---- stream-ordered calls --------------------------------------------------------------------

namespace {

// Drops the completed stream-ordered calls, keeping the first failure (c->mu held).
void reap_locked(rr_comm* c) {
  std::erase_if(c->on_stream, [&](ringreduce::Work& w) {
    try {
      return w.test();
    } catch (const ringreduce::Error& e) {
      if (c->async_result == RR_OK) c->async_result = code_of(e), c->async_error = e.what();
    } catch (const std::exception& e) {
      if (c->async_result == RR_OK) c->async_result = RR_ERR_INTERNAL, c->async_error = e.what();
    }
    return true;
  });
}

// Issues a call on device memory ordered on `stream`; its Work is kept until it has completed.
template <typename Fn>
rr_result_t on_stream(rr_comm* c, void* stream, Fn&& issue) {
  return RR_ON(c, {
    ringreduce::CallOptions call;
    call.memory = ringreduce::Memory::device;
    call.stream = stream;
    ringreduce::Work w = issue(call);
    w.test();  // throws now for a call refused at once or a communicator that has failed
    std::lock_guard<std::mutex> lock(c->mu);
    reap_locked(c);
    c->on_stream.push_back(std::move(w));
  });
}

}  // namespace

rr_result_t rr_allreduce_on_stream(rr_comm_t* c, const void* send, void* recv, size_t count,
                                   rr_dtype_t dtype, rr_op_t op, void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->allreduce_async(send, recv, count, dt(dtype), op_of(op), call);
  });
}

rr_result_t rr_reduce_scatter_on_stream(rr_comm_t* c, const void* send, void* recv,
                                        size_t recv_count, rr_dtype_t dtype, rr_op_t op,
                                        void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->reduce_scatter_async(send, recv, recv_count, dt(dtype), op_of(op), call);
  });
}

rr_result_t rr_allgather_on_stream(rr_comm_t* c, const void* send, void* recv, size_t send_count,
                                   rr_dtype_t dtype, void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->allgather_async(send, recv, send_count, dt(dtype), call);
  });
}

rr_result_t rr_broadcast_on_stream(rr_comm_t* c, const void* send, void* recv, size_t count,
                                   rr_dtype_t dtype, int root, void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->broadcast_async(send, recv, count, dt(dtype), root, call);
  });
}

rr_result_t rr_reduce_on_stream(rr_comm_t* c, const void* send, void* recv, size_t count,
                                rr_dtype_t dtype, rr_op_t op, int root, void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->reduce_async(send, recv, count, dt(dtype), op_of(op), root, call);
  });
}

rr_result_t rr_send_on_stream(rr_comm_t* c, const void* buf, size_t count, rr_dtype_t dtype,
                              int peer, uint64_t tag, void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->send_async(buf, count, dt(dtype), peer, tag, call);
  });
}

rr_result_t rr_recv_on_stream(rr_comm_t* c, void* buf, size_t count, rr_dtype_t dtype, int peer,
                              uint64_t tag, void* stream) {
  RR_CHECK_COMM(c);
  return on_stream(c, stream, [&](const ringreduce::CallOptions& call) {
    return c->comm->recv_async(buf, count, dt(dtype), peer, tag, call);
  });
}

rr_result_t rr_comm_async_error(rr_comm_t* c) {
  RR_CHECK_COMM(c);
  std::lock_guard<std::mutex> lock(c->mu);
  reap_locked(c);
  if (c->async_result != RR_OK) c->last_error = c->async_error;
  return c->async_result;
}
