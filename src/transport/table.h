// The transport table, in the manner of NCCL's: the kinds of link in order of preference, each
// saying whether it can link this rank with a given peer. Every peer goes to the first kind that
// can link it (shared memory for a peer on this host, unless RINGREDUCE_SHM=0; TCP for any peer);
// each kind then connects to the peers it was given, and one Engine drives them all. Every rank
// applies the same table to the same host identities, so both ends of a pair pick the same kind.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/deadline.h"
#include "ringreduce/store.h"
#include "transport/engine.h"
#include "transport/shm/shm_kind.h"

namespace ringreduce::transport {

// The listeners a rank opens before it joins, so that what peers need to reach it travels in its
// join record ("shm=<name>|<nonce>;tcp=<host>|<port>|<nonce>;ctl=<host>|<port>|<nonce>") instead of
// through a store key per kind and peer.
struct Listeners {
  // RINGREDUCE_SHM decides whether there is a shared-memory one; the token, whether they carry
  // nonces; the store's host, which interface TCP listens on (tcp/socket.h).
  Listeners(const core::Config& config, const std::string& token, const std::string& store_host);
  std::string published() const;
  std::unique_ptr<shm::ShmListener> shm;
  // The TCP listener (taken by the TCP kind, which listens for the communicator's life), its
  // address and its nonce.
  core::Fd tcp;
  std::string tcp_published;
  core::auth::Nonce tcp_nonce{};
  // The control plane's listener (control.h), on the same interface: what the survivors of a
  // failure talk over once the data links are gone.
  core::Fd ctl;
  std::string ctl_published;
  core::auth::Nonce ctl_nonce{};
};

// Rank q's part of what it published (Listeners::published()) for `prefix` ("shm=", "tcp=",
// "ctl="); "" if none.
std::string published_part(const std::string& published, const std::string& prefix);

// Everything a kind may need to connect: who we are, who the peers are, the settings.
struct ConnectArgs {
  int rank = 0;
  int size = 1;
  uint64_t comm_id = 0;
  int channels = 1;
  int nsocks = 1;  // RINGREDUCE_NSOCKS
  // Every rank's host identity (topology.h); empty with one rank.
  std::vector<std::string> hosts;
  // The identities were given (RINGREDUCE_HOST_ID) rather than detected: hosts may be emulated on
  // one machine, where loopback reaches every "host".
  bool hosts_given = false;
  std::string token;
  std::string store_host;  // where the data interface is chosen from
  const core::Config* config = nullptr;
  EngineOptions engine;
  // What the ranks published when they joined (Listeners::published(), by rank), and this
  // rank's listeners.
  std::vector<std::string> published;
  Listeners* listeners = nullptr;
  // Throws if the job has failed elsewhere (the store's failure mark): the kinds call it between
  // the slices of their start-up waits (at most every ~100 ms), so that a rank whose peer died
  // at start-up fails with the cause instead of waiting out the timeout. Empty: not checked.
  std::function<void()> check_failed;
};

struct KindEntry {
  const char* name;
  // Whether this kind can link args.rank with `peer`.
  bool (*can_link)(const ConnectArgs& args, int peer);
  // Connects to `peers` (each one it can link; empty only with one rank). Bounded by deadline.
  std::unique_ptr<LinkKind> (*connect)(const ConnectArgs& args, const std::vector<int>& peers,
                                       const core::Deadline& deadline);
};

// The table, fastest kind first.
const std::vector<KindEntry>& kind_table();

// Routes every peer to its kind, connects each kind used, and returns the engine over them.
std::unique_ptr<Engine> connect(const ConnectArgs& args, const core::Deadline& deadline);

}  // namespace ringreduce::transport
