// Which ranks share a host. Ranks on one host may talk through shared memory; the identity must
// tell apart what a hostname alone does not: two containers or network namespaces with one
// hostname (they cannot reach each other's abstract Unix sockets), and a reused hostname after a
// reboot.
#pragma once

#include <string>

namespace ringreduce::transport {

// hostname, kernel boot id and network namespace of this process.
std::string host_identity();

}  // namespace ringreduce::transport
