// Peer benchmark: MPI_Allreduce(MPI_FLOAT, MPI_SUM), out-of-place. Meant to be forced onto TCP
// loopback:
//   mpirun --allow-run-as-root --oversubscribe --bind-to none --mca pml ob1
//     --mca btl tcp,self --mca btl_tcp_if_include lo --mca oob_tcp_if_include lo
//     -np N mpi_allreduce -b 4 -e 256M -f 4
// Prints nccl-tests style rows on rank 0.
#include <mpi.h>

#include <cstdio>
#include <vector>

#include "perf_common.h"

namespace {

double agree(double v, MPI_Op op) {
  MPI_Allreduce(MPI_IN_PLACE, &v, 1, MPI_DOUBLE, op, MPI_COMM_WORLD);
  return v;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);

  peers::Options o;
  if (!peers::parse_options(argc, argv, o, /*with_launch=*/false)) {
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
    peers::print_header("MPI_Allreduce (out-of-place)", size, o);
  }

  const std::size_t max_count = o.max_bytes / sizeof(float);
  std::vector<float> send(max_count), recv(max_count, 0.0f);
  const auto all_sizes = peers::sizes(o);
  if (o.prime && !all_sizes.empty())  // one untimed run at the largest size, as nccl-tests does
    MPI_Allreduce(send.data(), recv.data(), static_cast<int>(all_sizes.back() / sizeof(float)),
                  MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  for (std::size_t bytes : all_sizes) {
    const int count = static_cast<int>(bytes / sizeof(float));
    peers::fill_input(send.data(), count, rank);

    MPI_Barrier(MPI_COMM_WORLD);
    double t0 = MPI_Wtime();
    MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double first = MPI_Wtime() - t0;
    long wrong = o.check ? peers::count_wrong(recv.data(), count, size) : 0;

    auto t = peers::time_runs(
        o, first,
        [&] { MPI_Allreduce(send.data(), recv.data(), count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); },
        [](double x) { return agree(x, MPI_MAX); });
    long total_wrong = static_cast<long>(agree(static_cast<double>(wrong), MPI_SUM));
    if (rank == 0) peers::print_row(bytes, size, t.per_iter_s, total_wrong, t.iters);
  }
  MPI_Finalize();
  return 0;
}
