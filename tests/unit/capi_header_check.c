/* Compiled as C: the C ABI header must be valid C, not just C++. */
#include "ringreduce/ringreduce.h"

int rr_capi_header_check(void) {
  rr_comm_t* comm = 0;
  rr_result_t r = RR_OK;
  (void)comm;
  return (int)r + (int)RR_F32 + (int)RR_AVG;
}
