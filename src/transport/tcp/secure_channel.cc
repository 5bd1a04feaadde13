#include "transport/tcp/secure_channel.h"

#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <span>
#include <string>
#include <utility>

#include "ringreduce/error.h"

namespace ringreduce::transport::tcp {

namespace {
constexpr size_t kRecordMax = SecureChannel::kRecordBytes + SecureChannel::kOverhead;
}

SecureChannel::SecureChannel(const core::aead::SessionKeys& keys)
    : sealer_(keys),
      opener_(keys),
      out_(std::make_unique_for_overwrite<uint8_t[]>(kRecordMax)),
      in_(std::make_unique_for_overwrite<uint8_t[]>(kRecordMax)) {}

int SecureChannel::flush(int fd) {
  while (out_done_ < out_len_) {
    const ssize_t w =
        ::send(fd, out_.get() + out_done_, out_len_ - out_done_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    out_done_ += static_cast<size_t>(w);
  }
  out_len_ = out_done_ = 0;
  return 1;
}

ssize_t SecureChannel::send(int fd, const iovec* iov, int n) {
  if (pending()) {
    const int f = flush(fd);
    if (f <= 0) {
      if (f == 0) errno = EAGAIN;
      return -1;
    }
    // The record is all out now: its plaintext (the caller's first bytes, offered again) counts.
    return static_cast<ssize_t>(std::exchange(pending_taken_, 0));
  }
  // Up to one record's plaintext from the iovecs, sealed as it is read from them straight into
  // the record behind its header: one pass over the caller's bytes, as the socket's own copy.
  size_t taken = 0;
  for (int i = 0; i < n && taken < kRecordBytes; ++i)
    taken += std::min(iov[i].iov_len, kRecordBytes - taken);
  if (taken == 0) return 0;
  RecordHeader h;
  h.bytes = static_cast<uint32_t>(taken);
  h.magic = kRecordMagic;
  h.seq = sealer_.next_sequence();
  std::memcpy(out_.get(), &h, sizeof h);
  uint8_t* body = out_.get() + sizeof(RecordHeader);
  sealer_.begin(std::span<const uint8_t>(out_.get(), sizeof h));
  size_t at = 0;
  for (int i = 0; i < n && at < taken; ++i) {
    const size_t k = std::min(iov[i].iov_len, taken - at);
    sealer_.add(std::span<const uint8_t>(static_cast<const uint8_t*>(iov[i].iov_base), k),
                body + at);
    at += k;
  }
  sealer_.end(std::span<uint8_t, core::aead::kTagBytes>(body + taken, core::aead::kTagBytes));
  out_len_ = sizeof h + taken + core::aead::kTagBytes;
  out_done_ = 0;
  // The plaintext counts as sent only once its whole record is on the socket (as a socket's own
  // buffer takes it), so that the caller's send is not done while its bytes wait here: a
  // record the socket did not take all of is finished by the next send() with the same bytes.
  const int f = flush(fd);
  if (f < 0) return -1;
  if (f == 0) {
    pending_taken_ = taken;
    errno = EAGAIN;
    return -1;
  }
  return static_cast<ssize_t>(taken);
}

ssize_t SecureChannel::recv(int fd, void* dst, size_t room) {
  // Reads up to `want` more bytes into in_; the bytes read, 0 at the end of the stream, -1 on
  // EAGAIN or an error (errno).
  auto read_some = [&](size_t want) -> ssize_t {
    for (;;) {
      const ssize_t r = ::recv(fd, in_.get() + in_got_, want, MSG_DONTWAIT);
      if (r < 0 && errno == EINTR) continue;
      if (r > 0) in_got_ += static_cast<size_t>(r);
      return r;
    }
  };
  while (!have_header_) {
    const ssize_t r = read_some(sizeof(RecordHeader) - in_got_);
    if (r <= 0) {
      if (r == 0 && in_got_ > 0) throw Error("the connection ended inside an encrypted record");
      return r;
    }
    if (in_got_ < sizeof(RecordHeader)) continue;
    std::memcpy(&in_header_, in_.get(), sizeof in_header_);
    if (in_header_.magic != kRecordMagic || in_header_.bytes == 0 ||
        in_header_.bytes > kRecordBytes)
      throw core::aead::FrameError(
          core::aead::FrameError::Kind::altered, opener_.expected_sequence(), in_header_.seq,
          "a record header that is not one (magic " + std::to_string(in_header_.magic) + ", " +
              std::to_string(in_header_.bytes) + " bytes): not encrypted by the peer, or altered");
    have_header_ = true;
  }
  const size_t bytes = in_header_.bytes;
  if (room < bytes) {
    errno = EAGAIN;
    return -1;
  }
  const size_t total = sizeof(RecordHeader) + bytes + core::aead::kTagBytes;
  while (in_got_ < total) {
    const ssize_t r = read_some(total - in_got_);
    if (r == 0) throw Error("the connection ended inside an encrypted record");
    if (r < 0) return -1;
  }
  uint8_t* body = in_.get() + sizeof(RecordHeader);
  // Resets the record before open() may throw: the channel is unusable after an error anyway.
  have_header_ = false;
  in_got_ = 0;
  // Straight into the caller's buffer: checked there before the caller sees the count.
  opener_.open(
      in_header_.seq, std::span<const uint8_t>(in_.get(), sizeof(RecordHeader)),
      std::span<const uint8_t>(body, bytes), static_cast<uint8_t*>(dst),
      std::span<const uint8_t, core::aead::kTagBytes>(body + bytes, core::aead::kTagBytes));
  return static_cast<ssize_t>(bytes);
}

}  // namespace ringreduce::transport::tcp
