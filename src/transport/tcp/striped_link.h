// A link to one peer over several TCP connections (RINGREDUCE_NSOCKS): each message is cut into
// contiguous stripes, one per connection, so that one flow's stall (a loss, a slow window) holds
// up only its stripe and the others keep the wire busy. Both ends cut a message the same way,
// from its length alone, so stripe i of a send matches stripe i of the receive on connection i,
// and each connection keeps its own order.
#pragma once

#include <stdexcept>
#include <vector>

#include "transport/tcp/tcp_link.h"

namespace ringreduce::transport::tcp {

class StripedLink final : public Link {
 public:
  // Messages below 2 x min_stripe bytes travel whole on the first connection: a stripe has a
  // frame header and a syscall or two of its own.
  StripedLink(std::vector<TcpLink*> wires, size_t min_stripe);
  int peer() const override { return wires_[0]->peer(); }
  bool closed() const override {
    for (const TcpLink* w : wires_)
      if (w->closed()) return true;
    return false;
  }

  void send(const void* src, size_t bytes, Completion* c) override;
  void recv(void* dst, size_t bytes, Completion* c) override;
  void recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                   Completion* c) override;
  // next must be a StripedLink with as many connections: stripe i forwards on its connection i.
  void recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r, Link& next,
                        bool keep, Completion* c) override;
  void recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) override;
  // Coded messages are striped by elements, whole blocks of the format to a stripe.
  void send_coded(const float* src, size_t count, Wire wire, Completion* c) override;
  void recv_coded(float* dst, const float* local, size_t count, Wire wire, Completion* c) override;
  // Forwards across kinds need one frame per message: communicators that mix shared memory and
  // TCP do not stripe (comm_impl.cc), so these are never called.
  void* reserve_forward(const void*, size_t, Completion*) override {
    throw std::logic_error("striped TCP links do not take cross-kind forwards");
  }
  void forward_ready(void*, size_t) override {
    throw std::logic_error("striped TCP links do not take cross-kind forwards");
  }

 private:
  // Calls fn(wire, offset, length) for each stripe of a message of `bytes`. Stripes are multiples
  // of 64 bytes (so never split an element of any dtype), except the last.
  template <typename Fn>
  void for_each_stripe(size_t bytes, Fn&& fn) const;
  // The same for a coded message of `count` floats: fn(wire, element offset, elements).
  template <typename Fn>
  void for_each_coded_stripe(size_t count, Wire wire, Fn&& fn) const;
  StripedLink& striped_next(Link& next) const;

  std::vector<TcpLink*> wires_;
  size_t min_stripe_;
};

}  // namespace ringreduce::transport::tcp
