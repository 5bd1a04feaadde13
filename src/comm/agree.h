// Agreement among the ranks that are still alive (ULFM's MPIX_Comm_agree): which ranks are left,
// the AND of a flag, and whatever each survivor brings (its count of completed calls, a digest of
// arguments every survivor must pass alike, the addresses of a communicator to come). Run over
// the control plane (transport/control.h), never through the store, which may have died with
// its host; bounded by a deadline; tolerating failures while it runs.
//
// The algorithm is flooding consensus (Cachin, Guerraoui and Rodrigues, "Introduction to
// Reliable and Secure Distributed Programming", 2011, algorithm 5.1), which needs a perfect
// failure detector, as a rank's death here is (a refused or reset connection: its process is
// gone), and the control plane reports a loss only after the last message the lost rank got out
// (the same TCP stream). Every rank sends, round after round, one message to every rank it has
// not seen fail: its own entry. A round ends when a message of that round has come from every
// rank this rank has not itself seen fail. (Not failures heard from others: taking them on
// would let a rank drop a dead peer before that peer's last message to it arrives, which breaks
// the argument below; the random-order simulation in agree_test found exactly that.) A rank
// decides once two rounds in a row ended with the same ranks alive: the survivors are those
// ranks, with their entries. It then sends the decision to every survivor, and a rank that
// receives a decision adopts it and passes it on before returning, so that a decision made by a
// rank that dies halfway through sending it still reaches everyone or no one. A rank decides on
// the ranks it heard from in its last round (the book's receivedfrom, not who is alive now). Why
// it agrees: a rank heard in one decider's last round r but not in another's had finished
// sending round r - 1 to everyone and failed while sending round r, so the second heard it in
// round r - 1 and not in r, and did not decide in round r; in a later round it waits for the
// first decider, which sends its decision instead of a round message. Two rounds of N - 1 messages
// per rank when nothing fails, one more per failure met along the way.
//
// A rank that is silent for the whole deadline (stopped, or its host unreachable) is taken as
// failed, as an op's timeout would; that makes the detector imperfect, and the price is stated
// in docs/RELIABILITY.md. The state machine is socket-free (tests/unit/agree_test.cc runs it on
// messages it delivers in adversarial orders); run_agreement drives it over a control plane.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/deadline.h"
#include "transport/control.h"

namespace ringreduce::detail {

// "0, 1, 3": ranks for messages.
std::string rank_list(const std::vector<int>& ranks);

// What a rank brings.
struct AgreeEntry {
  int rank = -1;
  bool flag = true;
  uint64_t completed = 0;  // collectives completed on the communicator
  uint64_t digest = 0;     // of arguments every survivor must pass alike
  std::string extra;       // opaque (shrink: the addresses of the new communicator's listeners)
  bool operator==(const AgreeEntry&) const = default;
};

struct AgreeDecision {
  std::vector<AgreeEntry> survivors;  // by rank, ascending
  bool flag() const;                  // the AND of the survivors' flags
  std::vector<int> ranks() const;
  bool has(int rank) const;
};

class FloodAgreement {
 public:
  struct Send {
    int peer;
    std::string bytes;
  };
  // candidates[q]: rank q takes part (the others are excluded by the caller from the start and
  // told so if they speak up).
  FloodAgreement(int rank, int size, uint32_t epoch, std::vector<bool> candidates, AgreeEntry mine);

  std::vector<Send> start();
  // A message from `from`, of this agreement's epoch (epoch_of() says which). Throws Error when
  // a peer refused (bad input on its side) or excluded this rank.
  std::vector<Send> on_message(int from, std::string_view bytes);
  // `peer` failed (or stopped answering): `why` says how, for messages.
  std::vector<Send> on_lost(int peer, const std::string& why);
  // Tells every candidate that this rank refuses (its own arguments were bad): they fail with
  // `reason`, naming this rank, at once instead of at their deadline.
  std::vector<Send> refuse(const std::string& reason) const;
  // After on_message threw a refusal or an exclusion: passes it on to the candidates still
  // waiting for this rank (those that excluded it ignore it), naming where it began.
  std::vector<Send> pass_refusal_on() const;

  bool decided() const { return decision_.has_value(); }
  const AgreeDecision& decision() const { return *decision_; }
  // The ranks this rank still waits for in its current round.
  std::vector<int> waiting_for() const;
  // Ranks taken as failed, and why ("refused the connection").
  const std::map<int, std::string>& failures() const { return failed_; }
  int rank() const { return rank_; }
  int round() const { return round_; }
  uint32_t epoch() const { return epoch_; }

  bool candidate(int rank) const {
    return rank >= 0 && rank < size_ && candidate_[static_cast<size_t>(rank)];
  }

  // The epoch a message belongs to (nullopt: unreadable).
  static std::optional<uint32_t> epoch_of(std::string_view bytes);
  // The message that tells a rank this one goes on without it (`reason`: why), in its epoch.
  static std::string excluded(uint32_t epoch, const std::string& reason);
  static bool is_exclusion(std::string_view bytes);

 private:
  std::vector<Send> next_round();
  std::vector<Send> check();
  std::vector<Send> decide(const std::vector<int>& alive);
  std::vector<int> alive() const;
  std::string round_message() const;
  void fail(int peer, const std::string& why);
  std::vector<Send> refuse_as(int origin, const std::string& reason) const;

  int rank_, size_;
  uint32_t epoch_;
  std::vector<bool> candidate_;
  AgreeEntry mine_;
  std::map<int, std::string> failed_;
  int round_ = 0;
  std::map<int, std::vector<bool>> heard_;  // by round: who sent it
  std::map<int, AgreeEntry> entries_;       // by rank: what it brings
  std::vector<int> last_heard_;             // whom the previous round's messages came from
  std::optional<AgreeDecision> decision_;
  int refusal_origin_ = -1;  // the refusal on_message threw, to pass on
  std::string refusal_;
};

// A communicator's control plane with what arrived for later agreements (a faster rank may
// already be in the next one).
struct ControlChannel {
  explicit ControlChannel(transport::ControlPlane::Options o) : plane(std::move(o)) {}
  transport::ControlPlane plane;
  std::deque<transport::ControlPlane::Event> held;
  // Agreements begun so far (each takes one number, whatever its outcome, on every rank that
  // takes part; a refusal too): the same on every survivor.
  uint32_t epoch = 0;
  // Peers lost so far, and how: the plane reports a loss once, and every later agreement must
  // start from it.
  std::map<int, std::string> lost;
  // Looks at the plane without waiting: losses are noted (and returned), messages held for the
  // next agreement.
  std::vector<int> poll_losses();
};

// Runs one agreement to its decision over `channel`: a rank silent until `deadline` is taken as
// failed (the agreement then goes on with the others, for up to `grace` more). Throws the
// refusals and exclusions as on_message does, and TimeoutError (naming who was waited for) if
// it cannot decide by then. `describe` names the call for errors ("shrink", "agree").
AgreeDecision run_agreement(ControlChannel& channel, FloodAgreement& agreement,
                            core::Deadline deadline, std::chrono::milliseconds grace);

}  // namespace ringreduce::detail
