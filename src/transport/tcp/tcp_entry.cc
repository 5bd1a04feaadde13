// TCP's row of the transport table: any peer (the last row, so every pair has a kind); its
// listener is a socket on the data interface, opened before the join and kept by the links for
// the communicator's life (connections are made on first use, connector.h).
#include "transport/tcp/tcp_entry.h"

#include "core/security.h"
#include "ringreduce/error.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_kind.h"

namespace ringreduce::transport::tcp {
namespace {

class TcpListener final : public KindListener {
 public:
  explicit TcpListener(PublishedListener l) : l_(std::move(l)) {}
  std::string published() const override { return l_.published; }
  PublishedListener& take() { return l_; }

 private:
  PublishedListener l_;
};

int nsocks(const core::Config& config) {
  return static_cast<int>(config.integer("RINGREDUCE_NSOCKS"));
}

void check_settings(const core::Config& config) {
  const int64_t n = config.integer("RINGREDUCE_NSOCKS");
  if (n < 1 || n > 16)
    throw InvalidArgument("RINGREDUCE_NSOCKS=" + std::to_string(n) + " is not in 1..16");
  core::security_settings(config);  // throws on a bad RINGREDUCE_ENCRYPT or its files
}

std::unique_ptr<KindListener> listen(const core::Config& config, const std::string& token,
                                     const std::string& store_host) {
  // Always: which peers are on other hosts is known only after the join. A listening socket
  // costs a descriptor and no traffic.
  return std::make_unique<TcpListener>(listen_published(config, !token.empty(), store_host));
}

bool can_link(const ConnectArgs&, const KindShare&, int) {
  return true;
}

// Per peer a socket per wire (channels x stripes) and one for the point-to-point lane.
size_t open_files(const ConnectArgs& a, size_t peers) {
  return peers * static_cast<size_t>(a.channels * nsocks(*a.config) + 1);
}

std::unique_ptr<LinkKind> connect(const ConnectArgs& a, KindShare& share,
                                  const std::vector<int>& peers, const core::Deadline&) {
  const core::Config& config = *a.config;
  TcpOptions o;
  o.rank = a.rank;
  o.size = a.size;
  o.comm_id = a.comm_id;
  o.channels = a.channels;
  // Striping cuts a message into frames on several sockets; forwards to another kind of link
  // move one frame per message, so only a communicator all of whose links are TCP stripes.
  const bool all_peers = peers.size() + 1 == static_cast<size_t>(a.size);
  o.nsocks = all_peers ? nsocks(config) : 1;
  o.socket_buffer = static_cast<int>(config.size("RINGREDUCE_SOCKET_BUFFER"));
  o.congestion = config.str("RINGREDUCE_SOCKET_CC");
  if (o.congestion == "system") o.congestion.clear();
  o.store_host = a.store_host;
  if (share.listener) {
    PublishedListener& l = static_cast<TcpListener*>(share.listener)->take();
    o.listener = std::move(l.fd);
    o.nonce = l.nonce;
  }
  o.published = share.published;
  o.peers = peers;
  o.check_failed = a.check_failed;
  // Only detected identities say that a loopback address cannot reach a peer: hosts named with
  // RINGREDUCE_HOST_ID may be emulated on one machine, where loopback is the way.
  if (!a.hosts_given && !a.hosts.empty()) {
    o.other_host.resize(static_cast<size_t>(a.size));
    for (int q = 0; q < a.size; ++q) o.other_host[static_cast<size_t>(q)] = !a.same_host(q);
  }
  return std::make_unique<TcpKind>(std::move(o), config);
}

}  // namespace

KindEntry kind_entry() {
  return {"tcp",          {"RINGREDUCE_NSOCKS", "RINGREDUCE_SOCKET_FAMILY", "RINGREDUCE_ENCRYPT"},
          check_settings, listen,
          can_link,       open_files,
          connect,        memory_mask(MemorySpace::host)};
}

}  // namespace ringreduce::transport::tcp
