/* A user's C program over the C ABI: allreduce of (rank + 1), checked. Prints "c consumer ok". */
#include <stdio.h>
#include <string.h>

#include "ringreduce/ringreduce.h"

int main(void) {
  rr_comm_t* comm = NULL;
  if (strcmp(rr_version(), RINGREDUCE_VERSION_STRING) != 0) {
    fprintf(stderr, "header %s, library %s\n", RINGREDUCE_VERSION_STRING, rr_version());
    return 1;
  }
  if (rr_comm_init_from_env(&comm) != RR_OK) {
    fprintf(stderr, "init: %s\n", rr_last_error(NULL));
    return 1;
  }
  int rank = rr_comm_rank(comm), size = rr_comm_size(comm);
  double v[64];
  for (size_t i = 0; i < 64; ++i) v[i] = rank + 1;
  if (rr_allreduce(comm, v, v, 64, RR_F64, RR_SUM) != RR_OK) {
    fprintf(stderr, "allreduce: %s\n", rr_last_error(comm));
    return 1;
  }
  for (size_t i = 0; i < 64; ++i) {
    if (v[i] != size * (size + 1) / 2) {
      fprintf(stderr, "rank %d: got %g\n", rank, v[i]);
      return 1;
    }
  }
  printf("c consumer ok: rank %d of %d\n", rank, size);
  rr_comm_destroy(comm);
  return 0;
}
