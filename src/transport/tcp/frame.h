// The checks every frame header and abort notice read from a data connection goes through before
// any of it is used, kept apart from TcpLink so that a fuzzer can drive them (tests/fuzz) with
// exactly the code the link runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/tcp/wire.h"

namespace ringreduce::transport::tcp {

// A header as it arrives: "" when its magic and type are known and an abort notice's length is
// within kMaxAbortPayload (so the whole notice fits in the inbox); else why not.
std::string check_frame_header(const FrameHeader& h);

// A data frame about to feed a posted receive: "" when its length is the receive's; else why
// not. (The tag is compared by the caller, which turns a difference into a MismatchError.)
std::string check_data_frame(const FrameHeader& h, size_t expected_bytes);

// An abort notice's payload (int32 code, int32 blamed rank, reason text), checked header given.
// The blamed rank is only believed when it names a rank of the job; else the sender is blamed.
struct AbortNotice {
  int32_t code = 0;
  int32_t blamed = -1;
  std::string reason;
};
AbortNotice parse_abort_notice(const char* payload, size_t bytes, int sender, int world_size);

}  // namespace ringreduce::transport::tcp
