// The store server's TLS handshakes (RINGREDUCE_ENCRYPT=tls), off its event loop: a handshake
// waits on the client for round trips, and the loop, which serves every rank, must never wait. A
// few threads take the connections in turn, each on a duplicate of the connection's socket, and
// report how each ended through a descriptor the loop polls.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "core/deadline.h"
#include "core/fd.h"
#include "core/tls_keys.h"

namespace ringreduce::rendezvous {

class TlsHandshakes {
 public:
  struct Result {
    uint64_t id = 0;
    std::optional<core::tls::Secret> secret;  // empty: failed, `error` says why
    std::string error;
  };

  // Loads and checks the files now: a wrong path is said when the store starts.
  explicit TlsHandshakes(const core::tls::Files& files);
  // Ends the handshakes under way (their sockets shut down) and joins the threads.
  ~TlsHandshakes();
  TlsHandshakes(const TlsHandshakes&) = delete;
  TlsHandshakes& operator=(const TlsHandshakes&) = delete;

  // Readable (an eventfd) while results wait for take().
  int ready_fd() const { return ready_.get(); }
  // Queues the acceptor's handshake for connection `id` on a duplicate of `fd` (the connection
  // stays the caller's), bound to `context`, ending by `deadline` at the latest.
  void start(uint64_t id, int fd, std::span<const uint8_t> context, core::Deadline deadline);
  std::vector<Result> take();

 private:
  struct Job {
    uint64_t id = 0;
    core::Fd fd;
    std::vector<uint8_t> context;
    core::Deadline deadline = core::Deadline::never();
  };
  void work(std::stop_token stop);

  const core::tls::Context context_;
  core::Fd ready_;
  std::mutex mu_;
  std::condition_variable_any wake_;
  std::deque<Job> queue_;
  std::vector<int> running_;  // sockets of the handshakes under way, for the destructor
  size_t idle_ = 0;
  std::vector<Result> results_;
  std::vector<std::jthread> threads_;  // last: joined before the members above go
};

}  // namespace ringreduce::rendezvous
