// Descriptors passed between processes of one host over a Unix socket (SCM_RIGHTS): shared
// memory's segments and doorbells (transport/shm), a device's exported memory (comm/device.h).
// Both calls are non-blocking: the caller waits for the socket itself.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

#include "core/fd.h"

namespace ringreduce::core {

// One message and its descriptors; like sendmsg: the bytes sent, or -1 with errno.
ssize_t send_with_fds(int sock, const void* data, size_t len, const int* fds, size_t nfds);

// Receives one message and its descriptors: the bytes received (0: the peer closed), -1 if
// nothing has arrived yet, -2 if descriptors were lost (*err says why).
ssize_t recv_with_fds(int sock, void* data, size_t len, size_t max_fds, std::vector<Fd>* fds,
                      std::string* err);

}  // namespace ringreduce::core
