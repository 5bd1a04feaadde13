// Device links' row of the transport table: between the ranks of one host that use a GPU, for
// device memory only (RINGREDUCE_DEVICE_LINKS: auto links the ranks whose process uses CUDA when
// the communicator is made; 1 insists; 0 never). Its listener is a control block and a doorbell,
// reached by the peers through pidfd_getfd.
#include "transport/device/device_entry.h"

#include <fstream>

#include "core/log.h"
#include "core/pidfd.h"
#include "reduce/device_runtime.h"
#include "ringreduce/error.h"
#include "transport/device/device_kind.h"

namespace ringreduce::transport::device {
namespace {

// Yama's ptrace scope (0 where Yama is absent).
int ptrace_scope() {
  std::ifstream f("/proc/sys/kernel/yama/ptrace_scope");
  int v = 0;
  return f >> v ? v : 0;
}

void check_settings(const core::Config& config) {
  if (const std::string v = config.str("RINGREDUCE_DEVICE_LINKS");
      v != "auto" && v != "0" && v != "1")
    throw InvalidArgument("RINGREDUCE_DEVICE_LINKS='" + v + "' is none of auto, 0, 1");
  const uint64_t slot = config.size("RINGREDUCE_DEVICE_SLOT_BYTES");
  if (slot < 4096 || slot % 64 != 0 || slot > (uint64_t{1} << 30))
    throw InvalidArgument("RINGREDUCE_DEVICE_SLOT_BYTES=" + std::to_string(slot) +
                          " is not a multiple of 64 from 4096 to 1G");
}

std::unique_ptr<KindListener> listen(const core::Config& config, const std::string&,
                                     const std::string&) {
  const std::string v = config.str("RINGREDUCE_DEVICE_LINKS");
  if (v == "0") return nullptr;
  // Only a process that uses a GPU already: asking would otherwise initialise CUDA (a context,
  // hundreds of MB) in every CPU-only job on a GPU machine.
  if (!reduce::device_runtime().in_use()) {
    if (v == "1")
      throw InvalidArgument(
          "RINGREDUCE_DEVICE_LINKS=1, but this process uses no GPU (no CUDA context when the "
          "communicator was made)");
    return nullptr;
  }
  // The peers take this rank's doorbell and inboxes with pidfd_getfd, which Yama's ptrace_scope
  // >= 1 (Ubuntu's default) refuses between sibling processes: then auto stays off (staging
  // serves), and 1 says why rather than failing at the first connection.
  if (const int scope = ptrace_scope(); scope > 0) {
    if (v == "1")
      throw InvalidArgument("RINGREDUCE_DEVICE_LINKS=1, but kernel.yama.ptrace_scope is " +
                            std::to_string(scope) +
                            " here, which keeps the host's ranks from taking each other's "
                            "descriptors (pidfd_getfd): set it to 0, or use 0/auto to stage");
    RR_LOG(info, init, -1, "device links off: kernel.yama.ptrace_scope is ", scope,
           " (the ranks could not take each other's descriptors); device buffers are staged");
    return nullptr;
  }
  return std::make_unique<DeviceListener>();
}

// Same host, both published (both use a GPU), one pid namespace (the pids must mean the same).
bool can_link(const ConnectArgs& a, const KindShare& share, int peer) {
  if (!a.same_host(peer) || a.size > kMaxRanks || !share.listener) return false;
  const std::string& mine = share.published[static_cast<size_t>(a.rank)];
  const std::string& theirs = share.published[static_cast<size_t>(peer)];
  if (mine.empty() || theirs.empty()) return false;
  const std::string ns = mine.substr(mine.rfind('|') + 1);
  return ns != "-" && ns == theirs.substr(theirs.rfind('|') + 1);
}

// Per peer a pidfd, its control block and doorbell, and an inbox's descriptor.
size_t open_files(const ConnectArgs&, size_t peers) {
  return 4 * peers;
}

std::unique_ptr<LinkKind> connect(const ConnectArgs& a, KindShare& share,
                                  const std::vector<int>& peers, const core::Deadline& deadline) {
  DeviceOptions o;
  o.rank = a.rank;
  o.size = a.size;
  o.slot_bytes = a.config->size("RINGREDUCE_DEVICE_SLOT_BYTES");
  o.peers = peers;
  o.listener = static_cast<DeviceListener*>(share.listener);
  o.published = share.published;
  o.check_failed = a.check_failed;
  return std::make_unique<DeviceKind>(o, deadline);
}

}  // namespace

KindEntry kind_entry() {
  return {"device",       {"RINGREDUCE_DEVICE_LINKS", "RINGREDUCE_DEVICE_SLOT_BYTES"},
          check_settings, listen,
          can_link,       open_files,
          connect,        memory_mask(MemorySpace::device)};
}

}  // namespace ringreduce::transport::device
