// ringrun's command line: the options, their checks and the usage text, apart from the launcher
// itself (ringrun.cc) so that each stays readable. Nothing here prints or exits; ringrun.cc
// decides what a usage error does.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ringrun {

// Ranks one ringrun starts (-n): what its descriptors and pipes are sized for.
inline constexpr int kMaxRanks = 1024;
// Ranks of a whole job over every node (-n times --nnodes).
inline constexpr long kMaxWorld = 65536;

extern const char kUsage[];

struct Args {
  int n = 0;          // ranks on this host
  int nnodes = 1;     // ringruns in the job, one per host
  int node_rank = 0;  // this ringrun's place among them; its ranks are node_rank*n .. +n-1
  // --master HOST:PORT: where the job's store is (node 0 listens there, the others' ranks connect
  // to it). Unset: a single-node job whose store listens on 127.0.0.1, port 0.
  std::optional<std::string> master;  // as given, handed to the ranks as RINGREDUCE_ADDR
  std::string master_host;            // brackets of an IPv6 literal removed
  int master_port = 0;
  // Pinning ranks to cores, as mpirun does by default: unpinned, the scheduler's wake-affine
  // placement often stacks two communicating ranks on one core (a socket wake-up pulls the woken
  // rank next to its waker) while the other core idles, and they then take turns on it.
  bool bind = true;
  std::optional<double> timeout_s;
  std::string timeout_text;
  bool store_stats = false;
  // --elastic: a rank's failure does not end the job (the others shrink and go on).
  bool elastic = false;
  std::vector<std::string> command;

  int first_rank() const { return node_rank * n; }
  int world_size() const { return nnodes * n; }
  // Only node 0 hosts the store; the ranks of the other nodes connect to it.
  bool hosts_store() const { return node_rank == 0; }
};

// What the command line asks for: a job to run, the usage text, the version, or none of them (a
// usage error).
struct Parsed {
  enum class Kind { run, help, version, usage_error };
  Kind kind = Kind::usage_error;
  Args args;          // for run
  std::string error;  // for usage_error: one line that names the option and the value
};

Parsed parse_args(int argc, const char* const* argv);

}  // namespace ringrun
