#include "transport/link.h"

#include "ringreduce/error.h"

namespace ringreduce::transport {

void throw_interrupt(const std::string& reason, int code) {
  if (code == static_cast<int>(ErrorCode::mismatch)) throw MismatchError(reason);
  throw Error(reason, static_cast<ErrorCode>(code));
}

bool is_deeper_cause(const std::exception_ptr& notice, int blamed) {
  if (!notice) return false;
  try {
    std::rethrow_exception(notice);
  } catch (const PeerError& e) {
    // A notice that only reports the same lost peer says no more than our own error does; one
    // that pins the failure on another rank knows where it started: the rank that closed on us
    // without a word was most likely failing for that reason too.
    return e.peer() >= 0 && e.peer() != blamed;
  } catch (...) {
    return true;  // a mismatch, an abort, a timeout elsewhere
  }
}

}  // namespace ringreduce::transport
