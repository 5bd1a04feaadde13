#include "transport/tcp/frame.h"

#include <cstring>

namespace ringreduce::transport::tcp {

std::string check_frame_header(const FrameHeader& h) {
  if (h.magic != kFrameMagic) return "sent a corrupt frame (bad magic)";
  if (h.type == kFrameAbort) {
    if (h.payload_bytes < 8 || h.payload_bytes > kMaxAbortPayload)
      return "sent a corrupt abort notice";
    return "";
  }
  if (h.type != kFrameData) return "sent a frame of unknown type " + std::to_string(h.type);
  return "";
}

std::string check_data_frame(const FrameHeader& h, size_t expected_bytes) {
  if (h.payload_bytes != expected_bytes)
    return "sent " + std::to_string(h.payload_bytes) + " bytes where this rank expected " +
           std::to_string(expected_bytes);
  return "";
}

AbortNotice parse_abort_notice(const char* payload, size_t bytes, int sender, int world_size) {
  AbortNotice n;
  if (bytes < 8) {
    n.blamed = sender;
    return n;
  }
  std::memcpy(&n.code, payload, 4);
  std::memcpy(&n.blamed, payload + 4, 4);
  if (n.blamed < -1 || n.blamed >= world_size) n.blamed = sender;
  n.reason.assign(payload + 8, bytes - 8);
  return n;
}

}  // namespace ringreduce::transport::tcp
