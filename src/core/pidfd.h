// Process descriptors (pidfd): how the ranks of one host reach each other's descriptors (a memfd,
// an eventfd, a GPU's exported memory) without passing them over a socket, and watch each other's
// processes end. The same user's processes in one pid namespace may.
#pragma once

#include <sys/types.h>

#include <string>

#include "core/fd.h"

namespace ringreduce::core {

// A pidfd of `pid`, or -1 with errno (no such process; a kernel before 5.3).
int pidfd_open(pid_t pid);
// This process's pid namespace ("<dev>:<inode>" of /proc/self/ns/pid) when pidfds can watch
// processes here; "-" otherwise. Two processes with the same value can use each other's pids.
std::string pidfd_namespace();
// A copy of descriptor `fd` of the process behind `pidfd` (pid_getfd; a kernel from 5.6, the
// same user), else the file reopened through /proc/<pid>/fd/<fd> (a memfd, not an anonymous
// inode); invalid with *why saying what both answered.
Fd take_peer_fd(pid_t pid, int pidfd, int fd, std::string* why);
// Whether the process behind `pidfd` has exited (its pidfd is readable).
bool pidfd_exited(int pidfd);

}  // namespace ringreduce::core
