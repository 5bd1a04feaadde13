// The Python module's objects: PyComm, a C++ Communicator that close() can end before garbage
// collection, whose methods convert Python buffers (buffers.h) and run the calls without the GIL;
// and PyWork, an async op's handle holding its buffers until the op is done. module.cc binds them.
#pragma once

#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "buffers.h"
#include "interrupt.h"
#include "ringreduce/ringreduce.hpp"

namespace ringreduce::python {

// Runs a call without the GIL; a Ctrl-C meanwhile aborts the communicator and comes back as
// Python's KeyboardInterrupt (interrupt.h).
template <typename F>
void blocking_call(rr::Communicator& c, F&& f) {
  Interruptible guard(c);
  try {
    py::gil_scoped_release nogil;
    f();
  } catch (const rr::Error&) {
    guard.rethrow_if_interrupted();
    throw;
  }
}

// An async op's handle: the C++ Work plus the buffers it uses.
// Communicator.alloc()'s memory: the buffer protocol over it, and the communicator kept alive
// as long as the buffer is (by arrays made from it too), since the memory ends with it.
struct PyMemory {
  std::shared_ptr<rr::Communicator> comm;
  void* p = nullptr;
  size_t bytes = 0;
};

class PyWork {
 public:
  PyWork(rr::Work w, std::vector<Buffer> bufs, py::object result,
         std::shared_ptr<rr::Communicator> comm)
      : work_(std::move(w)),
        bufs_(std::move(bufs)),
        result_(std::move(result)),
        comm_(std::move(comm)) {}
  PyWork(const PyWork&) = delete;
  PyWork& operator=(const PyWork&) = delete;
  ~PyWork() {
    // The op writes into the buffers until it completes: they must not be freed before.
    if (!work_.valid()) return;
    py::gil_scoped_release nogil;
    try {
      work_.wait();
    } catch (...) {  // the error was the caller's to collect; a destructor cannot raise it
    }
    comm_.reset();  // if this was the last user after close(), the communicator ends here
  }
  bool wait(std::optional<double> timeout_s) {
    bool done = true;
    auto run = [&] {
      if (timeout_s)
        done = work_.wait(to_ms(*timeout_s));
      else
        work_.wait();
    };
    if (comm_)
      blocking_call(*comm_, run);
    else
      run();
    return done;
  }
  bool is_completed() { return work_.test(); }
  std::string algorithm() const { return work_.algorithm(); }
  std::optional<int> source() const {
    const int s = work_.source();
    return s >= 0 ? std::optional<int>(s) : std::nullopt;
  }
  py::object result() {
    wait(std::nullopt);
    return result_;
  }

 private:
  rr::Work work_;
  std::vector<Buffer> bufs_;
  py::object result_;
  // Keeps the communicator alive while the op may still be driven from here (Work.wait after a
  // close() in another thread).
  std::shared_ptr<rr::Communicator> comm_;
};

// The Python Communicator: a C++ Communicator that close() can end before garbage collection.
class PyComm {
 public:
  PyComm(std::optional<int> rank, std::optional<int> size, std::optional<std::string> addr,
         std::optional<std::string> token, std::optional<double> timeout_s,
         std::map<std::string, std::string> settings) {
    rr::Options o;
    o.rank = rank;
    o.world_size = size;
    o.addr = std::move(addr);
    o.token = std::move(token);
    if (timeout_s) o.timeout = to_ms(*timeout_s);
    o.settings = std::move(settings);
    py::gil_scoped_release nogil;  // rendezvous waits for the other ranks
    comm_ = std::make_shared<rr::Communicator>(o);
  }

  // One of split()'s.
  explicit PyComm(std::shared_ptr<rr::Communicator> c) : comm_(std::move(c)) {}

  // A reference for one call (taken with the GIL held): a close() from another thread while the
  // call runs without the GIL then only drops close()'s reference, and the communicator ends
  // when the last call or unfinished Work using it does.
  std::shared_ptr<rr::Communicator> comm() {
    if (!comm_) throw rr::InvalidArgument("the communicator is closed");
    return comm_;
  }
  void close() {
    std::shared_ptr<rr::Communicator> c = std::move(comm_);
    py::gil_scoped_release nogil;
    c.reset();
  }
  bool closed() const { return comm_ == nullptr; }
  // For error messages only (the rank): null once closed, where comm() would throw.
  const rr::Communicator* peek() const { return comm_.get(); }

  // One collective, blocking or async. send/recv are converted here (with the GIL); the op runs
  // without it.
  enum class Kind { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall };
  py::object collective(Kind kind, const char* call, const py::object& send_obj,
                        const py::object& recv_obj, const py::object& op_obj, int root,
                        const std::optional<std::string>& dtype, std::optional<double> timeout,
                        double premul_factor, bool async,
                        const std::optional<std::string>& wire = std::nullopt) {
    const std::shared_ptr<rr::Communicator> keep = comm();
    rr::Communicator& c = *keep;
    const size_t n = static_cast<size_t>(c.size());
    const bool in_place = recv_obj.is_none() || recv_obj.is(send_obj);
    const bool root_only_recv = kind == Kind::reduce && c.rank() != root;
    if (kind == Kind::broadcast || kind == Kind::reduce) {
      if (root < 0 || root >= c.size())
        bad_argument(&c, call,
                     "root " + std::to_string(root) + " is not a rank (size " +
                         std::to_string(c.size()) + ")");
    }
    // The send buffer is only read, except in place (and broadcast, which writes everywhere
    // but on the root).
    const bool send_written = in_place && !root_only_recv;
    Buffer send = to_buffer(&c, call, in_place ? "buffer" : "send", send_obj, dtype, send_written);
    Buffer recv = in_place ? send : to_buffer(&c, call, "recv", recv_obj, dtype, true);
    if (!in_place && send.dtype != recv.dtype)
      bad_argument(&c, call,
                   std::string("send is ") + rr::dtype_name(send.dtype) + " but recv is " +
                       rr::dtype_name(recv.dtype));
    const rr::ReduceOp op = op_obj.is_none() ? rr::ReduceOp::sum : to_op(&c, call, op_obj);
    rr::CallOptions opts = call_options(timeout, premul_factor);
    if (wire) {
      rr::Wire w;
      if (!rr::parse_wire(*wire, &w))
        bad_argument(&c, call,
                     "wire='" + *wire +
                         "' is not a wire format (none, bf16, f16, fp8e4m3, "
                         "fp8e5m2, auto)");
      opts.wire = w;
    }
    place(opts, send, recv);
    auto need = [&](bool ok, const std::string& what) {
      if (!ok) bad_argument(&c, call, what);
    };
    need(premul_factor == 1.0 || op == rr::ReduceOp::premul_sum,
         "premul_factor applies to op='premul_sum' only");
    const std::string sizes = " (send " + std::to_string(send.count) + ", recv " +
                              std::to_string(recv.count) + " elements, " + std::to_string(n) +
                              " ranks)";
    size_t count = send.count;
    switch (kind) {
      case Kind::allreduce:
      case Kind::broadcast:
        need(recv.count == send.count, "send and recv differ in size" + sizes);
        break;
      case Kind::reduce:
        need(root_only_recv || recv.count == send.count, "send and recv differ in size" + sizes);
        break;
      case Kind::reduce_scatter:
        need(!in_place, "reduce_scatter needs a recv buffer of 1/size of send");
        need(send.count == recv.count * n, "send must hold size x recv elements" + sizes);
        count = recv.count;
        break;
      case Kind::allgather:
        need(!in_place, "allgather needs a recv buffer of size x send");
        need(recv.count == send.count * n, "recv must hold size x send elements" + sizes);
        break;
      case Kind::alltoall:
        need(!in_place, "alltoall needs separate send and recv buffers");
        need(recv.count == send.count && send.count % n == 0,
             "send and recv must hold the same number of elements, a multiple of size" + sizes);
        count = send.count / n;
        break;
    }
    rr::Work w;
    blocking_call(c, [&] {
      auto run = [&](auto&& blocking, auto&& nonblocking) {
        if (async)
          w = nonblocking();
        else
          blocking();
      };
      const void* s = send.data;
      void* r = recv.data;
      const rr::DataType t = send.dtype;
      switch (kind) {
        case Kind::allreduce:
          run([&] { c.allreduce(s, r, count, t, op, opts); },
              [&] { return c.allreduce_async(s, r, count, t, op, opts); });
          break;
        case Kind::reduce_scatter:
          run([&] { c.reduce_scatter(s, r, count, t, op, opts); },
              [&] { return c.reduce_scatter_async(s, r, count, t, op, opts); });
          break;
        case Kind::allgather:
          run([&] { c.allgather(s, r, count, t, opts); },
              [&] { return c.allgather_async(s, r, count, t, opts); });
          break;
        case Kind::broadcast:
          run([&] { c.broadcast(s, r, count, t, root, opts); },
              [&] { return c.broadcast_async(s, r, count, t, root, opts); });
          break;
        case Kind::reduce:
          run([&] { c.reduce(s, root_only_recv ? nullptr : r, count, t, op, root, opts); },
              [&] {
                return c.reduce_async(s, root_only_recv ? nullptr : r, count, t, op, root, opts);
              });
          break;
        case Kind::alltoall:
          run([&] { c.alltoall(s, r, count, t, opts); },
              [&] { return c.alltoall_async(s, r, count, t, opts); });
          break;
      }
    });
    py::object result = in_place ? send_obj : recv_obj;
    if (!async) return result;
    std::vector<Buffer> bufs{std::move(send)};
    if (!in_place) bufs.push_back(std::move(recv));
    return py::cast(std::make_unique<PyWork>(std::move(w), std::move(bufs), result, keep));
  }

  // gather (send on every rank, recv on the root) or scatter (send on the root, recv on every
  // rank); the buffer a rank does not use may be None there.
  py::object gather_scatter(bool gather, const py::object& send_obj, const py::object& recv_obj,
                            int root, const std::optional<std::string>& dtype,
                            std::optional<double> timeout, bool async) {
    const std::shared_ptr<rr::Communicator> keep = comm();
    rr::Communicator& c = *keep;
    const char* call = gather ? "gather" : "scatter";
    const size_t n = static_cast<size_t>(c.size());
    if (root < 0 || root >= c.size())
      bad_argument(&c, call,
                   "root " + std::to_string(root) + " is not a rank (size " +
                       std::to_string(c.size()) + ")");
    const bool at_root = c.rank() == root;
    std::vector<Buffer> bufs;
    Buffer send, recv;
    size_t count = 0;
    if (gather) {
      send = to_buffer(&c, call, "send", send_obj, dtype, false);
      count = send.count;
      if (at_root) {
        recv = to_buffer(&c, call, "recv", recv_obj, dtype, true);
        if (recv.count != n * send.count || recv.dtype != send.dtype)
          bad_argument(&c, call,
                       "the root's recv must hold size x send elements of send's dtype (send " +
                           std::to_string(send.count) + ", recv " + std::to_string(recv.count) +
                           ", " + std::to_string(n) + " ranks)");
      }
    } else {
      recv = to_buffer(&c, call, "recv", recv_obj, dtype, true);
      count = recv.count;
      if (at_root) {
        send = to_buffer(&c, call, "send", send_obj, dtype, false);
        if (send.count != n * recv.count || recv.dtype != send.dtype)
          bad_argument(&c, call,
                       "the root's send must hold size x recv elements of recv's dtype (send " +
                           std::to_string(send.count) + ", recv " + std::to_string(recv.count) +
                           ", " + std::to_string(n) + " ranks)");
      }
    }
    const rr::DataType t = gather ? send.dtype : recv.dtype;
    rr::CallOptions opts = call_options(timeout);
    place(opts, send, recv);
    rr::Work w;
    blocking_call(c, [&] {
      if (gather && async)
        w = c.gather_async(send.data, recv.data, count, t, root, opts);
      else if (gather)
        c.gather(send.data, recv.data, count, t, root, opts);
      else if (async)
        w = c.scatter_async(send.data, recv.data, count, t, root, opts);
      else
        c.scatter(send.data, recv.data, count, t, root, opts);
    });
    py::object result = gather ? (at_root ? recv_obj : py::none()) : recv_obj;
    if (!async) return result;
    if (send.data) bufs.push_back(std::move(send));
    if (recv.data) bufs.push_back(std::move(recv));
    return py::cast(std::make_unique<PyWork>(std::move(w), std::move(bufs), result, keep));
  }

  // The collectives whose blocks have their own sizes: allgatherv, reduce_scatterv (counts: one
  // per rank, the same everywhere) and alltoallv (this rank's send and receive counts).
  enum class Uneven { allgatherv, reduce_scatterv, alltoallv };
  py::object uneven(Uneven kind, const py::object& send_obj, const py::object& recv_obj,
                    const std::vector<size_t>& counts, const std::vector<size_t>& recv_counts,
                    const py::object& op_obj, const std::optional<std::string>& dtype,
                    std::optional<double> timeout, double premul_factor, bool async) {
    const std::shared_ptr<rr::Communicator> keep = comm();
    rr::Communicator& c = *keep;
    const char* call = kind == Uneven::allgatherv        ? "allgatherv"
                       : kind == Uneven::reduce_scatterv ? "reduce_scatterv"
                                                         : "alltoallv";
    const size_t n = static_cast<size_t>(c.size());
    auto need = [&](bool ok, const std::string& what) {
      if (!ok) bad_argument(&c, call, what);
    };
    need(counts.size() == n, std::string(kind == Uneven::alltoallv ? "send_counts" : "counts") +
                                 " must have one entry per rank (" + std::to_string(n) + ")");
    if (kind == Uneven::alltoallv)
      need(recv_counts.size() == n,
           "recv_counts must have one entry per rank (" + std::to_string(n) + ")");
    need(!send_obj.is(recv_obj), std::string(call) + " needs separate send and recv buffers");
    Buffer send = to_buffer(&c, call, "send", send_obj, dtype, false);
    Buffer recv = to_buffer(&c, call, "recv", recv_obj, dtype, true);
    need(send.dtype == recv.dtype, std::string("send is ") + rr::dtype_name(send.dtype) +
                                       " but recv is " + rr::dtype_name(recv.dtype));
    auto total = [](const std::vector<size_t>& v) {
      size_t t = 0;
      for (size_t x : v) t += x;
      return t;
    };
    const size_t mine = counts[static_cast<size_t>(c.rank())];
    const std::string sizes =
        " (send " + std::to_string(send.count) + ", recv " + std::to_string(recv.count) + ")";
    const rr::ReduceOp op = op_obj.is_none() ? rr::ReduceOp::sum : to_op(&c, call, op_obj);
    need(premul_factor == 1.0 || op == rr::ReduceOp::premul_sum,
         "premul_factor applies to op='premul_sum' only");
    switch (kind) {
      case Uneven::allgatherv:
        need(send.count == mine && recv.count == total(counts),
             "send must hold counts[rank] elements and recv their total" + sizes);
        break;
      case Uneven::reduce_scatterv:
        need(send.count == total(counts) && recv.count == mine,
             "send must hold the total of counts and recv counts[rank] elements" + sizes);
        break;
      case Uneven::alltoallv:
        need(send.count == total(counts) && recv.count == total(recv_counts),
             "send must hold the total of send_counts and recv that of recv_counts" + sizes);
        break;
    }
    rr::CallOptions opts = call_options(timeout, premul_factor);
    place(opts, send, recv);
    rr::Work w;
    blocking_call(c, [&] {
      const void* s = send.data;
      void* r = recv.data;
      const rr::DataType t = send.dtype;
      switch (kind) {
        case Uneven::allgatherv:
          if (async)
            w = c.allgatherv_async(s, r, counts, t, opts);
          else
            c.allgatherv(s, r, counts, t, opts);
          break;
        case Uneven::reduce_scatterv:
          if (async)
            w = c.reduce_scatterv_async(s, r, counts, t, op, opts);
          else
            c.reduce_scatterv(s, r, counts, t, op, opts);
          break;
        case Uneven::alltoallv:
          if (async)
            w = c.alltoallv_async(s, counts, r, recv_counts, t, opts);
          else
            c.alltoallv(s, counts, r, recv_counts, t, opts);
          break;
      }
    });
    if (!async) return recv_obj;
    std::vector<Buffer> bufs;
    bufs.push_back(std::move(send));
    bufs.push_back(std::move(recv));
    return py::cast(std::make_unique<PyWork>(std::move(w), std::move(bufs), recv_obj, keep));
  }

  // A send or receive, blocking (returns None, or the source rank for a receive) or async.
  py::object p2p(bool is_send, const py::object& buf_obj, std::optional<int> peer, uint64_t tag,
                 const std::optional<std::string>& dtype, std::optional<double> timeout,
                 bool async) {
    const std::shared_ptr<rr::Communicator> keep = comm();
    rr::Communicator& c = *keep;
    const char* call = is_send ? "send" : "recv";
    if (is_send && !peer) bad_argument(&c, call, "send needs a destination rank");
    const int p = peer.value_or(rr::Communicator::kAnySource);
    Buffer buf = to_buffer(&c, call, "buffer", buf_obj, dtype, /*writable=*/!is_send);
    rr::CallOptions opts = call_options(timeout);
    place(opts, buf, buf);
    rr::Work w;
    int source = -1;
    blocking_call(c, [&] {
      if (async)
        w = is_send ? c.send_async(buf.data, buf.count, buf.dtype, p, tag, opts)
                    : c.recv_async(buf.data, buf.count, buf.dtype, p, tag, opts);
      else if (is_send)
        c.send(buf.data, buf.count, buf.dtype, p, tag, opts);
      else
        source = c.recv(buf.data, buf.count, buf.dtype, p, tag, opts);
    });
    if (async)
      return py::cast(std::make_unique<PyWork>(std::move(w), std::vector<Buffer>{std::move(buf)},
                                               buf_obj, keep));
    return is_send ? py::object(py::none()) : py::object(py::int_(source));
  }

 private:
  std::shared_ptr<rr::Communicator> comm_;
};

}  // namespace ringreduce::python
