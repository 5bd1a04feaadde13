#include "ringrun_args.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <string_view>

#include "rendezvous/socket_util.h"
#include "rendezvous/tcp_store.h"
#include "ringreduce/error.h"

namespace ringrun {

const char kUsage[] =
    "usage: ringrun -n N [--nnodes K --node-rank I --master HOST:PORT] [--timeout SECONDS]\n"
    "               [--bind core|none] [--elastic] [--store-stats] [--] program [args...]\n"
    "\n"
    "Starts N local ranks of program. Alone (no --nnodes), ringrun hosts their rendezvous\n"
    "store on 127.0.0.1 and the ranks are 0..N-1. For a job over K hosts, run one ringrun on\n"
    "each with the same -n, --nnodes and --master and its own --node-rank I: its ranks are\n"
    "I*N..I*N+N-1 of K*N; node 0's ringrun hosts the store on HOST:PORT, and the other\n"
    "nodes' ranks connect to it (they retry until it is up, within RINGREDUCE_TIMEOUT).\n"
    "Each rank gets RINGREDUCE_RANK, RINGREDUCE_WORLD_SIZE, RINGREDUCE_LOCAL_RANK,\n"
    "RINGREDUCE_LOCAL_SIZE, RINGREDUCE_ADDR (127.0.0.1:PORT, or HOST:PORT) and\n"
    "RINGREDUCE_STORE_SERVER=0, and torchrun's RANK, WORLD_SIZE, LOCAL_RANK,\n"
    "LOCAL_WORLD_SIZE, MASTER_ADDR (127.0.0.1, or HOST) and MASTER_PORT (unless set: a free\n"
    "port, or with --master the one next to PORT, which torch's rank 0 binds itself), for\n"
    "torch.distributed's env:// rendezvous; its output lines are prefixed with \"[rank] \",\n"
    "the global rank. Stdin of every rank is /dev/null.\n"
    "With RINGREDUCE_TOKEN set, the store serves only ranks that prove they hold it\n"
    "(the ranks inherit it: set it for every node's ringrun); with RINGREDUCE_ENCRYPT=psk|tls\n"
    "the store's connections and the ranks' are encrypted alike.\n"
    "\n"
    "  -n N, -np N         ranks on this host, 1..1024 (-np: mpirun's spelling)\n"
    "  --nnodes K          hosts in the job, one ringrun each (default 1); K*N at most 65536\n"
    "  --node-rank I       this host's place in the job, 0..K-1 (default 0)\n"
    "  --master HOST:PORT  the store's address, required with --nnodes above 1: node 0\n"
    "                      listens there, the other nodes connect; HOST is an IPv4 address,\n"
    "                      an [IPv6] one or a name, PORT 1..65535\n"
    "  --timeout SECONDS   kill this host's ranks if still running after SECONDS\n"
    "  --bind core|none    pin local rank i to the i-th usable core, round robin (default core)\n"
    "  --elastic           a rank that dies or fails does not end the job: the others go on\n"
    "                      (to shrink their communicator and carry on), and the job ends\n"
    "                      when every rank has ended; each failure is named as it happens\n"
    "                      and again at the end\n"
    "  --store-stats       at the end, say how many requests the store served (node 0 only:\n"
    "                      the other nodes host no store)\n"
    "  -h, --help          print this text\n"
    "  --version           print the version\n"
    "\n"
    "Exit status: 0 if every rank exited 0; else the first failing rank's code (128+signal\n"
    "if it was killed); 124 on timeout; 128+signal if ringrun was interrupted; 2 on bad\n"
    "usage; 126/127 if the program cannot be executed / is not found. With --elastic, ranks\n"
    "killed by a signal do not count while some rank exits by itself: 0 if every rank that\n"
    "exited did so with 0 (the survivors finished the job), else the first nonzero code.\n";

namespace {

// Strict decimal integer: no sign, no spaces, no trailing garbage.
std::optional<long> parse_int(const std::string& s) {
  if (s.empty() || s.size() > 9) return std::nullopt;
  long v = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return std::nullopt;
    v = v * 10 + (c - '0');
  }
  return v;
}

std::optional<double> parse_seconds(const std::string& s) {
  if (s.empty()) return std::nullopt;
  char* end = nullptr;
  errno = 0;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || end != s.c_str() + s.size() || !std::isfinite(v) || v <= 0 || v > 1e8)
    return std::nullopt;
  return v;
}

bool takes_value(std::string_view name) {
  return name == "-n" || name == "--timeout" || name == "--bind" || name == "--nnodes" ||
         name == "--node-rank" || name == "--master";
}

}  // namespace

Parsed parse_args(int argc, const char* const* argv) {
  Parsed p;
  Args& a = p.args;
  bool have_n = false, have_nnodes = false;
  auto fail = [&](const std::string& why) {
    p.kind = Parsed::Kind::usage_error;
    p.error = why;
    return p;
  };
  int i = 1;
  for (; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg == "-h" || arg == "--help") {
      p.kind = Parsed::Kind::help;
      return p;
    }
    if (arg == "--version") {
      p.kind = Parsed::Kind::version;
      return p;
    }
    if (arg == "--elastic") {
      a.elastic = true;
      continue;
    }
    if (arg == "--store-stats") {
      a.store_stats = true;
      continue;
    }
    // The value comes as "--opt V", "--opt=V", or for -n also "-nV" and "-n=V". mpirun's -np
    // and --np are -n's other names (so that an mpirun command line runs under ringrun).
    std::string name = arg;
    std::optional<std::string> value;
    if (const size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      name = arg.substr(0, eq);
      value = arg.substr(eq + 1);
      if (name == "--np") name = "-n";
    } else if (arg == "-np" || arg == "--np") {
      name = "-n";
    } else if (arg.rfind("-n", 0) == 0 && arg.size() > 2) {
      name = "-n";
      value = arg.substr(arg[2] == '=' ? 3 : 2);
    }
    if (!takes_value(name)) {
      if (!arg.empty() && arg[0] == '-') return fail("unknown option '" + arg + "'");
      break;  // the program
    }
    if (!value) {
      if (i + 1 >= argc) return fail(name + " needs a value");
      value = argv[++i];
    }
    const std::string& v = *value;
    if (name == "-n") {
      auto n = parse_int(v);
      if (!n || *n < 1 || *n > kMaxRanks)
        return fail("-n must be an integer from 1 to " + std::to_string(kMaxRanks) + ", not '" + v +
                    "'");
      a.n = static_cast<int>(*n);
      have_n = true;
    } else if (name == "--timeout") {
      a.timeout_s = parse_seconds(v);
      if (!a.timeout_s)
        return fail("--timeout needs a positive number of seconds, not '" + v + "'");
      a.timeout_text = v;
    } else if (name == "--bind") {
      if (v != "core" && v != "none") return fail("--bind must be core or none, not '" + v + "'");
      a.bind = v == "core";
    } else if (name == "--nnodes") {
      auto k = parse_int(v);
      if (!k || *k < 1 || *k > kMaxWorld)
        return fail("--nnodes must be an integer from 1 to " + std::to_string(kMaxWorld) +
                    ", not '" + v + "'");
      a.nnodes = static_cast<int>(*k);
      have_nnodes = true;
    } else if (name == "--node-rank") {
      auto r = parse_int(v);
      // The upper bound against --nnodes is checked once every option is known.
      if (!r || *r >= kMaxWorld)
        return fail("--node-rank must be an integer from 0 to --nnodes - 1, not '" + v + "'");
      a.node_rank = static_cast<int>(*r);
    } else {  // --master
      // The library's own parser of RINGREDUCE_ADDR, so that ringrun accepts exactly the
      // addresses its ranks will: host:port, [v6]:port, a name.
      try {
        ringreduce::rendezvous::split_host_port(v, &a.master_host, &a.master_port);
      } catch (const ringreduce::InvalidArgument& e) {
        return fail(std::string("--master: ") + e.what());
      }
      // Port 0 would let node 0 pick one that the other nodes cannot know.
      if (a.master_port <= 0)
        return fail("--master needs HOST:PORT with a port from 1 to 65535, not '" + v + "'");
      a.master = v;
    }
  }
  if (!have_n) return fail("-n N is required");
  if (a.node_rank >= a.nnodes)
    return fail("--node-rank must be from 0 to " + std::to_string(a.nnodes - 1) +
                " with --nnodes " + std::to_string(a.nnodes) + ", not '" +
                std::to_string(a.node_rank) + "'" + (have_nnodes ? "" : " (no --nnodes given)"));
  if (a.nnodes > 1 && !a.master)
    return fail("--nnodes " + std::to_string(a.nnodes) +
                " needs --master HOST:PORT, the address where node 0 hosts the store");
  if (static_cast<long>(a.n) * a.nnodes > kMaxWorld)
    return fail("-n " + std::to_string(a.n) + " with --nnodes " + std::to_string(a.nnodes) +
                " makes " + std::to_string(static_cast<long>(a.n) * a.nnodes) +
                " ranks, above the limit of " + std::to_string(kMaxWorld));
  if (i >= argc) return fail("no program given");
  for (; i < argc; ++i) a.command.emplace_back(argv[i]);
  p.kind = Parsed::Kind::run;
  return p;
}

}  // namespace ringrun
