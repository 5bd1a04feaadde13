// libFuzzer target: the frames of an established data connection as TcpLink reads them (the
// checks in transport/tcp/frame.h, which the link runs on every header and notice before using
// it). The input is a byte stream, XORed onto a valid data frame header so that the fuzzer starts
// from readable frames; it is cut into frames as the link cuts it. Checked besides "no crash, no
// sanitizer report": a header that passes has a known type and, for a notice, a length that fits
// the link's inbox; a notice's blamed rank is -1 or a rank of the job; a data frame passes only
// with the receive's length.
#include <cstdint>
#include <cstring>

#include "transport/tcp/frame.h"

namespace {

using namespace ringreduce::transport::tcp;

#define CHECK(cond)                \
  do {                             \
    if (!(cond)) __builtin_trap(); \
  } while (0)

constexpr int kWorld = 7;
constexpr int kSender = 3;
constexpr size_t kInbox = 128 << 10;  // TcpLink's inbox: a whole notice must fit in it

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  FrameHeader templ;
  templ.payload_bytes = 16;
  templ.tag.seq = 5;
  templ.tag.count = 4;
  size_t off = 0;
  // Bounded by the input: every pass consumes a header.
  while (size - off >= sizeof(FrameHeader)) {
    uint8_t raw[sizeof(FrameHeader)];
    std::memcpy(raw, &templ, sizeof raw);
    for (size_t i = 0; i < sizeof raw; ++i) raw[i] ^= data[off + i];
    off += sizeof raw;
    FrameHeader h;
    std::memcpy(&h, raw, sizeof h);
    const std::string bad = check_frame_header(h);
    if (!bad.empty()) return 0;  // the link fails the peer here and reads no further
    CHECK(h.magic == kFrameMagic);
    if (h.type == kFrameAbort) {
      CHECK(h.payload_bytes >= 8 && h.payload_bytes <= kMaxAbortPayload &&
            h.payload_bytes <= kInbox);
      const size_t have = std::min<size_t>(h.payload_bytes, size - off);
      if (have < h.payload_bytes) return 0;  // the link waits for the rest
      const AbortNotice n = parse_abort_notice(reinterpret_cast<const char*>(data + off),
                                               h.payload_bytes, kSender, kWorld);
      CHECK(n.blamed >= -1 && n.blamed < kWorld);
      CHECK(n.reason.size() == h.payload_bytes - 8);
      return 0;  // nothing follows a notice
    }
    CHECK(h.type == kFrameData);
    // A receive of 16 bytes is posted: only a 16-byte frame may feed it.
    const bool ok = check_data_frame(h, 16).empty();
    CHECK(ok == (h.payload_bytes == 16));
    if (!ok) return 0;
    off += std::min<size_t>(16, size - off);
  }
  return 0;
}
