// How the communicator reports failures: errors keep their class (TimeoutError, PeerError, ...)
// when it puts the rank and the op in front of their messages.
#pragma once

#include <chrono>
#include <exception>
#include <string>

#include "ringreduce/error.h"

namespace ringreduce::detail {

// How long a rank that lost a peer listens for another peer's deeper cause before it reports the
// lost peer. The cause was sent before the lost peer even reacted to it, so it is normally there
// already; this only bounds the wait when there is none (a rank that really died).
inline constexpr std::chrono::milliseconds kCauseGrace{100};

// The rank a failure is pinned on: the peer of a PeerError (dead, stuck or failing), else none.
inline int blamed_rank(const Error& e) {
  const auto* pe = dynamic_cast<const PeerError*>(&e);
  return pe ? pe->peer() : -1;
}

// An error of e's class (and blamed rank) with the message `msg`.
inline std::exception_ptr rebuild(const Error& e, const std::string& msg) {
  switch (e.code()) {
    case ErrorCode::timeout:
      return std::make_exception_ptr(TimeoutError(msg));
    case ErrorCode::peer:
      return std::make_exception_ptr(PeerError(msg, blamed_rank(e)));
    case ErrorCode::mismatch:
      return std::make_exception_ptr(MismatchError(msg));
    case ErrorCode::invalid_argument:
      return std::make_exception_ptr(InvalidArgument(msg));
    default:
      return std::make_exception_ptr(Error(msg, e.code()));
  }
}

// Rebuilds `e` with `prefix` in front of its message (and `suffix` after), keeping its type.
inline std::exception_ptr with_prefix(const Error& e, const std::string& prefix,
                                      const std::string& suffix) {
  return rebuild(e, prefix + e.what() + suffix);
}

// The message of any exception (for wrapping one that is not an Error).
inline std::string message_of(std::exception_ptr e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "unknown exception";
  }
}

}  // namespace ringreduce::detail
