// The transport table, in the manner of NCCL's: the kinds of link in order of preference, each a
// row of its own (kind_row.h) declared in its folder. Every peer goes to the first kind that can
// link it (shared memory for a peer on this host, unless RINGREDUCE_SHM=0; TCP for any peer), and
// for device memory also to the first kind serving it (device links between the ranks of a host
// that use a GPU: device/); each kind then connects to the peers it was given, and one Engine
// drives them all. Every rank
// applies the same table to the same host identities, so both ends of a pair pick the same kind.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/auth.h"
#include "core/config.h"
#include "core/deadline.h"
#include "core/fd.h"
#include "transport/engine.h"
#include "transport/kind_row.h"

namespace ringreduce::transport {

// The table, fastest kind first.
const std::vector<KindEntry>& kind_table();

// The listeners a rank opens before it joins, so that what peers need to reach it travels in its
// join record ("shm=<...>;tcp=<...>;ctl=<host>|<port>|<nonce>": each kind's opaque part under its
// name, then the control plane's) instead of through a store key per kind and peer.
struct Listeners {
  // Each kind's settings decide whether it listens; the token, whether they carry nonces; the
  // store's host, which interface sockets listen on (tcp/socket.h).
  Listeners(const core::Config& config, const std::string& token, const std::string& store_host);
  std::string published() const;
  // By the table's rows; null where a kind opened none. Taken by the kinds' links.
  std::vector<std::unique_ptr<KindListener>> kinds;
  // The control plane's listener (control.h), on the data interface: what the survivors of a
  // failure talk over once the data links are gone.
  core::Fd ctl;
  std::string ctl_published;
  core::auth::Nonce ctl_nonce{};
};

// Rank q's part of what it published (Listeners::published()) for `prefix` ("shm=", "tcp=",
// "ctl="); "" if none.
std::string published_part(const std::string& published, const std::string& prefix);

// The settings every kind needs every rank to share, "NAME=value\n" each (for the join's check).
std::string agreed_settings(const core::Config& config);
// Checks this rank's values of every kind's settings (throws InvalidArgument naming one).
void check_settings(const core::Config& config);

// Every peer routed to its kind (the first row that can link it), with each kind's share of the
// join: made once, for the open-files check and then the connect.
struct Routes {
  std::vector<KindShare> shares;  // by row of the table
  std::vector<int> row;           // by rank: the row that links it (-1: this rank)
  std::vector<int> device_row;    // by rank: the row linking it for device memory (-1: none)
  // The descriptors the links will hold, and per kind used how many peers it links: "23 peers
  // over shm, 8 over tcp" (the open-files check's message).
  size_t open_files(const ConnectArgs& args, std::string* per_kind) const;
};
// published: every rank's join record (Listeners::published(), by rank); listeners: this rank's
// (null with one rank).
Routes route(const ConnectArgs& args, const std::vector<std::string>& published,
             Listeners* listeners);

// Connects each kind used to its peers, and returns the engine over them.
std::unique_ptr<Engine> connect(const ConnectArgs& args, Routes& routes,
                                const core::Deadline& deadline);

}  // namespace ringreduce::transport
