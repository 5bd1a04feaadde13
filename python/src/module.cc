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

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "py_comm.h"

namespace py = pybind11;
namespace rr = ringreduce;
using rr::python::Buffer;
using rr::python::call_options;
using rr::python::PyComm;
using rr::python::PyMemory;
using rr::python::PyWork;

namespace {

// Keyword arguments a call does not take. Each call binds a trailing **kwargs so that one it
// does not take (another collective's op or root, a misspelt timeout) is refused as
// ringreduce.InvalidArgument, a ValueError naming the rank, the call, the argument and the ones
// it takes, rather than pybind11's TypeError, which lists the whole signature and names none.
// Missing or surplus positional arguments stay the TypeError Python raises for any function.
void refuse_extra(const PyComm& c, const char* call, const char* takes, const py::kwargs& extra) {
  if (extra.empty()) return;
  std::string names;
  for (const auto& kv : extra)
    names += (names.empty() ? "'" : ", '") + py::str(kv.first).cast<std::string>() + "'";
  rr::python::bad_argument(
      c.peek(), call, std::string("does not take ") + names + " (its arguments: " + takes + ")");
}

}  // namespace

PYBIND11_MODULE(_ringreduce, m) {
  ringreduce::python::install_interrupt_hook();
  m.doc() = "ringreduce: bandwidth-optimal collectives (C++ core); see help(ringreduce)";
  // The version of the library that runs (libringreduce's, not this module's headers'), which is
  // also the wheel's: setup.py reads the same include/ringreduce/version.h.
  m.attr("__version__") = rr::Communicator::version();

  // Exceptions mirror the C++ classes and carry the same messages.
  static py::exception<rr::Error> error(m, "Error", PyExc_RuntimeError);
  // Also Python's own TimeoutError, so that `except TimeoutError` (asyncio, concurrent.futures'
  // habits) catches a ringreduce timeout; being a builtin TimeoutError makes it an OSError too.
  static py::object timeout_bases = py::make_tuple(error, py::handle(PyExc_TimeoutError));
  static py::exception<rr::TimeoutError> timeout_error(m, "TimeoutError", timeout_bases.ptr());
  static py::exception<rr::PeerError> peer_error(m, "PeerError", error.ptr());
  static py::exception<rr::MismatchError> mismatch_error(m, "MismatchError", error.ptr());
  static py::object invalid_bases = py::make_tuple(error, py::handle(PyExc_ValueError));
  static py::exception<rr::InvalidArgument> invalid_argument(m, "InvalidArgument",
                                                             invalid_bases.ptr());
  // Shown as ringreduce.PeerError, not ringreduce._ringreduce.PeerError.
  for (PyObject* t : {error.ptr(), timeout_error.ptr(), peer_error.ptr(), mismatch_error.ptr(),
                      invalid_argument.ptr()})
    py::handle(t).attr("__module__") = "ringreduce";
  // The Python exception for a C++ one (null: not a ringreduce::Error), as raised and as
  // Communicator.error() returns it.
  static auto exception_object = [](std::exception_ptr p) -> py::object {
    auto make = [](const py::object& type, const rr::Error& e, int peer) {
      py::object inst = type(e.what());
      inst.attr("code") = static_cast<int>(e.code());
      inst.attr("peer") = peer >= 0 ? py::object(py::int_(peer)) : py::none();
      return inst;
    };
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rr::PeerError& e) {
      return make(peer_error, e, e.peer());
    } catch (const rr::TimeoutError& e) {
      return make(timeout_error, e, -1);
    } catch (const rr::MismatchError& e) {
      return make(mismatch_error, e, -1);
    } catch (const rr::InvalidArgument& e) {
      return make(invalid_argument, e, -1);
    } catch (const rr::Error& e) {
      return make(error, e, -1);
    } catch (...) {
    }
    return py::object();
  };
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const rr::Error&) {
      const py::object inst = exception_object(p);
      PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(inst.ptr())), inst.ptr());
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

  py::class_<PyMemory>(m, "Memory", py::buffer_protocol(),
                       "Memory from Communicator.alloc(): a writable buffer of bytes.")
      .def_buffer([](PyMemory& m) {
        return py::buffer_info(m.p, 1, py::format_descriptor<uint8_t>::format(), 1,
                               {static_cast<py::ssize_t>(m.bytes)}, {py::ssize_t{1}});
      })
      .def("__len__", [](const PyMemory& m) { return m.bytes; });

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

  py::class_<rr::Agreement>(m, "Agreement",
                            "What Communicator.agree() returns: the same on every survivor.")
      .def_readonly("flag", &rr::Agreement::flag, "The AND of every survivor's flag.")
      .def_readonly("failed", &rr::Agreement::failed,
                    "The ranks taken as failed (dead, or silent until the timeout).")
      .def_readonly("completed_min", &rr::Agreement::completed_min,
                    "Over the survivors: the lowest sequence number of the last collective "
                    "each completed.")
      .def_readonly("completed_max", &rr::Agreement::completed_max,
                    "The highest: a call completed on some survivors and not on others leaves "
                    "them apart.")
      .def("__repr__", [](const rr::Agreement& a) {
        std::string f;
        for (int q : a.failed) f += (f.empty() ? "" : ", ") + std::to_string(q);
        return "Agreement(flag=" + std::string(a.flag ? "True" : "False") + ", failed=[" + f +
               "], completed=" + std::to_string(a.completed_min) + ".." +
               std::to_string(a.completed_max) + ")";
      });

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
      .def(
          "error",
          [](PyComm& c) -> py::object {
            const std::exception_ptr e = c.comm()->error();
            return e ? exception_object(e) : py::none();
          },
          "The error that aborted the communicator (an op's failure, a peer's, abort(), a "
          "shrink) as the exception it raised, or None while it is healthy. Never blocks.")
      .def(
          "set_timeout",
          [](PyComm& c, double seconds) { c.comm()->set_timeout(rr::python::to_ms(seconds)); },
          py::arg("seconds"), "The timeout of later calls that do not give their own.")
      .def_property_readonly(
          "parent_ranks", [](PyComm& c) { return c.comm()->parent_ranks(); },
          "For a communicator made by shrink(): each rank's rank in the communicator it was "
          "shrunk from ([] otherwise).")
      .def(
          "agree",
          [](PyComm& c, bool flag, std::optional<double> timeout) {
            const auto comm = c.comm();
            rr::CallOptions call;
            if (timeout) call.timeout = rr::python::to_ms(*timeout);
            py::gil_scoped_release nogil;
            return comm->agree(flag, call);
          },
          py::arg("flag") = true, py::arg("timeout") = py::none(),
          "agree(flag=True): collective over the ranks still alive, also on a communicator a "
          "failure aborted; returns an Agreement (flag: the AND of every survivor's flag, failed: "
          "the ranks taken as failed), the same on every survivor. Needs no store.")
      .def(
          "shrink",
          [](PyComm& c, std::optional<std::vector<int>> exclude, bool abort,
             std::optional<double> timeout) {
            const auto comm = c.comm();
            rr::CallOptions call;
            if (timeout) call.timeout = rr::python::to_ms(*timeout);
            const std::vector<int> ex = exclude.value_or(std::vector<int>{});
            std::shared_ptr<rr::Communicator> child;
            {
              py::gil_scoped_release nogil;
              child = std::make_shared<rr::Communicator>(
                  comm->shrink(ex, abort ? rr::ShrinkFlags::abort : rr::ShrinkFlags::none, call));
            }
            return std::make_unique<PyComm>(std::move(child));
          },
          py::arg("exclude") = py::none(), py::arg("abort") = false,
          py::arg("timeout") = py::none(),
          "shrink(exclude=None, abort=False): collective over the ranks still alive (the "
          "excluded ones do not call it); returns a Communicator of the survivors, ranked in "
          "their old order. exclude None: the ranks the survivors agree have failed. abort: "
          "abort this rank's outstanding ops first (else they are an error). This communicator "
          "is aborted afterwards. Needs no store.")
      .def(
          "grow",
          [](PyComm& c, const std::string& name, int newcomers, std::optional<double> timeout) {
            const auto comm = c.comm();
            rr::CallOptions call;
            if (timeout) call.timeout = rr::python::to_ms(*timeout);
            std::shared_ptr<rr::Communicator> child;
            {
              py::gil_scoped_release nogil;
              child = std::make_shared<rr::Communicator>(comm->grow(name, newcomers, call));
            }
            return std::make_unique<PyComm>(std::move(child));
          },
          py::arg("name"), py::arg("newcomers"), py::arg("timeout") = py::none(),
          "grow(name, newcomers): collective over this communicator; returns a Communicator of "
          "its ranks (same ranks) and `newcomers` new processes, which call "
          "Communicator.join(name). They meet in the job's store.")
      .def_static(
          "join",
          [](const std::string& name, std::optional<std::string> addr,
             std::optional<std::string> token, std::optional<double> timeout,
             std::map<std::string, std::string> settings) {
            rr::Options o;
            o.addr = std::move(addr);
            o.token = std::move(token);
            if (timeout) o.timeout = rr::python::to_ms(*timeout);
            o.settings = std::move(settings);
            std::shared_ptr<rr::Communicator> c;
            {
              py::gil_scoped_release nogil;
              c = std::make_shared<rr::Communicator>(rr::Communicator::join(name, o));
            }
            return std::make_unique<PyComm>(std::move(c));
          },
          py::arg("name"), py::arg("addr") = py::none(), py::arg("token") = py::none(),
          py::arg("timeout") = py::none(),
          py::arg("settings") = std::map<std::string, std::string>{},
          "Communicator.join(name): a new process's side of grow(name, k): joins the grown "
          "communicator through the job's store (addr, or RINGREDUCE_ADDR / MASTER_ADDR and "
          "MASTER_PORT, and the job id, from the environment).")
      .def(
          "split",
          [](PyComm& c, int color, std::optional<int> key) -> py::object {
            const auto comm = c.comm();
            std::shared_ptr<rr::Communicator> child;
            {
              py::gil_scoped_release nogil;  // a collective, then the new group's rendezvous
              child = std::make_shared<rr::Communicator>(
                  comm->split(color, key.value_or(comm->rank())));
            }
            if (!child->valid()) return py::none();
            return py::cast(std::make_unique<PyComm>(std::move(child)));
          },
          py::arg("color"), py::arg("key") = py::none(),
          "split(color, key=rank): collective; the ranks passing one color form a new "
          "Communicator, ranked by key (ties: by rank). color -1 (NO_COLOR): returns None.")
      .def(
          "alloc",
          [](PyComm& c, size_t nbytes) {
            PyMemory m{c.comm(), nullptr, nbytes};
            {
              py::gil_scoped_release nogil;  // a collective
              m.p = m.comm->alloc(nbytes);
            }
            return m;
          },
          py::arg("nbytes"),
          "alloc(nbytes): collective; a writable buffer of nbytes registered with this host's "
          "ranks (np.frombuffer(mem, dtype) views it as an array): large allreduces on it read "
          "and write the peers' buffers in place. It keeps the communicator alive; valid until "
          "free(): do not touch it, or arrays made from it, afterwards.")
      .def(
          "free",
          [](PyComm& c, py::buffer buffer) {
            void* p = buffer.request().ptr;
            const auto comm = c.comm();
            py::gil_scoped_release nogil;  // a collective
            comm->free(p);
          },
          py::arg("buffer"),
          "free(buffer): collective; frees what alloc() returned (or an array over its start).")
      .def("__enter__", [](py::object self) { return self; })
      .def("__exit__", [](PyComm& c, py::args) { c.close(); });

  // Each call as a blocking method (returns the output buffer) and an async one, name_async
  // (returns a Work). Each takes its own arguments only (keyword names follow torch.distributed
  // where it has one); `takes` lists them for refuse_extra's message.
  using U = PyComm::Uneven;
  for (bool async : {false, true}) {
    auto method = [async](const char* blocking, const char* nonblocking) {
      return async ? nonblocking : blocking;
    };
    const char* name = method("allreduce", "allreduce_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, py::object op,
            std::optional<std::string> dtype, std::optional<double> timeout, double premul_factor,
            std::optional<std::string> wire, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, op, dtype, timeout, premul_factor, wire", extra);
          return c.collective(K::allreduce, "allreduce", send, recv, op, 0, dtype, timeout,
                              premul_factor, async, wire);
        },
        py::arg("send"), py::arg("recv") = py::none(), py::arg("op") = py::none(),
        py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
        py::arg("premul_factor") = 1.0, py::kw_only(), py::arg("wire") = py::none(),
        "allreduce(send, recv=None, op='sum', wire=None): recv = op over ranks of send (in place "
        "without recv). op: sum, prod, min, max, avg, band, bor, bxor, premul_sum or a ReduceOp. "
        "wire: none, bf16, f16, fp8e4m3, fp8e5m2 or auto for float32 sums (None: "
        "RINGREDUCE_WIRE); docs/WIRE.md.");
    name = method("reduce_scatter", "reduce_scatter_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, py::object op,
            std::optional<std::string> dtype, std::optional<double> timeout, double premul_factor,
            std::optional<std::string> wire, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, op, dtype, timeout, premul_factor, wire", extra);
          return c.collective(K::reduce_scatter, "reduce_scatter", send, recv, op, 0, dtype,
                              timeout, premul_factor, async, wire);
        },
        py::arg("send"), py::arg("recv"), py::arg("op") = py::none(), py::arg("dtype") = py::none(),
        py::arg("timeout") = py::none(), py::arg("premul_factor") = 1.0, py::kw_only(),
        py::arg("wire") = py::none(),
        "reduce_scatter(send, recv, op='sum', wire=None): send holds size x len(recv) elements; "
        "rank r receives block r of the reduction. wire: as allreduce's.");
    name = method("allgather", "allgather_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, std::optional<std::string> dtype,
            std::optional<double> timeout, std::optional<std::string> wire, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, dtype, timeout, wire", extra);
          return c.collective(K::allgather, "allgather", send, recv, py::none(), 0, dtype, timeout,
                              1.0, async, wire);
        },
        py::arg("send"), py::arg("recv"), py::arg("dtype") = py::none(),
        py::arg("timeout") = py::none(), py::kw_only(), py::arg("wire") = py::none(),
        "allgather(send, recv, wire=None): recv holds size x len(send) elements; block r is rank "
        "r's send. wire: as allreduce's (each block rounded once).");
    // alltoall moves data: no op, no root, no wire format.
    name = method("alltoall", "alltoall_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, std::optional<std::string> dtype,
            std::optional<double> timeout, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, dtype, timeout", extra);
          return c.collective(K::alltoall, "alltoall", send, recv, py::none(), 0, dtype, timeout,
                              1.0, async);
        },
        py::arg("send"), py::arg("recv"), py::arg("dtype") = py::none(),
        py::arg("timeout") = py::none(),
        "alltoall(send, recv): both hold size equal blocks; block j of send goes to rank j.");
    name = method("broadcast", "broadcast_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, int root, std::optional<std::string> dtype,
            std::optional<double> timeout, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, root, dtype, timeout", extra);
          return c.collective(K::broadcast, "broadcast", send, recv, py::none(), root, dtype,
                              timeout, 1.0, async);
        },
        py::arg("send"), py::arg("recv") = py::none(), py::arg("root") = 0,
        py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
        "broadcast(send, recv=None, root=0): every rank's buffer becomes root's.");
    name = method("reduce", "reduce_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, py::object op, int root,
            std::optional<std::string> dtype, std::optional<double> timeout, double premul_factor,
            py::kwargs extra) {
          refuse_extra(c, name, "send, recv, op, root, dtype, timeout, premul_factor", extra);
          return c.collective(K::reduce, "reduce", send, recv, op, root, dtype, timeout,
                              premul_factor, async);
        },
        py::arg("send"), py::arg("recv") = py::none(), py::arg("op") = py::none(),
        py::arg("root") = 0, py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
        py::arg("premul_factor") = 1.0,
        "reduce(send, recv=None, op='sum', root=0): the root's recv (or send, in place) becomes "
        "the reduction; other ranks' buffers are unchanged.");
    for (const bool gather : {true, false}) {
      name = gather ? method("gather", "gather_async") : method("scatter", "scatter_async");
      auto fn = [=](PyComm& c, py::object send, py::object recv, int root,
                    std::optional<std::string> dtype, std::optional<double> timeout,
                    py::kwargs extra) {
        refuse_extra(c, name, "send, recv, root, dtype, timeout", extra);
        return c.gather_scatter(gather, send, recv, root, dtype, timeout, async);
      };
      if (gather)
        cls.def(name, fn, py::arg("send"), py::arg("recv") = py::none(), py::arg("root") = 0,
                py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
                "gather(send, recv=None, root=0): the root's recv (size x len(send) elements) "
                "gets rank r's send as block r; recv is only used on the root. Returns recv "
                "there, None elsewhere.");
      else
        cls.def(name, fn, py::arg("send"), py::arg("recv"), py::arg("root") = 0,
                py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
                "scatter(send, recv, root=0): rank r's recv gets block r of the root's send "
                "(size x len(recv) elements); send is only used on the root (None elsewhere).");
    }
    name = method("allgatherv", "allgatherv_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, std::vector<size_t> counts,
            std::optional<std::string> dtype, std::optional<double> timeout, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, counts, dtype, timeout", extra);
          return c.uneven(U::allgatherv, send, recv, counts, {}, py::none(), dtype, timeout, 1.0,
                          async);
        },
        py::arg("send"), py::arg("recv"), py::arg("counts"), py::arg("dtype") = py::none(),
        py::arg("timeout") = py::none(),
        "allgatherv(send, recv, counts): blocks of their own sizes, counts[r] from rank r (the "
        "same counts on every rank), one after another in recv; send holds counts[rank].");
    name = method("reduce_scatterv", "reduce_scatterv_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, std::vector<size_t> counts, py::object op,
            std::optional<std::string> dtype, std::optional<double> timeout, double premul_factor,
            py::kwargs extra) {
          refuse_extra(c, name, "send, recv, counts, op, dtype, timeout, premul_factor", extra);
          return c.uneven(U::reduce_scatterv, send, recv, counts, {}, op, dtype, timeout,
                          premul_factor, async);
        },
        py::arg("send"), py::arg("recv"), py::arg("counts"), py::arg("op") = py::none(),
        py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
        py::arg("premul_factor") = 1.0,
        "reduce_scatterv(send, recv, counts, op='sum'): send holds the blocks (counts[r] for rank "
        "r, the same counts on every rank); recv gets this rank's block, reduced.");
    name = method("alltoallv", "alltoallv_async");
    cls.def(
        name,
        [=](PyComm& c, py::object send, py::object recv, std::vector<size_t> send_counts,
            std::vector<size_t> recv_counts, std::optional<std::string> dtype,
            std::optional<double> timeout, py::kwargs extra) {
          refuse_extra(c, name, "send, recv, send_counts, recv_counts, dtype, timeout", extra);
          return c.uneven(U::alltoallv, send, recv, send_counts, recv_counts, py::none(), dtype,
                          timeout, 1.0, async);
        },
        py::arg("send"), py::arg("recv"), py::arg("send_counts"), py::arg("recv_counts"),
        py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
        "alltoallv(send, recv, send_counts, recv_counts): send_counts[j] elements to rank j and "
        "recv_counts[j] from rank j, blocks one after another.");
    name = method("send", "send_async");
    cls.def(
        name,
        [=](PyComm& c, py::object buf, int dst, uint64_t tag, std::optional<std::string> dtype,
            std::optional<double> timeout, py::kwargs extra) {
          refuse_extra(c, name, "buf, dst, tag, dtype, timeout", extra);
          return c.p2p(true, buf, dst, tag, dtype, timeout, async);
        },
        py::arg("buf"), py::arg("dst"), py::arg("tag") = 0, py::arg("dtype") = py::none(),
        py::arg("timeout") = py::none(),
        "send(buf, dst, tag=0): a message to rank dst, taken there by a recv with this rank (or "
        "any source) and this tag, of the same size. Messages with one tag arrive in the order "
        "sent; they are matched apart from the collectives, in any order relative to them.");
    name = method("recv", "recv_async");
    cls.def(
        name,
        [=](PyComm& c, py::object buf, std::optional<int> src, uint64_t tag,
            std::optional<std::string> dtype, std::optional<double> timeout, py::kwargs extra) {
          refuse_extra(c, name, "buf, src, tag, dtype, timeout", extra);
          return c.p2p(false, buf, src, tag, dtype, timeout, async);
        },
        py::arg("buf"), py::arg("src") = py::none(), py::arg("tag") = 0,
        py::arg("dtype") = py::none(), py::arg("timeout") = py::none(),
        "recv(buf, src=None, tag=0): receives a message of exactly len(buf) elements from rank "
        "src (None or ANY_SOURCE: whichever rank sends one with this tag first) into buf; "
        "returns the sender's rank.");
  }
  cls.def(
      "barrier",
      [](PyComm& c, std::optional<double> timeout, py::kwargs extra) {
        refuse_extra(c, "barrier", "timeout", extra);
        const auto comm = c.comm();
        const rr::CallOptions opts = call_options(timeout);
        ringreduce::python::blocking_call(*comm, [&] { comm->barrier(opts); });
      },
      py::arg("timeout") = py::none(), "Returns once every rank has called barrier().");
  cls.def(
      "barrier_async",
      [](PyComm& c, std::optional<double> timeout, py::kwargs extra) {
        refuse_extra(c, "barrier_async", "timeout", extra);
        const auto comm = c.comm();
        const rr::CallOptions opts = call_options(timeout);
        rr::Work w;
        {
          py::gil_scoped_release nogil;
          w = comm->barrier_async(opts);
        }
        return std::make_unique<PyWork>(std::move(w), std::vector<Buffer>{}, py::none(), comm);
      },
      py::arg("timeout") = py::none(), "barrier() as an op: returns a Work.");
  m.attr("ANY_SOURCE") = rr::Communicator::kAnySource;
  m.attr("NO_COLOR") = rr::Communicator::kNoColor;
}
