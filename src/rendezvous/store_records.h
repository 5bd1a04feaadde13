// Sealed records on a store connection (RINGREDUCE_ENCRYPT=psk or tls, issue 45): once the hello
// (and the token's proofs, or the TLS handshake) is done, every byte of the request/response
// frames of tcp_store_wire.h travels inside records, both ways:
//   plaintext_len u32 | seq u64 | ciphertext (plaintext_len bytes) | tag (16 bytes)
// big-endian like the rest of the wire; the 12-byte header is the AEAD's associated data and the
// sequence number the Sealer's (core/aead.h), so a record replayed, dropped, reordered or altered
// on the way is a FrameError saying which, and nothing of it is used. A record carries 1 to
// kRecordBytes of plaintext: a frame is cut into as many as it needs, and a receiver never
// buffers more than one record's ciphertext before checking it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <vector>

#include "core/aead.h"

namespace ringreduce::rendezvous {

class StoreRecords {
 public:
  static constexpr size_t kRecordBytes = size_t{64} << 10;
  static constexpr size_t kHeaderBytes = 12;
  static constexpr size_t kMaxRecord = kHeaderBytes + kRecordBytes + core::aead::kTagBytes;

  explicit StoreRecords(const core::aead::SessionKeys& keys) : sealer_(keys), opener_(keys) {}

  // Seals the concatenation of `pieces` (a frame's header and payload, say) as records appended
  // to *out.
  void seal(std::initializer_list<std::span<const uint8_t>> pieces, std::vector<uint8_t>* out);

  // The whole record's bytes, from its header: wire::ProtocolError for a length of 0 or over
  // kRecordBytes (not a record of ours: the stream is out of step or was altered).
  static size_t record_bytes(const uint8_t* header);
  // Opens one whole record (record_bytes(record) bytes at `record`), appending its plaintext to
  // *plain. Throws core::aead::FrameError where it must not be used.
  void open(const uint8_t* record, std::vector<uint8_t>* plain);
  // Opens every whole record in in[*off..], moving *off past them.
  void open_all(const std::vector<uint8_t>& in, size_t* off, std::vector<uint8_t>* plain);

 private:
  core::aead::Sealer sealer_;
  core::aead::Opener opener_;
};

}  // namespace ringreduce::rendezvous
