// Encrypted, integrity-checked records on a data connection (issue 45, RINGREDUCE_ENCRYPT): what
// TcpLink writes and reads through instead of the bare socket when encryption is on. The link's
// own framing (headers, tags, abort notices) is unchanged and travels inside the records.
//
// A record is a RecordHeader (its plaintext length and sequence number: authenticated, not
// secret), the ciphertext and the AEAD tag (core/aead.h). Records carry at most kRecordBytes of
// plaintext, so that a receiver checks each record's tag before any of its bytes is used, and a
// record stays in cache between sealing and the socket's copy. Sequence numbers are the
// Sealer's: a record replayed, dropped or reordered on the way, or altered (header, ciphertext or
// tag), fails the connection with core::aead::FrameError saying which, never as data.
//
// Non-blocking, like the socket: send() seals one record from the caller's bytes and writes what
// the socket takes (the rest stays sealed here, and the bytes count as sent once all of it is
// out); recv() reads one record at a time,
// only once the caller has room for its whole plaintext (so that the channel never holds
// plaintext the caller has not taken while the socket is empty, which level-triggered epoll would
// then never report again).
#pragma once

#include <sys/types.h>
#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <utility>

#include "core/aead.h"

namespace ringreduce::transport::tcp {

struct RecordHeader {
  uint32_t bytes = 0;  // plaintext bytes
  uint32_t magic = 0;  // kRecordMagic
  uint64_t seq = 0;
};
static_assert(sizeof(RecordHeader) == 16);
inline constexpr uint32_t kRecordMagic = 0x31455252;  // "RRE1"

class SecureChannel {
 public:
  // The plaintext one record carries at most: 64 KiB keeps a record in L2 from sealing to the
  // socket and costs 32 bytes (header and tag), 0.05%.
  static constexpr size_t kRecordBytes = 64 << 10;
  static constexpr size_t kOverhead = sizeof(RecordHeader) + core::aead::kTagBytes;

  explicit SecureChannel(const core::aead::SessionKeys& keys);

  // Like sendmsg(fd, {iov, n}, MSG_NOSIGNAL | MSG_DONTWAIT) for plaintext: returns the bytes of
  // the iovecs taken once their record is all on the socket, or -1 with errno (EAGAIN: the
  // socket is full). A record the socket took only part of stays here, and the next call, which
  // must offer the same bytes first (the caller has not counted them), writes its rest and then
  // returns its count.
  ssize_t send(int fd, const iovec* iov, int n);
  // Writes what is sealed and not yet on the socket: 1 when nothing is left, 0 when the socket is
  // full, -1 with errno on an error.
  int flush(int fd);
  bool pending() const { return out_len_ > out_done_; }
  // After a flush() that emptied it: the plaintext bytes of the record it finished, which no
  // send() has counted yet (0 if none); counted now.
  size_t take_flushed() { return pending() ? 0 : std::exchange(pending_taken_, 0); }

  // Like recv(fd, dst, room, MSG_DONTWAIT) for plaintext: the bytes put into dst (a whole record,
  // at most room), 0 when the peer closed the connection at a record's boundary, -1 with errno
  // (EAGAIN: no whole record yet, or room too small for the next one: call again with more).
  // Throws core::aead::FrameError for a record that must not be delivered, and Error for a
  // connection that ends inside a record or a header that is not a record's.
  ssize_t recv(int fd, void* dst, size_t room);
  // The plaintext bytes of the next record, once its header has arrived (else 0): the room a
  // recv() needs.
  size_t next_record_bytes() const { return have_header_ ? in_header_.bytes : 0; }

 private:
  core::aead::Sealer sealer_;
  core::aead::Opener opener_;
  std::unique_ptr<uint8_t[]> out_;  // one sealed record being written
  size_t out_len_ = 0, out_done_ = 0;
  size_t pending_taken_ = 0;       // plaintext of the record in out_, not yet counted
  std::unique_ptr<uint8_t[]> in_;  // one record being read (header, ciphertext, tag)
  size_t in_got_ = 0;
  RecordHeader in_header_;
  bool have_header_ = false;
};

}  // namespace ringreduce::transport::tcp
