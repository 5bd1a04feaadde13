// A communicator that spans hosts and has several ranks on some of them: shared memory between
// the ranks of one host, TCP to the others, driven by one engine.
//
// Links are chosen per pair at connect time: link(peer) is a ShmLink when the peer shares this
// host, else a TcpLink. A forward that crosses kinds (the ring's first rank on a host receives
// over TCP and forwards over shared memory; its last one the other way) goes through
// Link::reserve_forward / forward_ready, staged in the receive's destination.
//
// Waiting: one loop polls the shared-memory links and the TCP sockets (epoll with no timeout),
// with the shared-memory engine's spin and yield policy; to sleep it raises the shared-memory
// sleep flag and blocks in the TCP engine's epoll_wait, whose set also holds the shared-memory
// engine's epoll fd (doorbell and peers' liveness sockets), so either kind of event wakes it.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "transport/link.h"
#include "transport/shm/shm_transport.h"
#include "transport/tcp/tcp_transport.h"

namespace ringreduce::transport::hybrid {

class HybridTransport final : public Transport {
 public:
  // shm connects the ranks of this host (its local_ranks), tcp every other rank.
  HybridTransport(std::unique_ptr<shm::ShmTransport> shm, std::unique_ptr<tcp::TcpTransport> tcp,
                  std::vector<int> local_ranks, bool oversubscribed, int max_idle_yields,
                  int spin_us);

  int rank() const override { return tcp_->rank(); }
  int size() const override { return tcp_->size(); }
  int channels() const override { return tcp_->channels(); }
  Link& link(int peer, int channel) override;
  void begin_op(const OpTag& tag, bool stream_output = false) override;
  void wait(Completion& c, const core::Deadline& deadline) override;
  void abort(int code, int blamed_rank, const std::string& reason) override;
  std::exception_ptr find_cause(std::chrono::milliseconds grace, int blamed) override;
  void set_describer(std::function<std::string(const OpTag&)> f) override;
  void interrupt(const std::string& reason, int code) override;

 private:
  std::atomic<bool> interrupted_{false};
  std::mutex interrupt_mu_;
  std::string interrupt_reason_;
  int interrupt_code_ = 0;
  [[noreturn]] void throw_timeout();

  std::unique_ptr<shm::ShmTransport> shm_;
  std::unique_ptr<tcp::TcpTransport> tcp_;
  std::vector<bool> local_;  // by rank
  bool oversubscribed_;
  int max_idle_yields_;
  int spin_us_;
};

}  // namespace ringreduce::transport::hybrid
