// The shape of a row of the transport table (table.h): what every kind of link brings of its own
// (its name, its settings, what it listens on before the join, which peers it can link, what its
// links cost in descriptors, how it connects), so that the table and the communicator above it
// name no kind's internals. A kind lives in its own folder (shm/, tcp/) and declares its row
// there; adding one is a folder and a line in table.cc, as in NCCL's transport table.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/config.h"
#include "core/deadline.h"
#include "transport/engine.h"
#include "transport/kind.h"

namespace ringreduce::transport {

// Everything a kind may need to connect: who we are, who the peers are, the settings.
struct ConnectArgs {
  int rank = 0;
  int size = 1;
  uint64_t comm_id = 0;
  int channels = 1;
  // Every rank's host identity (topology.h); empty with one rank.
  std::vector<std::string> hosts;
  // The identities were given (RINGREDUCE_HOST_ID) rather than detected: hosts may be emulated on
  // one machine, where loopback reaches every "host".
  bool hosts_given = false;
  std::string token;
  std::string store_host;  // where the data interface is chosen from
  const core::Config* config = nullptr;
  EngineOptions engine;
  // Throws if the job has failed elsewhere (the store's failure mark): the kinds call it between
  // the slices of their start-up waits (at most every ~100 ms), so that a rank whose peer died
  // at start-up fails with the cause instead of waiting out the timeout. Empty: not checked.
  std::function<void()> check_failed;

  bool same_host(int peer) const {
    return !hosts.empty() && hosts[static_cast<size_t>(peer)] == hosts[static_cast<size_t>(rank)];
  }
};

// One kind's share of the join: the listener this rank opened for it (null if the kind opened
// none here) and each rank's part of the join record for it ("" where a rank published none).
struct KindShare {
  KindListener* listener = nullptr;
  std::vector<std::string> published;
};

struct KindEntry {
  // The kind's name: the tuner's and the tuning file's, and its field in the join record.
  const char* name;
  // Its settings whose values every rank must share (the join compares them with the
  // communicator's own: a difference would otherwise show as a hang at connection).
  std::vector<const char*> agreed_settings;
  // Checks this rank's values of the kind's settings before anything waits on the others;
  // throws InvalidArgument naming the setting.
  void (*check_settings)(const core::Config& config);
  // Opens what peers reach this rank through, before the join; null where the settings turn the
  // kind off. token: RINGREDUCE_TOKEN (the listener then carries a nonce); store_host: where the
  // data interface is chosen from.
  std::unique_ptr<KindListener> (*listen)(const core::Config& config, const std::string& token,
                                          const std::string& store_host);
  // Whether this kind can link args.rank with `peer` (given the peer's part of the record).
  bool (*can_link)(const ConnectArgs& args, const KindShare& share, int peer);
  // About how many descriptors its links to `peers` peers will hold (the open-files check).
  size_t (*open_files)(const ConnectArgs& args, size_t peers);
  // Connects to `peers` (each one it can link; empty only with one rank). Bounded by deadline.
  std::unique_ptr<LinkKind> (*connect)(const ConnectArgs& args, KindShare& share,
                                       const std::vector<int>& peers,
                                       const core::Deadline& deadline);
  // The memory its links serve (MemorySpace mask). A peer is routed once per space: for host
  // memory to the first row serving host memory that links it, for device memory to the first
  // serving device memory (a peer may so have a shared-memory link and a device link).
  uint8_t memory;
};

}  // namespace ringreduce::transport
