#include "transport/tcp/striped_link.h"

#include "reduce/wire.h"

namespace ringreduce::transport::tcp {

StripedLink::StripedLink(std::vector<TcpLink*> wires, size_t min_stripe)
    : wires_(std::move(wires)), min_stripe_(min_stripe > 0 ? min_stripe : 1) {}

template <typename Fn>
void StripedLink::for_each_stripe(size_t bytes, Fn&& fn) const {
  const size_t k = wires_.size();
  size_t n = bytes / min_stripe_;
  if (n > k) n = k;
  if (n <= 1) {
    fn(*wires_[0], 0, bytes);
    return;
  }
  constexpr size_t kAlign = 64;
  const size_t per = ((bytes + n - 1) / n + kAlign - 1) / kAlign * kAlign;
  for (size_t i = 0, off = 0; i < n && off < bytes; ++i, off += per)
    fn(*wires_[i], off, bytes - off < per ? bytes - off : per);
}

template <typename Fn>
void StripedLink::for_each_coded_stripe(size_t count, Wire wire, Fn&& fn) const {
  const size_t k = wires_.size();
  size_t n = reduce::wire_bytes(wire, count) / min_stripe_;
  if (n > k) n = k;
  if (n <= 1) {
    fn(*wires_[0], 0, count);
    return;
  }
  constexpr size_t kAlign = reduce::kWireBlock;  // a whole block of every format
  const size_t per = ((count + n - 1) / n + kAlign - 1) / kAlign * kAlign;
  for (size_t i = 0, off = 0; i < n && off < count; ++i, off += per)
    fn(*wires_[i], off, count - off < per ? count - off : per);
}

void StripedLink::send_coded(const float* src, size_t count, Wire wire, Completion* c) {
  for_each_coded_stripe(
      count, wire, [&](TcpLink& w, size_t off, size_t n) { w.send_coded(src + off, n, wire, c); });
}

void StripedLink::recv_coded(float* dst, const float* local, size_t count, Wire wire,
                             Completion* c) {
  for_each_coded_stripe(count, wire, [&](TcpLink& w, size_t off, size_t n) {
    w.recv_coded(dst + off, local ? local + off : nullptr, n, wire, c);
  });
}

StripedLink& StripedLink::striped_next(Link& next) const {
  auto* s = dynamic_cast<StripedLink*>(&next);
  if (!s || s->wires_.size() != wires_.size() || s->min_stripe_ != min_stripe_)
    throw std::logic_error("a striped TCP link forwards only on a striped TCP link like it");
  return *s;
}

void StripedLink::send(const void* src, size_t bytes, Completion* c) {
  const char* p = static_cast<const char*>(src);
  for_each_stripe(bytes, [&](TcpLink& w, size_t off, size_t len) { w.send(p + off, len, c); });
}

void StripedLink::recv(void* dst, size_t bytes, Completion* c) {
  char* p = static_cast<char*>(dst);
  for_each_stripe(bytes, [&](TcpLink& w, size_t off, size_t len) { w.recv(p + off, len, c); });
}

void StripedLink::recv_reduce(void* dst, const void* local, size_t bytes, const Reduction& r,
                              Completion* c) {
  char* d = static_cast<char*>(dst);
  const char* l = static_cast<const char*>(local);
  for_each_stripe(bytes, [&](TcpLink& w, size_t off, size_t len) {
    w.recv_reduce(d + off, l + off, len, r, c);
  });
}

void StripedLink::recv_reduce_send(void* dst, const void* local, size_t bytes, const Reduction& r,
                                   Link& next, bool keep, Completion* c) {
  StripedLink& nx = striped_next(next);
  char* d = static_cast<char*>(dst);
  const char* l = static_cast<const char*>(local);
  size_t i = 0;
  for_each_stripe(bytes, [&](TcpLink& w, size_t off, size_t len) {
    w.recv_reduce_send(d + off, l + off, len, r, *nx.wires_[i++], keep, c);
  });
}

void StripedLink::recv_copy_send(void* dst, size_t bytes, Link& next, Completion* c) {
  StripedLink& nx = striped_next(next);
  char* d = static_cast<char*>(dst);
  size_t i = 0;
  for_each_stripe(bytes, [&](TcpLink& w, size_t off, size_t len) {
    w.recv_copy_send(d + off, len, *nx.wires_[i++], c);
  });
}

}  // namespace ringreduce::transport::tcp
