// The error hierarchy of the C++ API. Every message names the rank that raised it and, when an
// op was running, the op and its sequence number, e.g.
//   "rank 3: allreduce #812 (float x 4194304, sum): peer rank 2 closed the connection".
#pragma once

#include <stdexcept>
#include <string>

#include "ringreduce/export.h"

namespace ringreduce {

enum class ErrorCode : int {
  ok = 0,
  internal = 1,
  invalid_argument = 2,
  timeout = 3,
  peer = 4,
  mismatch = 5,
  aborted = 6,
};

class RINGREDUCE_API Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what, ErrorCode code = ErrorCode::internal)
      : std::runtime_error(what), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

// A wait ran past its deadline. The message names the rank that was waited on.
class RINGREDUCE_API TimeoutError : public Error {
 public:
  explicit TimeoutError(const std::string& what) : Error(what, ErrorCode::timeout) {}
};

// A peer failed: closed its connection, died, or sent something unreadable.
class RINGREDUCE_API PeerError : public Error {
 public:
  PeerError(const std::string& what, int peer) : Error(what, ErrorCode::peer), peer_(peer) {}
  int peer() const { return peer_; }

 private:
  int peer_;
};

// Ranks issued different collectives (kind, count, dtype, op or root) at the same position.
class RINGREDUCE_API MismatchError : public Error {
 public:
  explicit MismatchError(const std::string& what) : Error(what, ErrorCode::mismatch) {}
};

// The caller passed something unusable (a bad root, a too-small buffer, an unknown setting).
class RINGREDUCE_API InvalidArgument : public Error {
 public:
  explicit InvalidArgument(const std::string& what) : Error(what, ErrorCode::invalid_argument) {}
};

}  // namespace ringreduce
