// Peer benchmark: MPI_Allreduce(MPI_FLOAT, MPI_SUM), out of place by default, in place
// (MPI_IN_PLACE) with -i 1. Built twice from this source: mpi_allreduce against OpenMPI (or
// whatever CMake's FindMPI finds) and mpich_allreduce against MPICH (bench/peers/CMakeLists.txt).
// The transport is the launcher's choice, not this program's. Forced onto TCP loopback
// (bench/drivers/compare.sh tcp):
//   mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1
//     --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
//     -np N mpi_allreduce -b 4 -e 256M -f 4
// Over shared memory, the libraries' defaults (bench/drivers/compare.sh shm):
//   mpirun --allow-run-as-root --oversubscribe --bind-to core:overload-allowed
//     -np N mpi_allreduce -b 4 -e 256M -f 4 -i 1
//   mpiexec.mpich -bind-to core -n N mpich_allreduce -b 4 -e 256M -f 4 -i 1
// Flags: those of perf_common.h, plus -i 0|1 (in place; default 0). Prints nccl-tests style
// rows on rank 0; the header says which variant ran: "MPI_Allreduce (in-place)" or
// "MPI_Allreduce (out-of-place)".
#include <mpi.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "perf_common.h"

namespace {

double agree(double v, MPI_Op op) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
  return v;
}

// Takes this program's own flag (-i 0|1) out of argv, leaving perf_common.h's flags. Returns
// false on a bad value.
bool take_in_place_flag(int& argc, char** argv, bool& in_place) {
  int out = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "-i") == 0) {
      if (i + 1 >= argc ||
          (std::strcmp(argv[i + 1], "0") != 0 && std::strcmp(argv[i + 1], "1") != 0)) {
        std::fprintf(stderr, "%s: -i takes 0 (out of place) or 1 (in place)\n", argv[0]);
        return false;
      }
      in_place = argv[++i][0] == '1';
      continue;
    }
    argv[out++] = argv[i];
  }
  argc = out;
  argv[argc] = nullptr;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  peers::Options o;
  bool in_place = false;
  if (!take_in_place_flag(argc, argv, in_place) ||
      !peers::parse_options(argc, argv, o, /*with_launch=*/false)) {
    if (rank == 0) std::fprintf(stderr, "  (and -i 0|1: MPI_IN_PLACE, default 0)\n");
    MPI_Finalize();
    return 2;
  }
  if (rank == 0) {
    int len = 0;
    char lib[MPI_MAX_LIBRARY_VERSION_STRING];
    MPI_Get_library_version(lib, &len);
    for (char* p = lib; *p; ++p)
      if (*p == '\n') *p = ' ';
    std::printf("# %s\n", lib);
    // print_header's "TCP loopback" holds only under bench/drivers/compare.sh tcp's mpirun flags.
    std::printf("# transport: whatever the launcher selected (see its command line)\n");
    peers::print_header(in_place ? "MPI_Allreduce (in-place)" : "MPI_Allreduce (out-of-place)",
                        size, o);
  }

  const std::size_t max_count = o.max_bytes / sizeof(float);
  std::vector<float> send(in_place ? 0 : max_count);  // unused in place
  std::vector<float> recv(max_count, 0.0f);
  const auto all_sizes = peers::sizes(o);
  // In place, each run reduces the previous run's result: values grow by a factor of N per run
  // (to inf after some hundred runs; the time does not depend on them), as in nccl-tests. Only
  // the first run of each size, from fresh inputs, is checked.
  float* const sendbuf = send.data();
  float* const recvbuf = recv.data();
  auto allreduce = [&](int count) {
    MPI_Allreduce(in_place ? MPI_IN_PLACE : sendbuf, recvbuf, count, MPI_FLOAT, MPI_SUM,
                  MPI_COMM_WORLD);
  };
  if (o.prime && !all_sizes.empty())  // one untimed run at the largest size, as nccl-tests does
    allreduce(static_cast<int>(all_sizes.back() / sizeof(float)));
  for (std::size_t bytes : all_sizes) {
    const int count = static_cast<int>(bytes / sizeof(float));
    peers::fill_input(in_place ? recvbuf : sendbuf, count, rank);

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    allreduce(count);
    double first = MPI_Wtime() - t0;
    long wrong = o.check ? peers::count_wrong(recvbuf, count, size) : 0;

    auto t = peers::time_runs(
        o, first, [&] { allreduce(count); }, [](double x) { return agree(x, MPI_MAX); });
    long total_wrong = static_cast<long>(agree(static_cast<double>(wrong), MPI_SUM));
    if (rank == 0) peers::print_row(bytes, size, t.per_iter_s, total_wrong, t.iters);
  }
  MPI_Finalize();
  return 0;
}
