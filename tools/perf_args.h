// ringreduce-perf's command line: the options, their checks and the usage text, apart from the
// benchmark itself (perf.cc) so that the parsing can be unit-tested (tests/unit/perf_args_test.cc).
// Nothing here prints or exits; perf.cc decides what a usage error does.
//
// The short options are nccl-tests' (all_reduce_perf and its siblings) with nccl-tests' meaning,
// so that a command line written for one runs the other; what ringreduce-perf adds of its own
// (the algorithm, the adaptive iteration count's time, host or device buffers, --calibrate) has
// long options only, where no nccl-tests letter can clash with it.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ringreduce/types.h"

namespace perf {

enum class Coll { allreduce, reduce_scatter, allgather, broadcast, reduce, alltoall };

// -a: whose time a row reports (nccl-tests' --average): rank 0's, the mean over the ranks, the
// fastest rank's or the slowest rank's.
enum class Report { rank0 = 0, avg = 1, min = 2, max = 3 };

struct Args {
  Coll coll = Coll::allreduce;
  std::string coll_name = "allreduce";
  size_t min_bytes = 32 << 20, max_bytes = 32 << 20;
  // Sizes grow by `factor` when it is above 1, else by `step_bytes` (-i, as nccl-tests does).
  double factor = 2;
  size_t step_bytes = 0;
  long iters = 0;  // 0: adaptive, about target_seconds per size
  long warmup = 5;
  long check = 1;  // checked calls per size and variant; 0: none
  int root = 0;
  std::vector<ringreduce::DataType> dtypes{ringreduce::DataType::f32};
  std::vector<ringreduce::ReduceOp> ops{ringreduce::ReduceOp::sum};
  bool blocking = false;  // -z 1: a barrier after every call
  // The slowest rank by default: what a step of a job waits for (nccl-tests' default is the mean).
  Report report = Report::max;
  double timeout_s = 0;         // -T: RINGREDUCE_TIMEOUT for the run; 0 keeps the setting's own
  std::string algo;             // --algorithm
  double target_seconds = 0.2;  // --time-per-size
  bool device = false;          // --buffers device: buffers in CUDA device memory
  bool registered = false;      // --buffers registered: buffers from Communicator::alloc
  std::string calibrate_file;   // --calibrate FILE
  // --wire: the calls' CallOptions::wire (unset: RINGREDUCE_WIRE's value).
  bool wire_set = false;
  ringreduce::Wire wire = ringreduce::Wire::none;

  // The size after `bytes`, or `bytes` itself when the sizes stop growing.
  size_t next_bytes(size_t bytes) const;
};

// What the command line asks for: a benchmark, a calibration, the usage text, the version, or
// none of them (a usage error).
struct Parsed {
  enum class Kind { run, calibrate, help, version, usage_error };
  Kind kind = Kind::usage_error;
  Args args;          // for run and calibrate
  std::string error;  // for usage_error: one line that names the option and the value
};

extern const char kUsage[];

// Uses getopt_long (its global state is reset on each call; not thread-safe). argv is not
// changed: getopt's reordering happens on a copy.
Parsed parse_args(int argc, const char* const* argv);

}  // namespace perf
