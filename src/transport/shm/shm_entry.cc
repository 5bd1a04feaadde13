// Shared memory's row of the transport table: between the ranks of one host, unless
// RINGREDUCE_SHM=0; its listener is a named endpoint (ShmListener) opened before the join.
#include "transport/shm/shm_entry.h"

#include <algorithm>

#include "ringreduce/error.h"
#include "transport/shm/shm_kind.h"

namespace ringreduce::transport::shm {
namespace {

bool enabled(const core::Config& config) {
  return config.str("RINGREDUCE_SHM") != "0";
}

void check_settings(const core::Config& config) {
  if (const std::string c = config.str("RINGREDUCE_SHM_CONNECT"); c != "first" && c != "mesh")
    throw InvalidArgument("RINGREDUCE_SHM_CONNECT='" + c + "' is neither first nor mesh");
}

std::unique_ptr<KindListener> listen(const core::Config& config, const std::string& token,
                                     const std::string&) {
  if (!enabled(config)) return nullptr;
  return std::make_unique<ShmListener>(!token.empty(),
                                       config.str("RINGREDUCE_SHM_CONNECT") != "mesh");
}

bool can_link(const ConnectArgs& a, const KindShare&, int peer) {
  return a.same_host(peer) && enabled(*a.config);
}

// Per peer a pidfd, a doorbell and its segment until mapped; on the host's first rank, or in a
// mesh, a socket or two more: 4 is the bound.
size_t open_files(const ConnectArgs&, size_t peers) {
  return 4 * peers;
}

std::unique_ptr<LinkKind> connect(const ConnectArgs& a, KindShare& share,
                                  const std::vector<int>& peers, const core::Deadline& deadline) {
  ShmOptions o;
  o.rank = a.rank;
  o.size = a.size;
  o.comm_id = a.comm_id;
  o.channels = a.channels;
  o.oversubscribed = a.engine.oversubscribed;
  o.token = a.token;
  o.local_ranks = peers;
  o.local_ranks.push_back(a.rank);
  std::sort(o.local_ranks.begin(), o.local_ranks.end());
  o.listener = static_cast<const ShmListener*>(share.listener);
  o.check_failed = a.check_failed;
  o.published = share.published;
  return std::make_unique<ShmKind>(o, deadline);
}

}  // namespace

KindEntry kind_entry() {
  return {
      "shm",
      {"RINGREDUCE_SHM"},
      check_settings,
      listen,
      can_link,
      open_files,
      connect,
      static_cast<uint8_t>(memory_mask(MemorySpace::host) | memory_mask(MemorySpace::registered))};
}

}  // namespace ringreduce::transport::shm
