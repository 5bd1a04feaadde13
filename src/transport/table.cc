#include "transport/table.h"

#include <algorithm>

#include "ringreduce/error.h"
#include "transport/shm/shm_kind.h"
#include "transport/tcp/tcp_kind.h"

namespace ringreduce::transport {
namespace {

// Each rank's part of what it published for one kind ("shm=...;tcp=..."), by rank; "" if none.
std::vector<std::string> published_parts(const ConnectArgs& a, const std::string& prefix) {
  std::vector<std::string> parts;
  for (const std::string& p : a.published) parts.push_back(published_part(p, prefix));
  return parts;
}

bool same_host(const ConnectArgs& a, int peer) {
  return !a.hosts.empty() &&
         a.hosts[static_cast<size_t>(peer)] == a.hosts[static_cast<size_t>(a.rank)];
}

bool shm_can_link(const ConnectArgs& a, int peer) {
  return same_host(a, peer) && a.config->str("RINGREDUCE_SHM") != "0";
}

std::unique_ptr<LinkKind> shm_connect(const ConnectArgs& a, const std::vector<int>& peers,
                                      const core::Deadline& deadline) {
  shm::ShmOptions o;
  o.rank = a.rank;
  o.size = a.size;
  o.comm_id = a.comm_id;
  o.channels = a.channels;
  o.oversubscribed = a.engine.oversubscribed;
  o.token = a.token;
  o.local_ranks = peers;
  o.local_ranks.push_back(a.rank);
  std::sort(o.local_ranks.begin(), o.local_ranks.end());
  o.listener = a.listeners ? a.listeners->shm.get() : nullptr;
  o.check_failed = a.check_failed;
  o.published = published_parts(a, "shm=");
  return std::make_unique<shm::ShmKind>(o, deadline);
}

bool tcp_can_link(const ConnectArgs&, int) {
  return true;
}

std::unique_ptr<LinkKind> tcp_connect(const ConnectArgs& a, const std::vector<int>& peers,
                                      const core::Deadline&) {
  const core::Config& config = *a.config;
  tcp::TcpOptions o;
  o.rank = a.rank;
  o.size = a.size;
  o.comm_id = a.comm_id;
  o.channels = a.channels;
  // Striping cuts a message into frames on several sockets; forwards to another kind of link
  // move one frame per message, so only a communicator all of whose links are TCP stripes.
  const bool all_peers = peers.size() + 1 == static_cast<size_t>(a.size);
  o.nsocks = all_peers ? a.nsocks : 1;
  o.socket_buffer = static_cast<int>(config.size("RINGREDUCE_SOCKET_BUFFER"));
  o.congestion = config.str("RINGREDUCE_SOCKET_CC");
  if (o.congestion == "system") o.congestion.clear();
  o.store_host = a.store_host;
  if (a.listeners) {
    o.listener = std::move(a.listeners->tcp);
    o.nonce = a.listeners->tcp_nonce;
  }
  o.published = published_parts(a, "tcp=");
  o.peers = peers;
  o.check_failed = a.check_failed;
  // Only detected identities say that a loopback address cannot reach a peer: hosts named with
  // RINGREDUCE_HOST_ID may be emulated on one machine, where loopback is the way.
  if (!a.hosts_given && !a.hosts.empty()) {
    o.other_host.resize(static_cast<size_t>(a.size));
    for (int q = 0; q < a.size; ++q) o.other_host[static_cast<size_t>(q)] = !same_host(a, q);
  }
  return std::make_unique<tcp::TcpKind>(std::move(o), config);
}

}  // namespace

std::string published_part(const std::string& published, const std::string& prefix) {
  size_t at = 0;
  // At the start of the record or after a ';': "tcp=" must not match inside another field.
  while ((at = published.find(prefix, at)) != std::string::npos && at > 0 &&
         published[at - 1] != ';')
    ++at;
  if (at == std::string::npos) return "";
  return published.substr(at + prefix.size(), published.find(';', at) - at - prefix.size());
}

Listeners::Listeners(const core::Config& config, const std::string& token,
                     const std::string& store_host) {
  if (config.str("RINGREDUCE_SHM") != "0")
    shm = std::make_unique<shm::ShmListener>(!token.empty(),
                                             config.str("RINGREDUCE_SHM_CONNECT") != "mesh");
  // Always: which peers are on other hosts is known only after the join. A listening socket
  // costs a descriptor and no traffic.
  tcp::SockAddr bound;
  tcp = tcp::listen_on(tcp::choose_data_address(config, store_host), &bound);
  const std::string addr = bound.str();
  if (!token.empty()) tcp_nonce = core::auth::random_nonce();
  tcp_published = addr.substr(0, addr.rfind(':')) + "|" + std::to_string(bound.port()) + "|" +
                  (token.empty() ? "-" : core::auth::nonce_to_hex(tcp_nonce));
  tcp::SockAddr ctl_bound;
  ctl = tcp::listen_on(tcp::choose_data_address(config, store_host), &ctl_bound);
  const std::string ctl_addr = ctl_bound.str();
  if (!token.empty()) ctl_nonce = core::auth::random_nonce();
  ctl_published = ctl_addr.substr(0, ctl_addr.rfind(':')) + "|" + std::to_string(ctl_bound.port()) +
                  "|" + (token.empty() ? "-" : core::auth::nonce_to_hex(ctl_nonce));
}

std::string Listeners::published() const {
  return (shm ? "shm=" + shm->published() + ";" : "") + "tcp=" + tcp_published +
         ";ctl=" + ctl_published;
}

const std::vector<KindEntry>& kind_table() {
  static const std::vector<KindEntry> kTable = {
      {"shm", shm_can_link, shm_connect},
      {"tcp", tcp_can_link, tcp_connect},
  };
  return kTable;
}

std::unique_ptr<Engine> connect(const ConnectArgs& args, const core::Deadline& deadline) {
  const auto& table = kind_table();
  std::vector<std::vector<int>> peers(table.size());
  for (int q = 0; q < args.size; ++q) {
    if (q == args.rank) continue;
    size_t k = 0;
    while (k < table.size() && !table[k].can_link(args, q)) ++k;
    if (k == table.size())
      throw Error("rank " + std::to_string(args.rank) + ": no kind of link reaches rank " +
                  std::to_string(q));
    peers[k].push_back(q);
  }
  // Alone, the last kind stands in, so that its settings are still checked (a bad interface
  // should fail now, not when the job grows).
  if (args.size == 1) peers.back().clear();
  std::vector<std::unique_ptr<LinkKind>> kinds;
  std::vector<int> route(static_cast<size_t>(args.size), -1);
  for (size_t k = 0; k < table.size(); ++k) {
    if (peers[k].empty() && !(args.size == 1 && k + 1 == table.size())) continue;
    for (int q : peers[k]) route[static_cast<size_t>(q)] = static_cast<int>(kinds.size());
    kinds.push_back(table[k].connect(args, peers[k], deadline));
  }
  return std::make_unique<Engine>(args.engine, std::move(kinds), std::move(route));
}

}  // namespace ringreduce::transport
