// detect_launch: the launcher chain (docs/ARCHITECTURE.md, rendezvous/; README's settings). The
// first family whose rank variable is set decides rank and world size; a family that is only half
// set is an error rather than a reason to fall through, because falling through would quietly pick
// up some other launcher's (stale) numbers.
#include "rendezvous/launch_env.h"

#include <algorithm>
#include <vector>

#include "rendezvous/socket_util.h"
#include "rendezvous/tcp_store.h"
#include "rendezvous/torch_store.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

struct Family {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;  // nullptr: the family has no such variable
  const char* local_size;
};

// The launchers' own variables, in the order README's Launching section gives. RINGREDUCE_* come
// first, through the Config (so that Options override them), and are handled separately.
constexpr Family kLaunchers[] = {
    {"torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
    {"openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"},
    {"slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE"},
    {"pmi", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"},
};

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// A launcher variable, or nullopt when unset or empty (an empty variable is treated as unset,
// as the Config does for settings).
std::optional<std::string> launcher_var(const std::string& name) {
  auto v = core::env(name);
  if (!v) return std::nullopt;
  std::string t = trim(*v);
  if (t.empty()) return std::nullopt;
  return t;
}

// Strict decimal in [min, max]: "3", not "3.0", "-1", "0x3" or "3 ranks".
int parse_int(const std::string& name, const std::string& origin, const std::string& value, int min,
              int max, const char* what) {
  std::string t = trim(value);
  bool digits = !t.empty() && t.size() <= 10 &&
                std::all_of(t.begin(), t.end(), [](char c) { return c >= '0' && c <= '9'; });
  long long v = digits ? std::stoll(t) : -1;
  if (!digits || v < min || v > max)
    throw InvalidArgument(name + "='" + value + "'" + origin + " is not a valid " + what +
                          " (an integer from " + std::to_string(min) + " to " +
                          std::to_string(max) + ")");
  return static_cast<int>(v);
}

constexpr int kMaxRanks = 1 << 30;

// SLURM_NTASKS_PER_NODE is "4"; SLURM_TASKS_PER_NODE (srun sets it even without
// --ntasks-per-node) is a run-length list such as "2(x3),1": 2 tasks on each of 3 nodes, then 1.
// Returns -1 when nodes differ and SLURM_NODEID does not say which one this is.
int parse_slurm_tasks_per_node(const std::string& name, const std::string& value) {
  auto bad = [&] {
    return InvalidArgument(name + "='" + value +
                           "' is not a task count such as 4, 2(x3) or 2(x3),1");
  };
  std::vector<std::pair<int, int>> runs;  // (tasks per node, nodes)
  size_t pos = 0;
  // Bounded by the string: every pass consumes at least one character or throws.
  while (pos <= value.size()) {
    size_t end = value.find(',', pos);
    std::string part = value.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    int reps = 1;
    size_t paren = part.find('(');
    if (paren != std::string::npos) {
      if (part.size() < paren + 4 || part.compare(paren, 2, "(x") != 0 || part.back() != ')')
        throw bad();
      reps = parse_int(name, "", part.substr(paren + 2, part.size() - paren - 3), 1, kMaxRanks,
                       "node count");
      part = part.substr(0, paren);
    }
    try {
      runs.emplace_back(parse_int(name, "", part, 1, kMaxRanks, "task count"), reps);
    } catch (const InvalidArgument&) {
      throw bad();
    }
    if (end == std::string::npos) break;
    pos = end + 1;
  }
  bool uniform = std::all_of(runs.begin(), runs.end(),
                             [&](const auto& r) { return r.first == runs.front().first; });
  if (uniform) return runs.front().first;
  auto node_text = launcher_var("SLURM_NODEID");
  if (!node_text) return -1;
  int64_t node = parse_int("SLURM_NODEID", "", *node_text, 0, kMaxRanks, "node index");
  for (const auto& [tasks, nodes] : runs) {
    if (node < nodes) return tasks;
    node -= nodes;
  }
  throw InvalidArgument("SLURM_NODEID=" + *node_text + " is beyond the nodes that " + name + "='" +
                        value + "' describes");
}

// Fills local_rank/local_size from a family's variables; returns whether any was set.
bool read_local(const Family& f, LaunchInfo* info) {
  auto lr = launcher_var(f.local_rank);
  std::optional<std::string> ls = launcher_var(f.local_size);
  std::string ls_name = f.local_size;
  if (!ls && std::string(f.launcher) == "slurm") {
    ls = launcher_var("SLURM_TASKS_PER_NODE");
    ls_name = "SLURM_TASKS_PER_NODE";
  }
  if (!lr && !ls) return false;
  if (lr) info->local_rank = parse_int(f.local_rank, "", *lr, 0, kMaxRanks - 1, "local rank");
  if (ls) {
    info->local_size = std::string(f.launcher) == "slurm"
                           ? parse_slurm_tasks_per_node(ls_name, *ls)
                           : parse_int(ls_name, "", *ls, 1, kMaxRanks, "local size");
  }
  if (info->local_rank >= 0 && info->local_size > 0 && info->local_rank >= info->local_size)
    throw InvalidArgument(std::string(f.local_rank) + "=" + *lr + " is not below " + ls_name + "=" +
                          *ls);
  if (info->local_size > info->world_size)
    throw InvalidArgument(ls_name + "=" + *ls + " exceeds the world size " +
                          std::to_string(info->world_size));
  return true;
}

std::string looked_for() {
  std::string out = "RINGREDUCE_RANK/RINGREDUCE_WORLD_SIZE (ringrun or by hand)";
  for (const auto& f : kLaunchers)
    out += std::string(", ") + f.rank + "/" + f.size + " (" + f.launcher + ")";
  return out;
}

void read_store_address(const core::Config& config, LaunchInfo* info) {
  std::string addr = trim(config.str("RINGREDUCE_ADDR"));
  if (!addr.empty()) {
    std::string origin = " (from " + config.source("RINGREDUCE_ADDR") + ")";
    std::string host;
    int port = -1;
    try {
      split_host_port(addr, &host, &port);
    } catch (const InvalidArgument& e) {
      throw InvalidArgument("RINGREDUCE_ADDR" + origin + ": " + e.what());
    }
    if (port <= 0)
      throw InvalidArgument("RINGREDUCE_ADDR='" + addr + "'" + origin +
                            " needs a port from 1 to 65535, e.g. host:29500 or [::1]:29500");
    info->store_host = host;
    info->store_port = port;
    return;
  }
  auto master_addr = launcher_var("MASTER_ADDR");
  auto master_port = launcher_var("MASTER_PORT");
  if (!master_addr && !master_port) return;  // no store address: the caller decides
  if (!master_addr || !master_port)
    throw InvalidArgument(std::string(master_addr ? "MASTER_ADDR" : "MASTER_PORT") +
                          " is set but " + (master_addr ? "MASTER_PORT" : "MASTER_ADDR") +
                          " is not; set both, or RINGREDUCE_ADDR=host:port");
  std::string host = *master_addr;
  // torchrun passes IPv6 addresses bare, but a bracketed one is unambiguous too.
  if (host.size() > 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  bool host_ok = std::all_of(host.begin(), host.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '.' || c == '_' ||
           c == ':' || c == '%';
  });
  if (!host_ok)
    throw InvalidArgument("MASTER_ADDR='" + *master_addr + "' is not a host name or address");
  info->store_host = host;
  info->store_port = parse_int("MASTER_PORT", "", *master_port, 1, 65535, "port");
  // torchrun's agent hosts torch's TCPStore there (its own rendezvous and torch's
  // init_process_group use it); torch itself tests for exactly "True".
  info->torch_store = launcher_var("TORCHELASTIC_USE_AGENT_STORE") == "True";
}

}  // namespace

LaunchInfo detect_launch(const core::Config& config) {
  LaunchInfo info;
  std::string rr_rank = trim(config.str("RINGREDUCE_RANK"));
  std::string rr_size = trim(config.str("RINGREDUCE_WORLD_SIZE"));
  const Family* family = nullptr;

  if (!rr_rank.empty() || !rr_size.empty()) {
    auto origin = [&](const char* name) { return " (from " + config.source(name) + ")"; };
    if (rr_rank.empty() || rr_size.empty())
      throw InvalidArgument(
          std::string(rr_rank.empty() ? "RINGREDUCE_WORLD_SIZE" : "RINGREDUCE_RANK") +
          " is set but " + (rr_rank.empty() ? "RINGREDUCE_RANK" : "RINGREDUCE_WORLD_SIZE") +
          " is not; set both (Options rank/world_size or the environment)");
    info.world_size = parse_int("RINGREDUCE_WORLD_SIZE", origin("RINGREDUCE_WORLD_SIZE"), rr_size,
                                1, kMaxRanks, "world size");
    info.rank =
        parse_int("RINGREDUCE_RANK", origin("RINGREDUCE_RANK"), rr_rank, 0, kMaxRanks - 1, "rank");
    info.launcher = config.source("RINGREDUCE_RANK") == "options" ? "options" : "ringreduce";
    if (info.rank >= info.world_size)
      throw InvalidArgument("RINGREDUCE_RANK=" + rr_rank +
                            " is not below RINGREDUCE_WORLD_SIZE=" + rr_size);
  } else {
    for (const auto& f : kLaunchers) {
      auto rank = launcher_var(f.rank);
      if (!rank) continue;
      auto size = launcher_var(f.size);
      if (!size)
        throw InvalidArgument(std::string(f.rank) + " is set (" + f.launcher + ") but " + f.size +
                              " is not");
      info.world_size = parse_int(f.size, "", *size, 1, kMaxRanks, "world size");
      info.rank = parse_int(f.rank, "", *rank, 0, kMaxRanks - 1, "rank");
      if (info.rank >= info.world_size)
        throw InvalidArgument(std::string(f.rank) + "=" + *rank + " is not below " + f.size + "=" +
                              *size);
      info.launcher = f.launcher;
      family = &f;
      break;
    }
    if (family == nullptr)
      throw InvalidArgument("cannot tell this process's rank and world size: looked for " +
                            looked_for() +
                            " and found none; launch with ringrun, torchrun, mpirun or srun, or "
                            "set RINGREDUCE_RANK and RINGREDUCE_WORLD_SIZE");
  }

  // Local rank and size: from the launcher that gave the rank, or, for RINGREDUCE_* (ringrun or
  // by hand), from whichever launcher also ran the process, in chain order.
  if (family != nullptr) {
    read_local(*family, &info);
  } else {
    // ringrun also says how many ranks share this host.
    static constexpr Family kRingrun = {"ringreduce", "RINGREDUCE_RANK", "RINGREDUCE_WORLD_SIZE",
                                        core::kLocalRankVariable, core::kLocalSizeVariable};
    if (!read_local(kRingrun, &info))
      for (const auto& f : kLaunchers)
        if (read_local(f, &info)) break;
  }

  read_store_address(config, &info);
  return info;
}

LaunchHints launch_hints(const core::Config& config) noexcept {
  LaunchHints h;
  try {
    const std::string rr_rank = trim(config.str("RINGREDUCE_RANK"));
    if (!rr_rank.empty()) {
      h.rank = rr_rank;
    } else {
      for (const auto& f : kLaunchers)
        if (auto r = launcher_var(f.rank)) {
          h.rank = trim(*r);
          break;
        }
    }
  } catch (...) {
  }
  try {
    LaunchInfo info;
    read_store_address(config, &info);
    h.store_host = info.store_host;
    h.store_port = info.store_port;
    h.torch_store = info.torch_store;
  } catch (...) {
  }
  return h;
}

std::shared_ptr<Store> connect_store(const std::string& host, int port, bool torch_store,
                                     std::chrono::milliseconds timeout,
                                     const core::Security& security) {
  if (torch_store) return connect_torch_store(host, port, timeout);
  return connect_tcp_store(host, port, timeout, security);
}

bool rounds_share_store() {
  return launcher_var("TORCHELASTIC_RUN_ID") || launcher_var("TORCHELASTIC_RESTART_COUNT");
}

std::string job_id(const core::Config& config) {
  std::string id = trim(config.str("RINGREDUCE_JOB_ID"));
  if (!id.empty()) return id;
  if (rounds_share_store()) {
    // Not the restart count: it is each agent's own, and an agent that joins an elastic job
    // later counts from 0 where the others are at 2. The groups of one job are told apart by
    // their generation in the store (first_free_generation), as its store outlives them.
    auto run = launcher_var("TORCHELASTIC_RUN_ID");
    return "torchrun-" + (run && !trim(*run).empty() ? trim(*run) : std::string("none"));
  }
  if (auto job = launcher_var("SLURM_JOB_ID")) {
    auto step = launcher_var("SLURM_STEP_ID");
    return "slurm-" + trim(*job) + "." + (step ? trim(*step) : std::string("0"));
  }
  if (auto job = launcher_var("OMPI_MCA_ess_base_jobid")) return "ompi-" + trim(*job);
  return "";
}

}  // namespace ringreduce::rendezvous
