// Which ranks share a host. Ranks on one host may talk through shared memory; the identity must
// tell apart what a hostname alone does not: two containers or network namespaces with one
// hostname (they cannot reach each other's abstract Unix sockets), and a reused hostname after a
// reboot.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "ringreduce/store.h"

namespace ringreduce::transport {

// hostname, kernel boot id and network namespace of this process.
std::string host_identity();

// Publishes this rank's identity under "host/<rank>" and reads everyone's; bounded by timeout.
std::vector<std::string> exchange_host_identities(Store& store, int rank, int size,
                                                  const std::string& mine,
                                                  std::chrono::milliseconds timeout);

}  // namespace ringreduce::transport
