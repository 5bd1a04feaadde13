// RINGREDUCE_TIMELINE's hooks in the communicator (core/timeline.h): the file is opened once the
// rank is known; every collective becomes an "op" event carrying what the call was and what the
// tuner chose for it, and every send and receive an async span. The phases inside an op are the
// algorithms' (Context::phase); the waits, the engine's.
#include <unistd.h>

#include <atomic>
#include <cstdio>

#include "comm/comm_impl.h"
#include "core/log.h"

namespace ringreduce::detail {
namespace {

// "512K", "4M", "1000": how the settings spell sizes.
std::string size_text(size_t bytes) {
  if (bytes >= (1u << 20) && bytes % (1u << 20) == 0) return std::to_string(bytes >> 20) + "M";
  if (bytes >= (1u << 10) && bytes % (1u << 10) == 0) return std::to_string(bytes >> 10) + "K";
  return std::to_string(bytes);
}

}  // namespace

void CommImpl::open_timeline() {
  const std::string pattern = config_.str("RINGREDUCE_TIMELINE");
  if (pattern.empty()) return;
  // A process may hold several communicators (splits, torch's groups): each its own file.
  static std::atomic<int> opened{0};
  timeline_ = std::make_unique<core::Timeline>(pattern, rank_, size_, opened.fetch_add(1));
  timeline_opened_us_ = core::Timeline::now_us();
  RR_LOG(info, init, rank_, "timeline: ", timeline_->path());
}

void CommImpl::trace_op(const OpState& op, double begin_us, bool failed) {
  const uint64_t seq = timeline_->op_end();
  const double end_us = core::Timeline::now_us();
  const algorithms::Args& a = op.args;
  const algorithms::CollectiveFacts& f = algorithms::facts(a.kind);
  const tuner::Plan& p = op.plan;
  std::string args = "\"seq\":" + std::to_string(seq);
  args += ",\"bytes\":" + std::to_string(a.count * dtype_size(a.dtype));
  args += ",\"count\":" + std::to_string(a.count);
  args += ",\"dtype\":\"" + std::string(dtype_name(a.dtype)) + "\"";
  if (f.has_op) args += ",\"op\":\"" + std::string(op_name(a.op)) + "\"";
  if (f.has_root) args += ",\"root\":" + std::to_string(a.root);
  args += ",\"algorithm\":\"" + std::string(p.algorithm->name) +
          " seg=" + size_text(p.segment_bytes) + " ch=" + std::to_string(p.channels) +
          (p.sliced ? " sliced" : "") + (p.stream_output ? " stream" : "") + "\"";
  if (op.async) args += ",\"async\":true";
  if (failed) args += ",\"failed\":true";
  timeline_->complete("op", f.name, begin_us, end_us, args);
}

void CommImpl::trace_p2p(const OpState& op, bool failed) {
  const transport::P2pRequest& r = op.p2p;
  std::string args = "\"peer\":" + std::to_string(r.peer) +
                     ",\"bytes\":" + std::to_string(r.bytes) + ",\"tag\":" + std::to_string(r.tag);
  if (failed) args += ",\"failed\":true";
  // Ids unique among this rank's spans: the op's address is, while it lives.
  timeline_->async_span("p2p", r.is_send ? "send" : "recv", reinterpret_cast<uintptr_t>(&op),
                        op.traced_since_us, core::Timeline::now_us(), args);
}

}  // namespace ringreduce::detail
