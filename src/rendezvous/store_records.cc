#include "rendezvous/store_records.h"

#include <algorithm>
#include <string>

#include "rendezvous/tcp_store_wire.h"

namespace ringreduce::rendezvous {

void StoreRecords::seal(std::initializer_list<std::span<const uint8_t>> pieces,
                        std::vector<uint8_t>* out) {
  size_t total = 0;
  for (const auto& p : pieces) total += p.size();
  auto piece = pieces.begin();
  size_t at = 0;  // within *piece
  // Bounded: every pass seals at least one byte of the `total` left.
  while (total > 0) {
    const size_t n = std::min(total, kRecordBytes);
    const size_t start = out->size();
    out->resize(start + kHeaderBytes + n + core::aead::kTagBytes);
    uint8_t* h = out->data() + start;
    const uint64_t seq = sealer_.next_sequence();
    for (int i = 0; i < 4; ++i) h[i] = static_cast<uint8_t>(n >> (24 - 8 * i));
    for (int i = 0; i < 8; ++i) h[4 + i] = static_cast<uint8_t>(seq >> (56 - 8 * i));
    sealer_.begin(std::span<const uint8_t>(h, kHeaderBytes));
    uint8_t* body = h + kHeaderBytes;
    size_t done = 0;
    while (done < n) {
      while (at == piece->size()) {
        ++piece;
        at = 0;
      }
      const size_t k = std::min(n - done, piece->size() - at);
      sealer_.add(piece->subspan(at, k), body + done);
      at += k;
      done += k;
    }
    sealer_.end(std::span<uint8_t, core::aead::kTagBytes>(body + n, core::aead::kTagBytes));
    total -= n;
  }
}

size_t StoreRecords::record_bytes(const uint8_t* header) {
  const uint32_t n = wire::load32(header);
  if (n == 0 || n > kRecordBytes)
    throw wire::ProtocolError("a sealed record announces " + std::to_string(n) + " bytes (1 to " +
                              std::to_string(kRecordBytes) +
                              "): the peer does not encrypt, or the stream was altered");
  return kHeaderBytes + n + core::aead::kTagBytes;
}

void StoreRecords::open(const uint8_t* record, std::vector<uint8_t>* plain) {
  const size_t n = wire::load32(record);
  const uint64_t seq = wire::load64(record + 4);
  const size_t start = plain->size();
  plain->resize(start + n);
  try {
    opener_.open(seq, std::span<const uint8_t>(record, kHeaderBytes),
                 std::span<const uint8_t>(record + kHeaderBytes, n), plain->data() + start,
                 std::span<const uint8_t, core::aead::kTagBytes>(record + kHeaderBytes + n,
                                                                 core::aead::kTagBytes));
  } catch (...) {
    plain->resize(start);
    throw;
  }
}

void StoreRecords::open_all(const std::vector<uint8_t>& in, size_t* off,
                            std::vector<uint8_t>* plain) {
  // Bounded: every pass consumes one whole record or returns.
  while (in.size() - *off >= kHeaderBytes) {
    const size_t bytes = record_bytes(in.data() + *off);
    if (in.size() - *off < bytes) return;
    open(in.data() + *off, plain);
    *off += bytes;
  }
}

}  // namespace ringreduce::rendezvous
