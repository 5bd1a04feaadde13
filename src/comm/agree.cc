#include "comm/agree.h"

#include <algorithm>
#include <cstring>

#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {
namespace {

// Messages: a type byte, the epoch, then the type's fields. All ranks share one architecture
// (transport/tcp/wire.h), so integers go as they are.
enum : uint8_t {
  kRound = 1,     // round, the sender's entry
  kDecided = 2,   // the survivors' entries
  kRefused = 3,   // the reason
  kExcluded = 4,  // the reason
};

class Writer {
 public:
  explicit Writer(uint8_t type, uint32_t epoch) {
    put(type);
    put(epoch);
  }
  template <class T>
  void put(T v) {
    s_.append(reinterpret_cast<const char*>(&v), sizeof v);
  }
  void str(const std::string& v) {
    put(static_cast<uint32_t>(v.size()));
    s_ += v;
  }
  void entry(const AgreeEntry& e) {
    put(static_cast<int32_t>(e.rank));
    put(static_cast<uint8_t>(e.flag ? 1 : 0));
    put(e.completed);
    put(e.digest);
    str(e.extra);
  }
  std::string take() { return std::move(s_); }

 private:
  std::string s_;
};

class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  template <class T>
  T get() {
    T v{};
    if (s_.size() - off_ < sizeof v) throw Error("agreement: a truncated message");
    std::memcpy(&v, s_.data() + off_, sizeof v);
    off_ += sizeof v;
    return v;
  }
  std::string str() {
    const auto n = get<uint32_t>();
    if (s_.size() - off_ < n) throw Error("agreement: a truncated message");
    std::string v(s_.substr(off_, n));
    off_ += n;
    return v;
  }
  AgreeEntry entry() {
    AgreeEntry e;
    e.rank = get<int32_t>();
    e.flag = get<uint8_t>() != 0;
    e.completed = get<uint64_t>();
    e.digest = get<uint64_t>();
    e.extra = str();
    return e;
  }

 private:
  std::string_view s_;
  size_t off_ = 0;
};

}  // namespace

std::string rank_list(const std::vector<int>& ranks) {
  std::string s;
  for (int r : ranks) s += (s.empty() ? "" : ", ") + std::to_string(r);
  return s;
}

bool AgreeDecision::flag() const {
  return std::all_of(survivors.begin(), survivors.end(),
                     [](const AgreeEntry& e) { return e.flag; });
}

std::vector<int> AgreeDecision::ranks() const {
  std::vector<int> r;
  for (const auto& e : survivors) r.push_back(e.rank);
  return r;
}

bool AgreeDecision::has(int rank) const {
  return std::any_of(survivors.begin(), survivors.end(),
                     [rank](const AgreeEntry& e) { return e.rank == rank; });
}

FloodAgreement::FloodAgreement(int rank, int size, uint32_t epoch, std::vector<bool> candidates,
                               AgreeEntry mine)
    : rank_(rank),
      size_(size),
      epoch_(epoch),
      candidate_(std::move(candidates)),
      mine_(std::move(mine)) {
  candidate_.resize(static_cast<size_t>(size_), false);
  candidate_[static_cast<size_t>(rank_)] = true;
  mine_.rank = rank_;
  entries_[rank_] = mine_;
}

std::optional<uint32_t> FloodAgreement::epoch_of(std::string_view bytes) {
  if (bytes.size() < 1 + sizeof(uint32_t)) return std::nullopt;
  uint32_t e;
  std::memcpy(&e, bytes.data() + 1, sizeof e);
  return e;
}

std::vector<int> FloodAgreement::alive() const {
  std::vector<int> a;
  for (int q = 0; q < size_; ++q)
    if (candidate_[static_cast<size_t>(q)] && !failed_.contains(q)) a.push_back(q);
  return a;
}

std::string FloodAgreement::round_message() const {
  Writer w(kRound, epoch_);
  w.put(static_cast<int32_t>(round_));
  w.entry(mine_);
  return w.take();
}

std::vector<FloodAgreement::Send> FloodAgreement::start() {
  return next_round();
}

std::vector<FloodAgreement::Send> FloodAgreement::next_round() {
  ++round_;
  std::vector<Send> out;
  const std::string msg = round_message();
  for (int q : alive())
    if (q != rank_) out.push_back({q, msg});
  auto more = check();  // messages of this round may be here already
  out.insert(out.end(), std::make_move_iterator(more.begin()), std::make_move_iterator(more.end()));
  return out;
}

std::vector<int> FloodAgreement::waiting_for() const {
  std::vector<int> w;
  if (decided()) return w;
  auto it = heard_.find(round_);
  for (int q : alive())
    if (q != rank_ && (it == heard_.end() || !it->second[static_cast<size_t>(q)])) w.push_back(q);
  return w;
}

void FloodAgreement::fail(int peer, const std::string& why) {
  if (peer == rank_ || peer < 0 || peer >= size_ || !candidate_[static_cast<size_t>(peer)]) return;
  if (failed_.emplace(peer, why).second)
    RR_LOG(info, ft, rank_, "agreement ", epoch_, " round ", round_, ": rank ", peer, " ", why);
}

std::vector<FloodAgreement::Send> FloodAgreement::check() {
  if (decided() || !waiting_for().empty()) return {};
  // Who this round's messages came from (the book's receivedfrom): not who is alive now, since a
  // rank may have sent its message and failed since, and another survivor counts it.
  std::vector<int> heard;
  auto it = heard_.find(round_);
  for (int q = 0; q < size_; ++q)
    if (q == rank_ || (it != heard_.end() && it->second[static_cast<size_t>(q)]))
      heard.push_back(q);
  if (round_ >= 2 && heard == last_heard_) return decide(heard);
  last_heard_ = heard;
  return next_round();
}

std::vector<FloodAgreement::Send> FloodAgreement::decide(const std::vector<int>& alive) {
  AgreeDecision d;
  for (int q : alive) d.survivors.push_back(entries_.at(q));
  decision_ = std::move(d);
  RR_LOG(info, ft, rank_, "agreement ", epoch_, " decided in round ", round_, ": ranks ",
         rank_list(decision_->ranks()));
  Writer w(kDecided, epoch_);
  w.put(static_cast<uint32_t>(decision_->survivors.size()));
  for (const auto& e : decision_->survivors) w.entry(e);
  const std::string msg = w.take();
  std::vector<Send> out;
  for (int q : alive)
    if (q != rank_) out.push_back({q, msg});
  return out;
}

std::vector<FloodAgreement::Send> FloodAgreement::on_message(int from, std::string_view bytes) {
  Reader r(bytes);
  const auto type = r.get<uint8_t>();
  r.get<uint32_t>();  // the epoch: the caller's business
  if (type == kRefused) {
    // Said by `origin`, maybe passed on by `from`.
    refusal_origin_ = r.get<int32_t>();
    refusal_ = r.str();
    throw InvalidArgument("rank " + std::to_string(refusal_origin_) + " refused: " + refusal_);
  }
  if (type == kExcluded) {
    const std::string why = r.str();
    refusal_origin_ = rank_;
    refusal_ = "rank " + std::to_string(from) + " goes on without it: " + why;
    throw Error("rank " + std::to_string(from) + " goes on without this rank: " + why,
                ErrorCode::aborted);
  }
  if (from < 0 || from >= size_ || decided()) return {};
  if (type == kDecided) {
    AgreeDecision d;
    const auto n = r.get<uint32_t>();
    if (n > static_cast<uint32_t>(size_)) throw Error("agreement: an unreadable decision");
    for (uint32_t i = 0; i < n; ++i) d.survivors.push_back(r.entry());
    decision_ = std::move(d);
    RR_LOG(info, ft, rank_, "agreement ", epoch_, ": adopted the decision of rank ", from,
           ": ranks ", rank_list(decision_->ranks()));
    // Passed on before returning: the decider may have died before telling everyone.
    std::vector<Send> out;
    std::string msg(bytes);
    for (int q : decision_->ranks())
      if (q != rank_ && q != from) out.push_back({q, msg});
    return out;
  }
  if (type != kRound) throw Error("agreement: a message of unknown type " + std::to_string(type));
  if (failed_.contains(from)) {
    // Given up on (it was silent until the deadline): its word no longer counts, and it must
    // not go on alone believing the others dead.
    return {{from, excluded(epoch_, "it was taken as failed: " + failed_.at(from))}};
  }
  const int round = r.get<int32_t>();
  AgreeEntry e = r.entry();
  e.rank = from;
  entries_[from] = std::move(e);
  auto& heard = heard_[round];
  heard.resize(static_cast<size_t>(size_), false);
  heard[static_cast<size_t>(from)] = true;
  return check();
}

bool FloodAgreement::is_exclusion(std::string_view bytes) {
  return !bytes.empty() && static_cast<uint8_t>(bytes[0]) == kExcluded;
}

std::string FloodAgreement::excluded(uint32_t epoch, const std::string& reason) {
  Writer w(kExcluded, epoch);
  w.str(reason);
  return w.take();
}

std::vector<FloodAgreement::Send> FloodAgreement::on_lost(int peer, const std::string& why) {
  if (decided()) return {};
  fail(peer, why);
  return check();
}

std::vector<FloodAgreement::Send> FloodAgreement::refuse(const std::string& reason) const {
  return refuse_as(rank_, reason);
}

std::vector<FloodAgreement::Send> FloodAgreement::pass_refusal_on() const {
  return refuse_as(refusal_origin_, refusal_);
}

std::vector<FloodAgreement::Send> FloodAgreement::refuse_as(int origin,
                                                            const std::string& reason) const {
  Writer w(kRefused, epoch_);
  w.put(static_cast<int32_t>(origin));
  w.str(reason);
  const std::string msg = w.take();
  std::vector<Send> out;
  for (int q : alive())
    if (q != rank_) out.push_back({q, msg});
  return out;
}

AgreeDecision run_agreement(ControlChannel& channel, FloodAgreement& agreement,
                            core::Deadline deadline, std::chrono::milliseconds grace) {
  auto send_all = [&](std::vector<FloodAgreement::Send> sends) {
    for (auto& s : sends) channel.plane.send(s.peer, std::move(s.bytes));
  };
  const uint32_t epoch = agreement.epoch();
  channel.epoch = epoch + 1;
  auto handle = [&](transport::ControlPlane::Event& ev) {
    if (ev.kind == transport::ControlPlane::Event::Kind::lost) {
      channel.lost.emplace(ev.peer, ev.why);
      send_all(agreement.on_lost(ev.peer, ev.why));
      return;
    }
    const auto e = FloodAgreement::epoch_of(ev.bytes);
    if (!e) return;
    if (FloodAgreement::is_exclusion(ev.bytes)) {
      // Final, whatever agreement it was sent in: the others went on without this rank.
      send_all(agreement.on_message(ev.peer, ev.bytes));
      return;
    }
    if (!agreement.candidate(ev.peer)) {
      // A rank this one excluded from the start, whatever agreement it thinks it is in: told
      // (in its own epoch), so that it fails now rather than at its deadline.
      channel.plane.send(ev.peer,
                         FloodAgreement::excluded(*e, "it is in the ranks this rank excludes"));
      return;
    }
    if (*e < epoch) return;  // an earlier agreement's late words
    if (*e > epoch) {
      channel.held.push_back(std::move(ev));  // a faster rank is in the next one already
      return;
    }
    try {
      send_all(agreement.on_message(ev.peer, ev.bytes));
    } catch (const Error&) {
      // Refused or excluded: the ranks still waiting for this one fail now too, rather than
      // at their deadline (those that excluded this rank ignore it).
      send_all(agreement.pass_refusal_on());
      channel.plane.flush_all(core::Deadline::after(std::chrono::milliseconds(1000)));
      throw;
    }
  };
  send_all(agreement.start());
  for (const auto& [q, why] : channel.lost) send_all(agreement.on_lost(q, why));
  // What arrived for this agreement while the last one ran.
  std::deque<transport::ControlPlane::Event> held;
  held.swap(channel.held);
  for (auto& ev : held)
    if (!agreement.decided()) handle(ev);
  bool extended = false;
  while (!agreement.decided()) {
    auto ev = channel.plane.next(deadline);
    if (ev) {
      handle(*ev);
      continue;
    }
    const std::vector<int> silent = agreement.waiting_for();
    if (extended || silent.empty()) {
      std::string who;
      for (int q : silent) who += (who.empty() ? "" : ", ") + std::to_string(q);
      throw TimeoutError("the agreement timed out waiting for rank" +
                         std::string(silent.size() > 1 ? "s " : " ") + who);
    }
    // Silent for the whole deadline: taken as failed, as an op's timeout would; the others
    // finish without them.
    extended = true;
    deadline = core::Deadline::after(grace);
    for (int q : silent) {
      // Said at warn level: a live rank taken as silent is a failure of the control plane, and
      // its connections' state is what tells why.
      RR_LOG(warn, ft, agreement.rank(), "agreement ", epoch, " round ", agreement.round(),
             ": rank ", q, " did not answer before the deadline: ", channel.plane.state_text(q));
      channel.lost.emplace(q, "did not answer before the deadline");
      send_all(agreement.on_lost(q, "did not answer before the deadline"));
    }
  }
  // The decision and its relays leave before this returns: the caller may close the plane soon
  // after (a survivor that never hears them learns the decision from another's relay).
  channel.plane.flush_all(core::Deadline::after(std::min(grace, std::chrono::milliseconds(1000))));
  return agreement.decision();
}

std::vector<int> ControlChannel::poll_losses() {
  std::vector<int> lost_now;
  while (auto ev = plane.next(core::Deadline::after(std::chrono::milliseconds(0)))) {
    if (ev->kind == transport::ControlPlane::Event::Kind::lost) {
      lost.emplace(ev->peer, ev->why);
      lost_now.push_back(ev->peer);
    } else {
      held.push_back(std::move(*ev));
    }
  }
  return lost_now;
}

}  // namespace ringreduce::detail
