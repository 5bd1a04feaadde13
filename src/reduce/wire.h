// Narrow wire formats (ringreduce::Wire): how float32 data is coded on its way between ranks,
// and the facts about each format that the links (to cut messages), the algorithms (to round a
// result) and the tests (to bound the error) need. The kernels are per instruction set
// (wire_kernels.inc); these calls dispatch to the widest the CPU runs, as combine() does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ringreduce/types.h"

namespace ringreduce::reduce {

// A format's layout. A message of `count` floats is a sequence of units: a unit of a scaled
// format is one block (an int32 exponent, then up to kWireBlock codes); of bf16, one element.
// Links cut coded messages only between units, so that each piece decodes on its own.
struct WireLayout {
  size_t unit_elems;  // floats per whole unit
  size_t unit_bytes;  // its bytes on the wire
  size_t code_bytes;  // bytes per element's code
  bool scaled;
  // For the error bound (wire_error_bound): the format's unit roundoff (half an ulp relative to
  // the value, 2^-(mantissa bits + 1)) and half its smallest subnormal step, before scaling.
  double roundoff;
  double half_step;
};
inline constexpr size_t kWireBlock = 256;

// Wire::none and Wire::automatic have no layout: InvalidArgument.
const WireLayout& wire_layout(Wire w);
// Bytes on the wire for `count` floats.
size_t wire_bytes(Wire w, size_t count);
// Floats in the whole units that fit in `bytes` (at least one unit's worth when `bytes` holds
// one), for cutting a message into pieces.
size_t wire_elems_fitting(Wire w, size_t bytes);
// The wire bytes of the first `elems` floats of a message, elems a multiple of unit_elems (or
// the whole message).
inline size_t wire_offset(Wire w, size_t elems) {
  return wire_bytes(w, elems);
}

// A piece of a coded message of `count` floats: its first float and how many.
struct WirePiece {
  size_t first;
  size_t count;
};
// What a sender codes next: the piece that starts at byte `done` (a unit boundary) and fills at
// most `room` bytes with whole units (at least one), or the message's rest.
inline WirePiece wire_next_piece(Wire w, size_t done, size_t count, size_t room) {
  const WireLayout& l = wire_layout(w);
  const size_t first = done / l.unit_bytes * l.unit_elems;
  const size_t fits = wire_elems_fitting(w, room);
  return {first, count - first < fits ? count - first : fits};
}
// What a receiver decodes: the floats in `bytes` at byte `done` of a message of `count` floats
// and `total` bytes, which hold whole units or the message's rest. {0, 0} when they do not (a
// piece cut inside a unit: the caller's error).
inline WirePiece wire_received_piece(Wire w, size_t done, size_t bytes, size_t count,
                                     size_t total) {
  const WireLayout& l = wire_layout(w);
  const size_t first = done / l.unit_bytes * l.unit_elems;
  if (done + bytes == total) {
    if (wire_bytes(w, count - first) != bytes) return {0, 0};
    return {first, count - first};
  }
  if (bytes % l.unit_bytes != 0) return {0, 0};
  return {first, bytes / l.unit_bytes * l.unit_elems};
}

// Codes count floats into dst (wire_bytes(w, count) bytes), from a unit boundary.
void wire_encode(void* dst, const float* src, size_t count, Wire w);
// dst = decoded src (local null) or local + decoded src (dst may be local), count floats.
void wire_decode(float* dst, const float* local, const void* src, size_t count, Wire w);
// dst = what coding src and decoding it gives (dst may be src). Coding the result again gives
// the same values back, so a rank that rounds its block and then sends it coded hands every
// receiver exactly its own values.
void wire_round(float* dst, const float* src, size_t count, Wire w);

// The exponent a scaled format's block takes for a block whose largest finite magnitude is
// amax (tests and the benchmark's checker state the error bound with it); 0 for bf16.
int wire_block_exponent(Wire w, float amax);
// The most that coding x can change it, given its block's exponent k: roundoff * |x| plus half
// a subnormal step at that scale.
double wire_error_bound(Wire w, double x, int k);

}  // namespace ringreduce::reduce
