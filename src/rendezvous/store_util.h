// Pieces every Store implementation shares, so that the memory, file and TCP stores agree on
// what a counter looks like and on how a timeout is reported.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "core/deadline.h"

namespace ringreduce::rendezvous {

// A deadline `timeout` from now. Negative timeouts mean "check once"; absurdly long ones are
// capped at ten years so that the time_point arithmetic cannot overflow.
core::Deadline store_deadline(std::chrono::milliseconds timeout);

// The key as it should appear in a message: quoted, non-printable bytes escaped, long keys cut.
std::string quote_key(const std::string& key);

// "key 'a' was not set within 300 ms" / "keys 'a', 'b' (and 3 more) were not set within 300 ms",
// prefixed by the store's description. Used for every store's TimeoutError so that callers can
// rely on the message naming the missing keys and the timeout.
std::string missing_keys_message(const std::string& store, const std::vector<std::string>& missing,
                                 std::chrono::milliseconds timeout);

// Counters (Store::add) are stored as decimal ASCII, like torch's stores do, so that get() on a
// counter returns something readable and the three implementations interoperate with tools.
// Parsing throws InvalidArgument naming the key when the existing value is not such a number.
int64_t parse_counter(const std::string& store, const std::string& key,
                      const std::vector<uint8_t>& value);
std::vector<uint8_t> format_counter(int64_t value);
// current + delta; InvalidArgument naming the key on int64 overflow.
int64_t add_counter(const std::string& store, const std::string& key, int64_t current,
                    int64_t delta);

}  // namespace ringreduce::rendezvous
