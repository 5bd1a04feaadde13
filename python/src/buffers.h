// Python objects as ringreduce buffers: NumPy arrays and anything with the buffer protocol, torch
// tensors through data_ptr() (torch is never imported here unless a tensor is on a GPU), and CUDA
// arrays through __cuda_array_interface__ (CuPy, Numba), used in place; reduce ops,
// timeouts and call options from their Python spellings. Every refusal is an InvalidArgument
// naming the rank and the call.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "ringreduce/ringreduce.hpp"

namespace ringreduce::python {

namespace py = pybind11;
namespace rr = ringreduce;

// Memory handed to a collective and what keeps it alive.
struct Buffer {
  void* data = nullptr;
  size_t count = 0;  // elements
  rr::DataType dtype = rr::DataType::f32;
  py::object owner;
  std::shared_ptr<py::buffer_info> view;  // the buffer protocol export, released with the Buffer
  // CUDA device memory, and the stream its producer orders work on (a cudaStream_t; nullptr:
  // the legacy default stream): a torch tensor's current stream, an array's interface stream.
  bool device = false;
  void* stream = nullptr;
};

// Calls on device buffers are stream-ordered on the first device buffer's stream (docs/GPU.md).
void place(rr::CallOptions& opts, const Buffer& a, const Buffer& b);

[[noreturn]] void bad_argument(const rr::Communicator* comm, const char* call,
                               const std::string& what);

// `dtype` overrides the element type of the memory (same element size): a uint16 NumPy array
// holding bfloat16 values is passed with dtype="bfloat16". `role` names the buffer in errors.
Buffer to_buffer(const rr::Communicator* comm, const char* call, const char* role,
                 const py::object& obj, const std::optional<std::string>& dtype, bool writable);

// A ReduceOp or its name ("sum", ... "premul_sum").
rr::ReduceOp to_op(const rr::Communicator* comm, const char* call, const py::object& op);

// Seconds from Python as milliseconds; NaN, infinite, negative or absurd values are refused
// (converting them to an integer would be undefined).
std::chrono::milliseconds to_ms(double seconds);

// A timeout in seconds, and premul_sum's factor.
rr::CallOptions call_options(std::optional<double> timeout_s, double premul_factor = 1.0);

}  // namespace ringreduce::python
