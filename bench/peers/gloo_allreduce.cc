// Peer benchmark: Gloo's AllreduceRingChunked over Gloo's TCP transport on 127.0.0.1 (or on
// $PEER_HOSTNAME).
//
// Launch either
//   gloo_allreduce -N 4 [flags]                 fork-launches 4 ranks itself (store in a fresh
//                                               temp dir unless -s DIR is given), or
//   mpirun -np 4 gloo_allreduce -s DIR [flags]  rank/size from OMPI_COMM_WORLD_RANK/SIZE (or
//                                               RANK/WORLD_SIZE); mpirun only starts processes,
//                                               Gloo does all communication over TCP. DIR must be
//                                               an empty directory shared by the ranks.
// Rendezvous goes through gloo::rendezvous::FileStore. Prints nccl-tests style rows on rank 0.
#include <gloo/allreduce_ring.h>
#include <gloo/allreduce_ring_chunked.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/file_store.h>
#include <gloo/transport/tcp/device.h>

#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "perf_common.h"

namespace {

using Ctx = std::shared_ptr<gloo::Context>;

// Small helper collectives (not timed): one double, max or sum over ranks. Also a barrier.
double allreduce_scalar(const Ctx& ctx, double v, bool max) {
  std::vector<double*> ptrs{&v};
  gloo::AllreduceRing<double> ar(
      ctx, ptrs, 1,
      max ? gloo::ReductionFunction<double>::max : gloo::ReductionFunction<double>::sum);
  ar.run();
  return v;
}

int run_rank(int rank, int size, const peers::Options& o) {
  gloo::transport::tcp::attr attr;
  // PEER_HOSTNAME: the address to listen on across hosts (bench/drivers/cluster_compare.sh);
  // loopback else.
  const char* host = std::getenv("PEER_HOSTNAME");
  attr.hostname = host && *host ? host : "127.0.0.1";
  attr.ai_family = AF_INET;
  auto dev = gloo::transport::tcp::CreateDevice(attr);

  gloo::rendezvous::FileStore store(o.store);
  auto ctx = std::make_shared<gloo::rendezvous::Context>(rank, size);
  ctx->setTimeout(std::chrono::seconds(600));
  ctx->connectFullMesh(store, dev);
  Ctx c = ctx;

  if (rank == 0) peers::print_header("Gloo AllreduceRingChunked (gloo::transport::tcp)", size, o);

  const auto all_sizes = peers::sizes(o);
  std::vector<float> buf(o.max_bytes / sizeof(float));
  if (o.prime && !all_sizes.empty()) {
    // Gloo's tcp::Pair::send() sets SO_SNDBUF (which also turns off the kernel's autotuning) to
    // the size of the first message it sends on that pair, and grows it only when a later message
    // is bigger than the current buffer. After a small first message a later message of between
    // half and all of the buffer cannot be queued twice, and each chunk then waits ~40 ms for
    // an ACK (seen here at 16 KiB and 64 KiB with N=2). One run at the largest size first - what
    // nccl-tests does anyway - sizes the buffers once for the whole sweep.
    std::vector<float*> ptrs{buf.data()};
    const int count = static_cast<int>(all_sizes.back() / sizeof(float));
    gloo::AllreduceRingChunked<float>(c, ptrs, count).run();
  }
  for (std::size_t bytes : all_sizes) {
    const std::size_t count = bytes / sizeof(float);
    std::vector<float*> ptrs{buf.data()};
    // Setup (buffer registration, inbox allocation) once per size, outside the timing, as
    // Gloo's own benchmark does.
    gloo::AllreduceRingChunked<float> algo(c, ptrs, static_cast<int>(count));

    // First run: correctness check (and the first warmup run). In-place: the buffer then keeps
    // growing by a factor N per run (non-negative, so it saturates at +inf, never NaN).
    peers::fill_input(buf.data(), count, rank);
    allreduce_scalar(c, 0, true);
    double t0 = peers::now_s();
    algo.run();
    double first = peers::now_s() - t0;
    long wrong = o.check ? peers::count_wrong(buf.data(), count, size) : 0;

    auto t = peers::time_runs(
        o, first, [&] { algo.run(); }, [&](double x) { return allreduce_scalar(c, x, true); });
    long total_wrong = static_cast<long>(allreduce_scalar(c, static_cast<double>(wrong), false));
    if (rank == 0) peers::print_row(bytes, size, t.per_iter_s, total_wrong, t.iters);
  }
  return 0;
}

int env_int(const char* a, const char* b, int dflt) {
  if (const char* v = std::getenv(a)) return std::atoi(v);
  if (const char* v = std::getenv(b)) return std::atoi(v);
  return dflt;
}

int guarded(int rank, int size, const peers::Options& o) {
  try {
    return run_rank(rank, size, o);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gloo_allreduce rank %d: %s\n", rank, e.what());
    return 1;
  }
}

}  // namespace

// Pins the calling process to the r-th core of its affinity mask when PEER_BIND=core.
void bind_to_core(int r) {
  const char* b = std::getenv("PEER_BIND");
  if (b == nullptr || std::string(b) != "core") return;
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) != 0) return;
  std::vector<int> cores;
  for (int c = 0; c < CPU_SETSIZE; ++c)
    if (CPU_ISSET(c, &set)) cores.push_back(c);
  if (cores.empty()) return;
  CPU_ZERO(&set);
  CPU_SET(cores[static_cast<std::size_t>(r) % cores.size()], &set);
  sched_setaffinity(0, sizeof(set), &set);
}

int main(int argc, char** argv) {
  peers::Options o;
  o.max_bytes = std::size_t{32} << 20;
  if (!peers::parse_options(argc, argv, o, /*with_launch=*/true)) return 2;

  if (o.nranks <= 0) {  // launched by someone else (mpirun, ...)
    int rank = env_int("OMPI_COMM_WORLD_RANK", "RANK", -1);
    int size = env_int("OMPI_COMM_WORLD_SIZE", "WORLD_SIZE", -1);
    if (rank < 0 || size < 1 || o.store.empty()) {
      std::fprintf(stderr,
                   "gloo_allreduce: give -N NRANKS to fork-launch, or run under mpirun (or with "
                   "RANK/WORLD_SIZE set) with -s STORE_DIR\n");
      return 2;
    }
    return guarded(rank, size, o);
  }

  // Fork launcher.
  bool own_store = o.store.empty();
  if (own_store) {
    char tmpl[] = "/tmp/gloo_store.XXXXXX";
    if (!mkdtemp(tmpl)) {
      std::perror("mkdtemp");
      return 1;
    }
    o.store = tmpl;
  }
  std::fflush(stdout);
  std::vector<pid_t> kids;
  // PEER_BIND=core pins rank r to the r-th usable core, as ringrun and mpirun do by default, so
  // that every library in a comparison runs with the same placement.
  for (int r = 0; r < o.nranks; ++r) {
    pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 1;
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher
      bind_to_core(r);
      int code = guarded(r, o.nranks, o) == 0 ? 0 : 1;
      std::fflush(stdout);
      std::fflush(stderr);
      std::_Exit(code);
    }
    kids.push_back(pid);
  }
  int rc = 0;
  for (std::size_t left = kids.size(); left > 0; --left) {
    int status = 0;
    pid_t pid = wait(&status);
    if (pid < 0) break;
    for (pid_t& k : kids)
      if (k == pid) k = 0;  // reaped
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      if (rc == 0) std::fprintf(stderr, "gloo_allreduce: a rank failed; stopping the others\n");
      rc = 1;
      for (pid_t k : kids)
        if (k > 0) kill(k, SIGTERM);
    }
  }
  if (own_store) {
    std::error_code ec;
    std::filesystem::remove_all(o.store, ec);
  }
  return rc;
}
