// ringreduce._ringreduce: the Python binding of the C++ API (python/ringreduce/__init__.py
// re-exports it). Collectives work in place on the caller's memory: NumPy arrays (and anything
// else with the buffer protocol) and CPU torch tensors (through data_ptr(); torch is never
// imported here). No element is copied on the way in or out.
//
// The GIL is released for every call that may block: creating a communicator (rendezvous), the
// collectives and Work.wait(). An async call's Work keeps its buffers alive (and, for buffer
// protocol objects, their export: a NumPy array cannot be resized under a running op).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringreduce/ringreduce.hpp"

namespace py = pybind11;
namespace rr = ringreduce;

namespace {

// Memory handed to a collective and what keeps it alive.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;  // elements
  rr::DataType dtype = rr::DataType::f32;
  py::object owner;
  std::shared_ptr<py::buffer_info> view;  // the buffer protocol export, released with the Buffer
};

[[noreturn]] void bad_argument(const rr::Communicator* comm, const char* call,
                               const std::string& what) {
  std::string prefix = comm ? "rank " + std::to_string(comm->rank()) + ": " : "";
  throw rr::InvalidArgument(prefix + call + ": " + what);
}

// The DataType of a buffer protocol format: kind from the format character, width from itemsize
// (the same letter means different widths on different platforms).
std::optional<rr::DataType> dtype_of_format(const std::string& format, py::ssize_t itemsize) {
  if (format.empty()) return std::nullopt;
  char c = format.back();  // skips a byte-order prefix ('<', '=', '@')
  if (format.size() > 1 && format.front() != '<' && format.front() != '=' && format.front() != '@')
    return std::nullopt;  // big-endian ('>', '!') or a compound format
  switch (c) {
    case 'e':
      return rr::DataType::f16;
    case 'f':
      return rr::DataType::f32;
    case 'd':
      return rr::DataType::f64;
    case '?':
      if (itemsize == 1) return rr::DataType::boolean;
      return std::nullopt;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
      if (itemsize == 1) return rr::DataType::i8;
      if (itemsize == 2) return rr::DataType::i16;
      if (itemsize == 4) return rr::DataType::i32;
      if (itemsize == 8) return rr::DataType::i64;
      return std::nullopt;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
      if (itemsize == 1) return rr::DataType::u8;
      if (itemsize == 4) return rr::DataType::u32;
      if (itemsize == 8) return rr::DataType::u64;
      return std::nullopt;
    default:
      return std::nullopt;
  }
}

// `dtype` overrides the element type of the memory (same element size): a uint16 NumPy array
// holding bfloat16 values is passed with dtype="bfloat16".
Buffer to_buffer(const rr::Communicator* comm, const char* call, const char* role,
                 const py::object& obj, const std::optional<std::string>& dtype, bool writable) {
  Buffer b;
  b.owner = obj;
  std::optional<rr::DataType> t;
  size_t itemsize = 0;
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "numel") && py::hasattr(obj, "dtype")) {
    // A torch tensor (duck-typed: this module does not depend on torch).
    if (py::str(obj.attr("device").attr("type")).cast<std::string>() != "cpu")
      bad_argument(comm, call,
                   std::string(role) + " is a tensor on " +
                       py::str(obj.attr("device")).cast<std::string>() +
                       "; this module takes CPU tensors");
    // A sparse tensor has no dense data_ptr; a lazily negated or conjugated view's memory holds
    // the values before the negation.
    for (const char* flag : {"is_sparse", "is_neg", "is_conj"}) {
      if (!py::hasattr(obj, flag)) continue;
      py::object v = obj.attr(flag);
      if (PyCallable_Check(v.ptr())) v = v();
      if (v.cast<bool>())
        bad_argument(comm, call,
                     std::string(role) + " is a tensor with " + flag +
                         " set (call .to_dense() / .resolve_neg() / .resolve_conj())");
    }
    if (!obj.attr("is_contiguous")().cast<bool>())
      bad_argument(comm, call, std::string(role) + " is not contiguous (call .contiguous())");
    std::string name = py::str(obj.attr("dtype"));
    if (name.rfind("torch.", 0) == 0) name = name.substr(6);
    rr::DataType parsed;
    if (rr::parse_dtype(name, &parsed)) t = parsed;
    b.data = reinterpret_cast<void*>(obj.attr("data_ptr")().cast<uintptr_t>());
    b.count = obj.attr("numel")().cast<size_t>();
    itemsize = obj.attr("element_size")().cast<size_t>();
    if (!t && !dtype)
      bad_argument(comm, call,
                   std::string(role) + " has dtype " + name + ", which ringreduce does not reduce");
  } else if (PyObject_CheckBuffer(obj.ptr())) {
    std::shared_ptr<py::buffer_info> info;
    try {
      info = std::make_shared<py::buffer_info>(
          py::reinterpret_borrow<py::buffer>(obj).request(writable));
    } catch (const py::error_already_set& e) {
      // e.g. a read-only array as an output: say which call and which buffer.
      bad_argument(comm, call,
                   std::string(role) + (writable ? " must be writable: " : ": ") + e.what());
    }
    // C order: the strides are those of a packed array (a view with gaps would be misread).
    py::ssize_t expect = info->itemsize;
    for (py::ssize_t d = info->ndim - 1; d >= 0; --d) {
      if (info->shape[d] > 1 && info->strides[d] != expect)
        bad_argument(comm, call, std::string(role) + " is not C-contiguous");
      expect *= info->shape[d];
    }
    t = dtype_of_format(info->format, info->itemsize);
    if (!t && !dtype)
      bad_argument(comm, call,
                   std::string(role) + " has element format '" + info->format +
                       "', which ringreduce does not know (pass dtype=)");
    b.data = info->ptr;
    b.count = static_cast<size_t>(info->size);
    itemsize = static_cast<size_t>(info->itemsize);
    b.view = std::move(info);
  } else {
    bad_argument(comm, call,
                 std::string(role) +
                     " must be a NumPy array, a CPU torch tensor or "
                     "another object with the buffer protocol, not " +
                     py::str(py::type::of(obj)).cast<std::string>());
  }
  if (dtype) {
    rr::DataType over;
    if (!rr::parse_dtype(*dtype, &over)) bad_argument(comm, call, "unknown dtype '" + *dtype + "'");
    if (rr::dtype_size(over) != itemsize)
      bad_argument(comm, call,
                   "dtype " + *dtype + " has " + std::to_string(rr::dtype_size(over)) +
                       "-byte elements but " + role + "'s are " + std::to_string(itemsize) +
                       " bytes");
    t = over;
  }
  b.dtype = *t;
  return b;
}

rr::ReduceOp to_op(const rr::Communicator* comm, const char* call, const py::object& op) {
  if (py::isinstance<py::str>(op)) {
    rr::ReduceOp out;
    const std::string name = op.cast<std::string>();
    if (!rr::parse_op(name, &out))
      bad_argument(comm, call,
                   "unknown reduce op '" + name +
                       "' (sum, prod, min, max, avg, band, bor, bxor, premul_sum)");
    return out;
  }
  if (!py::isinstance<rr::ReduceOp>(op))
    bad_argument(comm, call,
                 "op must be a ReduceOp or one of 'sum', 'prod', 'min', 'max', 'avg', 'band', "
                 "'bor', 'bxor', 'premul_sum'");
  return op.cast<rr::ReduceOp>();
}

// Seconds from Python as milliseconds; NaN, infinite, negative or absurd values are refused
// (converting them to an integer would be undefined).
std::chrono::milliseconds to_ms(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e9)
    throw rr::InvalidArgument("timeout must be a finite number of seconds >= 0, not " +
                              std::to_string(seconds));
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

rr::CallOptions call_options(std::optional<double> timeout_s) {
  rr::CallOptions c;
  if (timeout_s) c.timeout = to_ms(*timeout_s);
  return c;
}

// An async op's handle: the C++ Work plus the buffers it uses.
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
    py::gil_scoped_release nogil;
    if (!timeout_s) {
      work_.wait();
      return true;
    }
    return work_.wait(to_ms(*timeout_s));
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

  // One collective, blocking or async. send/recv are converted here (with the GIL); the op runs
  // without it.
  enum class Kind { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall };
  py::object collective(Kind kind, const char* call, const py::object& send_obj,
                        const py::object& recv_obj, const py::object& op_obj, int root,
                        const std::optional<std::string>& dtype, std::optional<double> timeout,
                        bool async) {
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
    const rr::CallOptions opts = call_options(timeout);
    auto need = [&](bool ok, const std::string& what) {
      if (!ok) bad_argument(&c, call, what);
    };
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
    {
      py::gil_scoped_release nogil;
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
    }
    py::object result = in_place ? send_obj : recv_obj;
    if (!async) return result;
    std::vector<Buffer> bufs{std::move(send)};
    if (!in_place) bufs.push_back(std::move(recv));
    return py::cast(std::make_unique<PyWork>(std::move(w), std::move(bufs), result, keep));
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
    const rr::CallOptions opts = call_options(timeout);
    rr::Work w;
    int source = -1;
    {
      py::gil_scoped_release nogil;
      if (async)
        w = is_send ? c.send_async(buf.data, buf.count, buf.dtype, p, tag, opts)
                    : c.recv_async(buf.data, buf.count, buf.dtype, p, tag, opts);
      else if (is_send)
        c.send(buf.data, buf.count, buf.dtype, p, tag, opts);
      else
        source = c.recv(buf.data, buf.count, buf.dtype, p, tag, opts);
    }
    if (async)
      return py::cast(std::make_unique<PyWork>(std::move(w), std::vector<Buffer>{std::move(buf)},
                                               buf_obj, keep));
    return is_send ? py::object(py::none()) : py::object(py::int_(source));
  }

 private:
  std::shared_ptr<rr::Communicator> comm_;
};

}  // namespace

PYBIND11_MODULE(_ringreduce, m) {
  m.doc() = "ringreduce: bandwidth-optimal collectives (C++ core); see help(ringreduce)";

  // Exceptions mirror the C++ classes and carry the same messages.
  static py::exception<rr::Error> error(m, "Error", PyExc_RuntimeError);
  static py::exception<rr::TimeoutError> timeout_error(m, "TimeoutError", error.ptr());
  static py::exception<rr::PeerError> peer_error(m, "PeerError", error.ptr());
  static py::exception<rr::MismatchError> mismatch_error(m, "MismatchError", error.ptr());
  static py::object invalid_bases = py::make_tuple(error, py::handle(PyExc_ValueError));
  static py::exception<rr::InvalidArgument> invalid_argument(m, "InvalidArgument",
                                                             invalid_bases.ptr());
  // Shown as ringreduce.PeerError, not ringreduce._ringreduce.PeerError.
  for (PyObject* t : {error.ptr(), timeout_error.ptr(), peer_error.ptr(), mismatch_error.ptr(),
                      invalid_argument.ptr()})
    py::handle(t).attr("__module__") = "ringreduce";
  py::register_exception_translator([](std::exception_ptr p) {
    auto raise = [](const py::object& type, const rr::Error& e, int peer) {
      py::object inst = type(e.what());
      inst.attr("code") = static_cast<int>(e.code());
      inst.attr("peer") = peer >= 0 ? py::object(py::int_(peer)) : py::none();
      PyErr_SetObject(type.ptr(), inst.ptr());
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rr::PeerError& e) {
      raise(peer_error, e, e.peer());
    } catch (const rr::TimeoutError& e) {
      raise(timeout_error, e, -1);
    } catch (const rr::MismatchError& e) {
      raise(mismatch_error, e, -1);
    } catch (const rr::InvalidArgument& e) {
      raise(invalid_argument, e, -1);
    } catch (const rr::Error& e) {
      raise(error, e, -1);
    }
  });

  py::enum_<rr::ErrorCode>(m, "ErrorCode")
      .value("OK", rr::ErrorCode::ok)
      .value("INTERNAL", rr::ErrorCode::internal)
      .value("INVALID_ARGUMENT", rr::ErrorCode::invalid_argument)
      .value("TIMEOUT", rr::ErrorCode::timeout)
      .value("PEER", rr::ErrorCode::peer)
      .value("MISMATCH", rr::ErrorCode::mismatch)
      .value("ABORTED", rr::ErrorCode::aborted);

  py::enum_<rr::ReduceOp>(m, "ReduceOp")
      .value("SUM", rr::ReduceOp::sum)
      .value("PROD", rr::ReduceOp::prod)
      .value("MIN", rr::ReduceOp::min)
      .value("MAX", rr::ReduceOp::max)
      .value("AVG", rr::ReduceOp::avg)
      .value("BAND", rr::ReduceOp::band)
      .value("BOR", rr::ReduceOp::bor)
      .value("BXOR", rr::ReduceOp::bxor)
      .value("PREMUL_SUM", rr::ReduceOp::premul_sum);

  py::class_<PyWork>(m, "Work", "The handle of an async collective.")
      .def("wait", &PyWork::wait, py::arg("timeout") = py::none(),
           "Blocks until the op completes (or `timeout` seconds pass: then returns False); "
           "raises the op's error if it failed.")
      .def("is_completed", &PyWork::is_completed,
           "Whether the op has completed, without blocking; raises its error if it failed.")
      .def("result", &PyWork::result, "Waits, then returns the output buffer.")
      .def_property_readonly("algorithm", &PyWork::algorithm,
                             "The plan the tuner chose, e.g. 'ring seg=512K ch=1'.")
      .def_property_readonly("source", &PyWork::source,
                             "For a completed recv: the rank whose message it took (None "
                             "before, and for anything else).");

  using K = PyComm::Kind;
  auto cls = py::class_<PyComm>(m, "Communicator");
  cls.def(py::init<std::optional<int>, std::optional<int>, std::optional<std::string>,
                   std::optional<std::string>, std::optional<double>,
                   std::map<std::string, std::string>>(),
          py::arg("rank") = py::none(), py::arg("size") = py::none(), py::arg("addr") = py::none(),
          py::arg("token") = py::none(), py::arg("timeout") = py::none(),
          py::arg("settings") = std::map<std::string, std::string>{},
          "Joins a group. Arguments left out come from the environment (RINGREDUCE_*, torchrun's, "
          "OpenMPI's, Slurm's, PMI's variables); timeout in seconds; settings: RINGREDUCE_* names "
          "to values.")
      .def_property_readonly("rank", [](PyComm& c) { return c.comm()->rank(); })
      .def_property_readonly("size", [](PyComm& c) { return c.comm()->size(); })
      .def_property_readonly("closed", &PyComm::closed)
      .def("tuning", [](PyComm& c) { return c.comm()->tuning(); })
      .def("close", &PyComm::close, "Leaves the group now rather than at garbage collection.")
      .def(
          "abort", [](PyComm& c, const std::string& reason) { c.comm()->abort(reason); },
          py::arg("reason"), "Fails every pending and later op with `reason`.")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyComm& c, py::args) { c.close(); });

  // Each collective as a blocking call (returns the output buffer) and an async one (returns a
  // Work). Keyword names follow torch.distributed where it has one.
  auto def2 = [&](const char* name, const char* async_name, K kind, auto&& fn, const char* doc) {
    cls.def(
        name,
        [=](PyComm& c, py::object a, py::object b, py::object op, int root,
            std::optional<std::string> dtype, std::optional<double> timeout) {
          return fn(c, kind, name, a, b, op, root, dtype, timeout, false);
        },
        py::arg("send"), py::arg("recv") = py::none(), py::arg("op") = py::none(),
        py::arg("root") = 0, py::arg("dtype") = py::none(), py::arg("timeout") = py::none(), doc);
    cls.def(
        async_name,
        [=](PyComm& c, py::object a, py::object b, py::object op, int root,
            std::optional<std::string> dtype, std::optional<double> timeout) {
          return fn(c, kind, name, a, b, op, root, dtype, timeout, true);
        },
        py::arg("send"), py::arg("recv") = py::none(), py::arg("op") = py::none(),
        py::arg("root") = 0, py::arg("dtype") = py::none(), py::arg("timeout") = py::none(), doc);
  };
  auto call = [](PyComm& c, K kind, const char* name, const py::object& a, const py::object& b,
                 const py::object& op, int root, const std::optional<std::string>& dtype,
                 std::optional<double> timeout, bool async) {
    return c.collective(kind, name, a, b, op, root, dtype, timeout, async);
  };
  def2("allreduce", "allreduce_async", K::allreduce, call,
       "allreduce(send, recv=None, op='sum'): recv = op over ranks of send (in place without "
       "recv). op: sum, prod, min, max, avg or a ReduceOp.");
  def2("reduce_scatter", "reduce_scatter_async", K::reduce_scatter, call,
       "reduce_scatter(send, recv, op='sum'): send holds size x len(recv) elements; rank r "
       "receives block r of the reduction.");
  def2("allgather", "allgather_async", K::allgather, call,
       "allgather(send, recv): recv holds size x len(send) elements; block r is rank r's send.");
  def2("broadcast", "broadcast_async", K::broadcast, call,
       "broadcast(send, recv=None, root=0): every rank's buffer becomes root's.");
  def2("reduce", "reduce_async", K::reduce, call,
       "reduce(send, recv=None, op='sum', root=0): the root's recv (or send, in place) becomes "
       "the reduction; other ranks' buffers are unchanged.");
  def2("alltoall", "alltoall_async", K::alltoall, call,
       "alltoall(send, recv): both hold size equal blocks; block j of send goes to rank j.");
  m.attr("ANY_SOURCE") = rr::Communicator::kAnySource;
  const char* send_doc =
      "send(buf, dst, tag=0): a message to rank dst, taken there by a recv with this rank (or "
      "any source) and this tag, of the same size. Messages with one tag arrive in the order "
      "sent; they are matched apart from the collectives, in any order relative to them.";
  const char* recv_doc =
      "recv(buf, src=None, tag=0): receives a message of exactly len(buf) elements from rank src "
      "(None or ANY_SOURCE: whichever rank sends one with this tag first) into buf; returns the "
      "sender's rank.";
  for (bool async : {false, true}) {
    cls.def(
        async ? "send_async" : "send",
        [async](PyComm& c, py::object buf, int dst, uint64_t tag, std::optional<std::string> dtype,
                std::optional<double> timeout) {
          return c.p2p(true, buf, dst, tag, dtype, timeout, async);
        },
        py::arg("buf"), py::arg("dst"), py::arg("tag") = 0, py::arg("dtype") = py::none(),
        py::arg("timeout") = py::none(), send_doc);
    cls.def(
        async ? "recv_async" : "recv",
        [async](PyComm& c, py::object buf, std::optional<int> src, uint64_t tag,
                std::optional<std::string> dtype, std::optional<double> timeout) {
          return c.p2p(false, buf, src, tag, dtype, timeout, async);
        },
        py::arg("buf"), py::arg("src") = py::none(), py::arg("tag") = 0,
        py::arg("dtype") = py::none(), py::arg("timeout") = py::none(), recv_doc);
  }
  cls.def(
      "barrier",
      [](PyComm& c, std::optional<double> timeout) {
        const auto comm = c.comm();
        const rr::CallOptions opts = call_options(timeout);
        py::gil_scoped_release nogil;
        comm->barrier(opts);
      },
      py::arg("timeout") = py::none(), "Returns once every rank has called barrier().");
  cls.def(
      "barrier_async",
      [](PyComm& c, std::optional<double> timeout) {
        const auto comm = c.comm();
        const rr::CallOptions opts = call_options(timeout);
        rr::Work w;
        {
          py::gil_scoped_release nogil;
          w = comm->barrier_async(opts);
        }
        return std::make_unique<PyWork>(std::move(w), std::vector<Buffer>{}, py::none(), comm);
      },
      py::arg("timeout") = py::none());
}
