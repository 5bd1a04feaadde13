#include "rendezvous/store_util.h"

#include <algorithm>
#include <cstdio>

#include "ringreduce/error.h"
#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

core::Deadline store_deadline(std::chrono::milliseconds timeout) {
  // Ten years is far beyond any sane rendezvous and far inside steady_clock's ~292-year range.
  constexpr std::chrono::milliseconds kCap = std::chrono::hours(24 * 365 * 10);
  return core::Deadline::after(std::clamp(timeout, std::chrono::milliseconds(0), kCap));
}

std::string quote_key(const std::string& key) {
  // Keys are arbitrary bytes; a message must stay one readable line whatever they contain.
  constexpr size_t kMaxShown = 200;
  std::string out = "'";
  for (size_t i = 0; i < key.size() && i < kMaxShown; ++i) {
    unsigned char c = static_cast<unsigned char>(key[i]);
    if (c >= 0x20 && c < 0x7f && c != '\\' && c != '\'') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  if (key.size() > kMaxShown) out += "...(" + std::to_string(key.size()) + " bytes)";
  return out + "'";
}

std::string missing_keys_message(const std::string& store, const std::vector<std::string>& missing,
                                 std::chrono::milliseconds timeout) {
  constexpr size_t kMaxListed = 8;
  std::string out = store + ": " + (missing.size() == 1 ? "key " : "keys ");
  for (size_t i = 0; i < missing.size() && i < kMaxListed; ++i) {
    if (i > 0) out += ", ";
    out += quote_key(missing[i]);
  }
  if (missing.size() > kMaxListed)
    out += " (and " + std::to_string(missing.size() - kMaxListed) + " more)";
  out += missing.size() == 1 ? " was" : " were";
  out += " not set within " + std::to_string(timeout.count()) + " ms";
  return out;
}

int64_t parse_counter(const std::string& store, const std::string& key,
                      const std::vector<uint8_t>& value) {
  auto bad = [&] {
    return InvalidArgument(store + ": add on key " + quote_key(key) +
                           ", whose value is not a decimal integer (" +
                           std::to_string(value.size()) + " bytes)");
  };
  size_t i = 0;
  bool negative = false;
  if (i < value.size() && value[i] == '-') {
    negative = true;
    ++i;
  }
  if (i == value.size() || value.size() > 21) throw bad();
  // Accumulate as a negative number so that INT64_MIN parses without overflow.
  int64_t v = 0;
  for (; i < value.size(); ++i) {
    if (value[i] < '0' || value[i] > '9') throw bad();
    int digit = value[i] - '0';
    if (v < (INT64_MIN + digit) / 10) throw bad();
    v = v * 10 - digit;
  }
  if (!negative) {
    if (v == INT64_MIN) throw bad();
    v = -v;
  }
  return v;
}

std::vector<uint8_t> format_counter(int64_t value) {
  std::string s = std::to_string(value);
  return std::vector<uint8_t>(s.begin(), s.end());
}

int64_t add_counter(const std::string& store, const std::string& key, int64_t current,
                    int64_t delta) {
  int64_t result = 0;
  if (__builtin_add_overflow(current, delta, &result))
    throw InvalidArgument(store + ": add of " + std::to_string(delta) + " to key " +
                          quote_key(key) + " (now " + std::to_string(current) +
                          ") overflows int64");
  return result;
}

}  // namespace ringreduce::rendezvous

namespace ringreduce {

std::optional<std::vector<uint8_t>> Store::get_unless(const std::string& key,
                                                      const std::string& unless,
                                                      std::chrono::milliseconds timeout) {
  // Stores without a wait on either of two keys: waits of 100 ms on key, `unless` looked at
  // between them.
  constexpr std::chrono::milliseconds kSlice(100);
  const core::Deadline deadline = rendezvous::store_deadline(timeout);
  for (;;) {
    try {
      return get(key, std::min(std::chrono::milliseconds(deadline.remaining_ms()), kSlice));
    } catch (const TimeoutError&) {
      if (check({unless})) return std::nullopt;
      if (deadline.expired())
        throw TimeoutError(rendezvous::missing_keys_message("store", {key}, timeout));
    }
  }
}

}  // namespace ringreduce
