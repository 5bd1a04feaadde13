#include "buffers.h"

#include <cmath>
#include <string>
#include <vector>

namespace ringreduce::python {

[[noreturn]] void bad_argument(const rr::Communicator* comm, const char* call,
                               const std::string& what) {
  std::string prefix = comm ? "rank " + std::to_string(comm->rank()) + ": " : "";
  throw rr::InvalidArgument(prefix + call + ": " + what);
}

namespace {

// The DataType of an element kind ('f' float, 'i' signed, 'u' unsigned, 'b' boolean: the
// __cuda_array_interface__'s letters) and width.
std::optional<rr::DataType> dtype_of_kind(char kind, size_t itemsize) {
  switch (kind) {
    case 'f':
      if (itemsize == 2) return rr::DataType::f16;
      if (itemsize == 4) return rr::DataType::f32;
      if (itemsize == 8) return rr::DataType::f64;
      break;
    case 'i':
      if (itemsize == 1) return rr::DataType::i8;
      if (itemsize == 2) return rr::DataType::i16;
      if (itemsize == 4) return rr::DataType::i32;
      if (itemsize == 8) return rr::DataType::i64;
      break;
    case 'u':
      if (itemsize == 1) return rr::DataType::u8;
      if (itemsize == 4) return rr::DataType::u32;
      if (itemsize == 8) return rr::DataType::u64;
      break;
    case 'b':
      if (itemsize == 1) return rr::DataType::boolean;
      break;
    default:
      break;
  }
  return std::nullopt;
}

// The DataType of a buffer protocol format: kind from the format character, width from itemsize
// (the same letter means different widths on different platforms).
std::optional<rr::DataType> dtype_of_format(const std::string& format, py::ssize_t itemsize) {
  if (format.empty() || itemsize <= 0) return std::nullopt;
  // Skips a byte-order prefix ('<', '=', '@'); big-endian ('>', '!') or compound formats are not
  // taken.
  if (format.size() > 1 && format.front() != '<' && format.front() != '=' && format.front() != '@')
    return std::nullopt;
  char kind = 0;
  switch (format.back()) {
    case 'e':
    case 'f':
    case 'd':
      kind = 'f';
      break;
    case '?':
      kind = 'b';
      break;
    case 'b':
    case 'h':
    case 'i':
    case 'l':
    case 'q':
      kind = 'i';
      break;
    case 'B':
    case 'H':
    case 'I':
    case 'L':
    case 'Q':
      kind = 'u';
      break;
    default:
      return std::nullopt;
  }
  return dtype_of_kind(kind, static_cast<size_t>(itemsize));
}

// A CUDA array (CuPy, Numba; the __cuda_array_interface__ protocol, version 2 and 3): its device
// pointer, element type and count; C-contiguous only. Its "stream" (v3) is the stream the array's
// producer ordered it on: 1 and 2 are CUDA's own handles for the legacy and per-thread default
// streams, so the integer is the cudaStream_t as it stands; none means no ordering is needed.
void from_cuda_array_interface(const rr::Communicator* comm, const char* call, const char* role,
                               const py::object& cai, bool writable, Buffer& b,
                               std::optional<rr::DataType>& t, size_t& itemsize) {
  const std::string who = std::string(role) + "'s __cuda_array_interface__";
  if (!py::isinstance<py::dict>(cai)) bad_argument(comm, call, who + " is not a dict");
  const py::dict d = cai.cast<py::dict>();
  if (!d.contains("data") || !d.contains("shape") || !d.contains("typestr"))
    bad_argument(comm, call, who + " lacks data, shape or typestr");
  const py::tuple data = d["data"].cast<py::tuple>();
  if (data.size() != 2) bad_argument(comm, call, who + ": data must be (pointer, read_only)");
  if (writable && data[1].cast<bool>())
    bad_argument(comm, call, std::string(role) + " is read-only");
  const std::string typestr = d["typestr"].cast<std::string>();
  // "<f4", "|u1", ...: byte order, kind, size; only little-endian or byte-sized elements.
  if (typestr.size() < 3 || (typestr[0] != '<' && typestr[0] != '|' && typestr[0] != '='))
    bad_argument(comm, call, who + ": typestr '" + typestr + "' is not little-endian");
  itemsize = static_cast<size_t>(std::stoul(typestr.substr(2)));
  t = dtype_of_kind(typestr[1], itemsize);
  size_t count = 1;
  std::vector<size_t> shape;
  for (const auto& dim : d["shape"].cast<py::tuple>()) {
    shape.push_back(dim.cast<size_t>());
    count *= shape.back();
  }
  if (d.contains("strides") && !d["strides"].is_none()) {
    size_t expect = itemsize;
    const py::tuple strides = d["strides"].cast<py::tuple>();
    if (strides.size() != shape.size())
      bad_argument(comm, call, who + ": strides and shape differ");
    for (size_t k = shape.size(); k-- > 0;) {
      if (shape[k] > 1 && strides[k].cast<size_t>() != expect)
        bad_argument(comm, call, std::string(role) + " is not C-contiguous");
      expect *= shape[k];
    }
  }
  b.data = reinterpret_cast<void*>(data[0].cast<uintptr_t>());
  b.count = count;
  b.device = true;
  if (d.contains("stream") && !d["stream"].is_none())
    b.stream = reinterpret_cast<void*>(d["stream"].cast<uintptr_t>());
}

}  // namespace

void place(rr::CallOptions& opts, const Buffer& a, const Buffer& b) {
  if (!a.device && !b.device) {
    // Host memory, known from the objects themselves: saying so spares the call the driver's
    // pointer lookups in a process that uses CUDA (~0.1 us a buffer, docs/GPU.md).
    opts.memory = rr::Memory::host;
    return;
  }
  // Memory::device for both: a host buffer beside a device one is copied as well (cudaMemcpy
  // finds the direction), so one statement covers mixed calls.
  opts.memory = rr::Memory::device;
  opts.stream = a.device ? a.stream : b.stream;
}

Buffer to_buffer(const rr::Communicator* comm, const char* call, const char* role,
                 const py::object& obj, const std::optional<std::string>& dtype, bool writable) {
  Buffer b;
  b.owner = obj;
  std::optional<rr::DataType> t;
  size_t itemsize = 0;
  if (py::hasattr(obj, "data_ptr") && py::hasattr(obj, "numel") && py::hasattr(obj, "dtype")) {
    // A torch tensor (duck-typed: this module does not depend on torch).
    const std::string device = py::str(obj.attr("device").attr("type")).cast<std::string>();
    if (device == "cuda") {
      // Ordered on the tensor's device's current stream, as torch's own ops on it are.
      b.device = true;
      py::object s =
          py::module_::import("torch").attr("cuda").attr("current_stream")(obj.attr("device"));
      b.stream = reinterpret_cast<void*>(s.attr("cuda_stream").cast<uintptr_t>());
    } else if (device != "cpu") {
      bad_argument(comm, call,
                   std::string(role) + " is a tensor on " +
                       py::str(obj.attr("device")).cast<std::string>() +
                       "; this module takes CPU and CUDA tensors");
    }
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
  } else if (py::hasattr(obj, "__cuda_array_interface__")) {
    from_cuda_array_interface(comm, call, role, obj.attr("__cuda_array_interface__"), writable, b,
                              t, itemsize);
    if (!t && !dtype)
      bad_argument(comm, call,
                   std::string(role) + " has typestr '" +
                       obj.attr("__cuda_array_interface__")["typestr"].cast<std::string>() +
                       "', which ringreduce does not know (pass dtype=)");
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
                     " must be a NumPy array, a torch tensor, a CUDA array "
                     "(__cuda_array_interface__) or another object with the buffer protocol, "
                     "not " +
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

std::chrono::milliseconds to_ms(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e9)
    throw rr::InvalidArgument("timeout must be a finite number of seconds >= 0, not " +
                              std::to_string(seconds));
  return std::chrono::milliseconds(static_cast<int64_t>(seconds * 1000.0));
}

rr::CallOptions call_options(std::optional<double> timeout_s, double premul_factor) {
  rr::CallOptions c;
  if (timeout_s) c.timeout = to_ms(*timeout_s);
  if (!std::isfinite(premul_factor))
    throw rr::InvalidArgument("premul_factor must be a finite number, not " +
                              std::to_string(premul_factor));
  c.premul_factor = premul_factor;
  return c;
}

}  // namespace ringreduce::python
