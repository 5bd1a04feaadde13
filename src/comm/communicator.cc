// The public API: thin wrappers that turn calls into ops for CommImpl.
#include "ringreduce/communicator.h"

#include "comm/comm_impl.h"
#include "comm/device.h"

namespace ringreduce {

using algorithms::Args;
using algorithms::Collective;

// ---- Work ------------------------------------------------------------------------------------

void Work::wait() {
  if (!state_) throw InvalidArgument("wait() on an empty Work");
  // A finished op needs nothing from its communicator, which may be gone by now.
  if (state_->finished.load()) {
    if (state_->error) std::rethrow_exception(state_->error);
    return;
  }
  state_->comm->wait(*state_, std::nullopt);
}

bool Work::wait(std::chrono::milliseconds timeout) {
  if (!state_) throw InvalidArgument("wait() on an empty Work");
  if (state_->finished.load()) {
    if (state_->error) std::rethrow_exception(state_->error);
    return true;
  }
  return state_->comm->wait(*state_, timeout);
}

bool Work::test() {
  return wait(std::chrono::milliseconds(0));
}

void Work::then(std::function<void(std::exception_ptr)> fn) {
  if (!state_) throw InvalidArgument("then() on an empty Work");
  {
    std::lock_guard<std::mutex> lk(state_->callback_mu);
    if (!state_->fired) {
      state_->callback = std::move(fn);
      return;
    }
  }
  fn(state_->error);
}

void Work::wait_output() {
  wait();
  if (state_->stage) state_->stage->wait_output();
}

int Work::source() const {
  if (!state_ || !state_->is_p2p || state_->p2p.is_send || !state_->finished.load()) return -1;
  return state_->p2p.source;
}

std::string Work::algorithm() const {
  if (state_ && state_->is_p2p) return "p2p";
  if (!state_ || !state_->plan.algorithm) return "";
  const size_t seg = state_->plan.segment_bytes;
  std::string s = std::string(state_->plan.algorithm->name) + " seg=";
  s += seg % 1024 == 0 ? std::to_string(seg / 1024) + "K" : std::to_string(seg);
  return s + " ch=" + std::to_string(state_->plan.channels);
}

// ---- Communicator ----------------------------------------------------------------------------

Communicator Communicator::from_env(const Options& options) {
  return Communicator(options);
}

Endpoint::Endpoint(const Options& options)
    : impl_(std::make_unique<detail::EndpointImpl>(options)) {}
Endpoint::~Endpoint() = default;
Endpoint::Endpoint(Endpoint&&) noexcept = default;
Endpoint& Endpoint::operator=(Endpoint&&) noexcept = default;
const std::string& Endpoint::handle() const {
  if (!impl_) throw InvalidArgument("handle() on a moved-from Endpoint");
  return impl_->handle;
}

Communicator Communicator::from_handles(Endpoint endpoint, uint64_t uuid,
                                        std::span<const std::string> handles,
                                        const Options& options) {
  if (!endpoint.impl_) throw InvalidArgument("from_handles: a moved-from Endpoint");
  return Communicator(detail::CommImpl::from_handles(*endpoint.impl_, uuid, handles, options));
}

Communicator::Communicator(const Options& options)
    : impl_(std::make_unique<detail::CommImpl>(options)) {}
Communicator::Communicator(std::unique_ptr<detail::CommImpl> impl) : impl_(std::move(impl)) {}
Communicator::~Communicator() = default;
Communicator::Communicator(Communicator&&) noexcept = default;
Communicator& Communicator::operator=(Communicator&&) noexcept = default;

detail::CommImpl& Communicator::impl() const {
  if (!impl_)
    throw InvalidArgument(
        "an empty communicator (moved from, or a split() with kNoColor) has no ops");
  return *impl_;
}

Communicator Communicator::split(int color, int key) {
  return Communicator(impl().split(color, key));
}

const char* Communicator::version() {
  return RINGREDUCE_VERSION_STRING;
}

int Communicator::rank() const {
  return impl().rank();
}
uint64_t Communicator::sequence_number() const {
  return impl().sequence_number();
}
int Communicator::size() const {
  return impl().size();
}
std::string Communicator::tuning() const {
  return impl().tuning();
}
void* Communicator::alloc(size_t bytes) {
  return impl().alloc(bytes);
}
void Communicator::free(void* p) {
  impl().free(p);
}
void Communicator::abort(const std::string& reason) {
  impl().abort(reason);
}

std::exception_ptr Communicator::error() const {
  return impl().error();
}

void Communicator::set_timeout(std::chrono::milliseconds timeout) {
  impl().set_timeout(timeout);
}

void Communicator::on_abort(std::function<void(std::exception_ptr)> fn) {
  impl().on_abort(std::move(fn));
}

Agreement Communicator::agree(bool flag, const CallOptions& call) {
  return impl().agree(flag, call);
}

Communicator Communicator::shrink(std::span<const int> exclude, ShrinkFlags flags,
                                  const CallOptions& call) {
  return Communicator(impl().shrink(exclude, flags, call));
}

std::vector<int> Communicator::parent_ranks() const {
  return impl().parent_ranks();
}

Communicator Communicator::grow(const std::string& name, int newcomers, const CallOptions& call) {
  return Communicator(impl().grow(name, newcomers, call));
}

Communicator Communicator::join(const std::string& name, const Options& options) {
  return Communicator(detail::CommImpl::join(name, options));
}

void Communicator::check_same_size(size_t a, size_t b, const char* call) const {
  if (a != b)
    throw InvalidArgument("rank " + std::to_string(rank()) + ": " + call +
                          ": send and receive spans do not match (" + std::to_string(a) + " vs " +
                          std::to_string(b) + " elements)");
}

namespace {
Args make(Collective kind, const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
          int root) {
  Args a;
  a.kind = kind;
  a.send = send;
  a.recv = recv;
  a.count = count;
  a.dtype = dtype;
  a.op = op;
  a.root = root;
  return a;
}

// Blocks of their own sizes: Args::counts (and recv_counts), count their total. alltoallv's counts
// are each rank's own, so its count is 0: the tuner's plan (and the tag) must be the same on
// every rank.
Args make_v(Collective kind, const void* send, void* recv, std::span<const size_t> counts,
            std::span<const size_t> recv_counts, DataType dtype, ReduceOp op) {
  Args a = make(kind, send, recv, 0, dtype, op, 0);
  a.counts.assign(counts.begin(), counts.end());
  a.recv_counts.assign(recv_counts.begin(), recv_counts.end());
  if (kind != Collective::alltoallv)
    for (size_t c : counts) a.count += c;
  return a;
}
}  // namespace

#define RR_SUBMIT(args, call, async) detail::CommImpl::make_work(impl().submit(args, call, async))

Work Communicator::allreduce_async(const void* send, void* recv, size_t count, DataType dtype,
                                   ReduceOp op, const CallOptions& call) {
  return RR_SUBMIT(make(Collective::allreduce, send, recv, count, dtype, op, 0), call, true);
}
Work Communicator::reduce_scatter_async(const void* send, void* recv, size_t recv_count,
                                        DataType dtype, ReduceOp op, const CallOptions& call) {
  return RR_SUBMIT(make(Collective::reduce_scatter, send, recv, recv_count, dtype, op, 0), call,
                   true);
}
Work Communicator::allgather_async(const void* send, void* recv, size_t send_count, DataType dtype,
                                   const CallOptions& call) {
  return RR_SUBMIT(make(Collective::allgather, send, recv, send_count, dtype, ReduceOp::sum, 0),
                   call, true);
}
Work Communicator::broadcast_async(void* buffer, size_t count, DataType dtype, int root,
                                   const CallOptions& call) {
  return RR_SUBMIT(make(Collective::broadcast, buffer, buffer, count, dtype, ReduceOp::sum, root),
                   call, true);
}
Work Communicator::broadcast_async(const void* send, void* recv, size_t count, DataType dtype,
                                   int root, const CallOptions& call) {
  return RR_SUBMIT(make(Collective::broadcast, send, recv, count, dtype, ReduceOp::sum, root), call,
                   true);
}
Work Communicator::reduce_async(const void* send, void* recv, size_t count, DataType dtype,
                                ReduceOp op, int root, const CallOptions& call) {
  return RR_SUBMIT(make(Collective::reduce, send, recv, count, dtype, op, root), call, true);
}
Work Communicator::alltoall_async(const void* send, void* recv, size_t count, DataType dtype,
                                  const CallOptions& call) {
  return RR_SUBMIT(make(Collective::alltoall, send, recv, count, dtype, ReduceOp::sum, 0), call,
                   true);
}
Work Communicator::barrier_async(const CallOptions& call) {
  return RR_SUBMIT(make(Collective::barrier, nullptr, nullptr, 0, DataType::u8, ReduceOp::sum, 0),
                   call, true);
}

Work Communicator::gather_async(const void* send, void* recv, size_t count, DataType dtype,
                                int root, const CallOptions& call) {
  return RR_SUBMIT(make(Collective::gather, send, recv, count, dtype, ReduceOp::sum, root), call,
                   true);
}
Work Communicator::scatter_async(const void* send, void* recv, size_t count, DataType dtype,
                                 int root, const CallOptions& call) {
  return RR_SUBMIT(make(Collective::scatter, send, recv, count, dtype, ReduceOp::sum, root), call,
                   true);
}
Work Communicator::allgatherv_async(const void* send, void* recv, std::span<const size_t> counts,
                                    DataType dtype, const CallOptions& call) {
  return RR_SUBMIT(make_v(Collective::allgatherv, send, recv, counts, {}, dtype, ReduceOp::sum),
                   call, true);
}
Work Communicator::reduce_scatterv_async(const void* send, void* recv,
                                         std::span<const size_t> counts, DataType dtype,
                                         ReduceOp op, const CallOptions& call) {
  return RR_SUBMIT(make_v(Collective::reduce_scatterv, send, recv, counts, {}, dtype, op), call,
                   true);
}
Work Communicator::alltoallv_async(const void* send, std::span<const size_t> send_counts,
                                   void* recv, std::span<const size_t> recv_counts, DataType dtype,
                                   const CallOptions& call) {
  return RR_SUBMIT(
      make_v(Collective::alltoallv, send, recv, send_counts, recv_counts, dtype, ReduceOp::sum),
      call, true);
}

// Blocking calls are submitted as such: their caller drives them, with no thread hand-off.
void Communicator::allreduce(const void* send, void* recv, size_t count, DataType dtype,
                             ReduceOp op, const CallOptions& call) {
  impl().call(make(Collective::allreduce, send, recv, count, dtype, op, 0), call);
}
void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType dtype,
                                  ReduceOp op, const CallOptions& call) {
  impl().call(make(Collective::reduce_scatter, send, recv, recv_count, dtype, op, 0), call);
}
void Communicator::allgather(const void* send, void* recv, size_t send_count, DataType dtype,
                             const CallOptions& call) {
  impl().call(make(Collective::allgather, send, recv, send_count, dtype, ReduceOp::sum, 0), call);
}
void Communicator::broadcast(void* buffer, size_t count, DataType dtype, int root,
                             const CallOptions& call) {
  impl().call(make(Collective::broadcast, buffer, buffer, count, dtype, ReduceOp::sum, root), call);
}
void Communicator::broadcast(const void* send, void* recv, size_t count, DataType dtype, int root,
                             const CallOptions& call) {
  impl().call(make(Collective::broadcast, send, recv, count, dtype, ReduceOp::sum, root), call);
}
void Communicator::reduce(const void* send, void* recv, size_t count, DataType dtype, ReduceOp op,
                          int root, const CallOptions& call) {
  impl().call(make(Collective::reduce, send, recv, count, dtype, op, root), call);
}
void Communicator::alltoall(const void* send, void* recv, size_t count, DataType dtype,
                            const CallOptions& call) {
  impl().call(make(Collective::alltoall, send, recv, count, dtype, ReduceOp::sum, 0), call);
}
void Communicator::gather(const void* send, void* recv, size_t count, DataType dtype, int root,
                          const CallOptions& call) {
  impl().call(make(Collective::gather, send, recv, count, dtype, ReduceOp::sum, root), call);
}
void Communicator::scatter(const void* send, void* recv, size_t count, DataType dtype, int root,
                           const CallOptions& call) {
  impl().call(make(Collective::scatter, send, recv, count, dtype, ReduceOp::sum, root), call);
}
void Communicator::allgatherv(const void* send, void* recv, std::span<const size_t> counts,
                              DataType dtype, const CallOptions& call) {
  impl().call(make_v(Collective::allgatherv, send, recv, counts, {}, dtype, ReduceOp::sum), call);
}
void Communicator::reduce_scatterv(const void* send, void* recv, std::span<const size_t> counts,
                                   DataType dtype, ReduceOp op, const CallOptions& call) {
  impl().call(make_v(Collective::reduce_scatterv, send, recv, counts, {}, dtype, op), call);
}
void Communicator::alltoallv(const void* send, std::span<const size_t> send_counts, void* recv,
                             std::span<const size_t> recv_counts, DataType dtype,
                             const CallOptions& call) {
  impl().call(
      make_v(Collective::alltoallv, send, recv, send_counts, recv_counts, dtype, ReduceOp::sum),
      call);
}
void Communicator::barrier(const CallOptions& call) {
  impl().call(make(Collective::barrier, nullptr, nullptr, 0, DataType::u8, ReduceOp::sum, 0), call);
}

#undef RR_SUBMIT

namespace {
detail::P2pArgs p2p(bool send, const void* buf, size_t count, DataType dtype, int peer,
                    uint64_t tag) {
  detail::P2pArgs a;
  a.send = send;
  a.buf = const_cast<void*>(buf);  // a send only reads it
  a.count = count;
  a.dtype = dtype;
  a.peer = peer;
  a.tag = tag;
  return a;
}
}  // namespace

Work Communicator::send_async(const void* buf, size_t count, DataType dtype, int peer, uint64_t tag,
                              const CallOptions& call) {
  return detail::CommImpl::make_work(
      impl().submit_p2p(p2p(true, buf, count, dtype, peer, tag), call, true));
}
Work Communicator::recv_async(void* buf, size_t count, DataType dtype, int peer, uint64_t tag,
                              const CallOptions& call) {
  return detail::CommImpl::make_work(
      impl().submit_p2p(p2p(false, buf, count, dtype, peer, tag), call, true));
}
// Blocking: the caller drives them itself (no thread hand-off) unless someone else is driving.
void Communicator::send(const void* buf, size_t count, DataType dtype, int peer, uint64_t tag,
                        const CallOptions& call) {
  auto op = impl().submit_p2p(p2p(true, buf, count, dtype, peer, tag), call, false);
  impl().wait(*op, std::nullopt);
}
int Communicator::recv(void* buf, size_t count, DataType dtype, int peer, uint64_t tag,
                       const CallOptions& call) {
  auto op = impl().submit_p2p(p2p(false, buf, count, dtype, peer, tag), call, false);
  impl().wait(*op, std::nullopt);
  if (op->stage) op->stage->wait_output();  // device memory: the stream copies it into buf
  return op->p2p.source;
}

}  // namespace ringreduce
