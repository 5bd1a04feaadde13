// Keeping a job alive when ranks die: agree() and shrink() (docs/RELIABILITY.md, "When a rank
// dies"). Both run among the ranks still alive over the control plane (transport/control.h),
// never through the store.
//
// shrink(), per attempt:
//   1. every survivor opens the listeners of the communicator to come and agrees (agree.h) on
//      who is left, each bringing those listeners' addresses and the exclude list it was given;
//   2. each builds the new communicator from the decision: a fresh id derived from it, the
//      members' hosts (the parent's), their listeners, the parent's link costs: no join, no
//      store, no probe;
//   3. a second agreement commits: the AND of "built it" over the members. A member that died
//      after the first agreement (or while the links were made: its control connection closes,
//      which the links' start-up waits look at) makes the commit fail on every survivor alike,
//      and the attempt is repeated without it. Without the commit, one survivor could return a
//      communicator another had given up on.
// Then the parent is aborted, so that an excluded rank still calling it fails at once, naming
// the shrink, and so that nobody mixes the two.
#include <algorithm>

#include "comm/agree.h"
#include "comm/comm_impl.h"
#include "comm/errors.h"
#include "core/log.h"
#include "ringreduce/error.h"
#include "transport/table.h"

namespace ringreduce::detail {
namespace {

uint64_t mix_u64(uint64_t h, uint64_t v) {
  for (int i = 0; i < 8; ++i) h = (h ^ ((v >> (8 * i)) & 0xff)) * 0x100000001b3ull;
  return h;
}

// What a shrink's entry carries (AgreeEntry::extra): the new listeners' addresses, then the
// exclude list as the caller passed it (sorted), for the message if the survivors' lists differ.
std::string shrink_extra(const std::string& published, const std::string& exclude_text) {
  return published + "\n" + exclude_text;
}
std::string extra_published(const std::string& extra) {
  return extra.substr(0, extra.find('\n'));
}
std::string extra_exclude(const std::string& extra) {
  const size_t nl = extra.find('\n');
  return nl == std::string::npos ? "" : extra.substr(nl + 1);
}

}  // namespace

Agreement CommImpl::agree(bool flag, const CallOptions& call) {
  const std::string me = "rank " + std::to_string(rank_) + ": agree";
  const auto timeout = call.timeout.value_or(timeout_.load());
  Agreement out;
  out.flag = flag;
  out.completed_min = out.completed_max = completed_.load();
  if (!control_) return out;  // alone
  std::lock_guard<std::mutex> one_at_a_time(ft_mu_);
  AgreeEntry mine;
  mine.flag = flag;
  mine.completed = out.completed_min;
  FloodAgreement a(rank_, size_, control_->epoch,
                   std::vector<bool>(static_cast<size_t>(size_), true), mine);
  AgreeDecision d;
  try {
    d = run_agreement(*control_, a, core::Deadline::after(timeout), timeout);
  } catch (const Error& e) {
    std::rethrow_exception(with_prefix(e, me + ": ", ""));
  }
  if (!d.has(rank_))
    throw Error(me + ": the other ranks went on without this rank", ErrorCode::aborted);
  out.flag = d.flag();
  for (int q = 0; q < size_; ++q)
    if (!d.has(q)) out.failed.push_back(q);
  for (const auto& e : d.survivors) {
    out.completed_min = std::min(out.completed_min, e.completed);
    out.completed_max = std::max(out.completed_max, e.completed);
  }
  return out;
}

std::string CommImpl::shrink_refusal(std::span<const int> exclude, ShrinkFlags flags,
                                     std::vector<bool>* excluded) {
  excluded->assign(static_cast<size_t>(size_), false);
  for (int q : exclude) {
    if (q < 0 || q >= size_)
      return "exclude names rank " + std::to_string(q) +
             ", which is not a rank of this communicator (0.." + std::to_string(size_ - 1) + ")";
    if ((*excluded)[static_cast<size_t>(q)])
      return "exclude names rank " + std::to_string(q) + " twice";
    (*excluded)[static_cast<size_t>(q)] = true;
  }
  if (flags != ShrinkFlags::none && flags != ShrinkFlags::abort)
    return "unknown flags " + std::to_string(static_cast<int>(flags)) +
           " (ShrinkFlags::none or ShrinkFlags::abort)";
  // Outstanding ops of an aborted communicator are failing already and touch no buffer any
  // more; of a healthy one, they may be running with the peers: NCCL's default shrink deadlocks
  // there, this one says so.
  std::lock_guard<std::mutex> lk(mu_);
  const size_t pending = queue_.size() + p2p_ops_.size();
  if (flags == ShrinkFlags::none && pending > 0 && !aborted_.load())
    return std::to_string(pending) + " op(s) of this rank are outstanding (" +
           (queue_.empty() ? std::string("a send or receive") : describe(queue_.front()->tag)) +
           "): wait for them first, or shrink with the abort flag";
  return "";
}

std::unique_ptr<CommImpl> CommImpl::shrink(std::span<const int> exclude, ShrinkFlags flags,
                                           const CallOptions& call) {
  const std::string me = "rank " + std::to_string(rank_) + ": shrink";
  const auto timeout = call.timeout.value_or(timeout_.load());
  const auto deadline = core::Deadline::after(timeout);
  const auto started = core::Clock::now();
  std::lock_guard<std::mutex> one_at_a_time(ft_mu_);
  std::vector<bool> excluded;
  const std::string bad = shrink_refusal(exclude, flags, &excluded);
  std::vector<int> sorted(exclude.begin(), exclude.end());
  std::sort(sorted.begin(), sorted.end());
  const std::string exclude_text = "[" + rank_list(sorted) + "]";
  if (bad.empty() && excluded[static_cast<size_t>(rank_)])
    // Said to this rank alone: the others go on without it, as they were asked to.
    throw InvalidArgument(me + ": this rank is in exclude " + exclude_text +
                          ": only the ranks that remain call shrink");
  if (!bad.empty()) {
    // Every survivor fails at once, naming this rank, rather than at its deadline.
    if (control_) {
      std::vector<bool> candidates(static_cast<size_t>(size_), true);
      for (int q : exclude)
        if (q >= 0 && q < size_) candidates[static_cast<size_t>(q)] = false;
      FloodAgreement a(rank_, size_, control_->epoch++, candidates, AgreeEntry{});
      for (auto& s : a.refuse(me + ": " + bad)) control_->plane.send(s.peer, std::move(s.bytes));
      control_->plane.flush_all(core::Deadline::after(std::chrono::milliseconds(1000)));
    }
    throw InvalidArgument(me + ": " + bad);
  }
  if (flags == ShrinkFlags::abort) abort("shrink with the abort flag");
  for (int attempt = 1;; ++attempt) {
    std::unique_ptr<CommImpl> child;
    try {
      child = shrink_attempt(excluded, exclude_text, deadline, timeout);
    } catch (const Error& e) {
      std::rethrow_exception(with_prefix(e, me + ": ", ""));
    }
    if (child) {
      std::vector<int> gone;
      for (int q = 0; q < size_; ++q)
        if (std::find(child->parent_ranks_.begin(), child->parent_ranks_.end(), q) ==
            child->parent_ranks_.end())
          gone.push_back(q);
      const std::string what = "shrunk to ranks " + rank_list(child->parent_ranks_) +
                               (gone.empty() ? "" : " (without " + rank_list(gone) + ")");
      RR_LOG(info, ft, rank_, what, " in ",
             static_cast<int64_t>(core::seconds_since(started) * 1e3), " ms, attempt ", attempt,
             "; now rank ", child->rank_, " of ", child->size_);
      abort("this communicator was " + what + " by shrink");
      // The ranks left out that may still be alive (excluded by the caller, or silent) learn it
      // in their next agreement, whatever its number: none goes on alone believing the others
      // dead when they merely left.
      if (control_) {
        for (int q : gone)
          control_->plane.send(q, FloodAgreement::excluded(0, "the ranks that remain, " +
                                                                  rank_list(child->parent_ranks_) +
                                                                  ", shrank without it"));
        control_->plane.flush_all(core::Deadline::after(std::chrono::milliseconds(1000)));
      }
      return child;
    }
    if (deadline.expired())
      throw TimeoutError(me + ": ranks kept failing while the survivors made their communicator (" +
                         std::to_string(attempt) + " attempts)");
  }
}

std::unique_ptr<CommImpl> CommImpl::shrink_attempt(const std::vector<bool>& excluded,
                                                   const std::string& exclude_text,
                                                   const core::Deadline& deadline,
                                                   std::chrono::milliseconds timeout) {
  // Alone there is nobody to agree with: a communicator of this rank.
  transport::Listeners listeners(config_, config_.str("RINGREDUCE_TOKEN"), store_host_);
  AgreeDecision d;
  uint32_t epoch = 0;
  if (control_) {
    AgreeEntry mine;
    mine.completed = completed_.load();
    mine.digest = mix_u64(0xcbf29ce484222325ull, std::hash<std::string>{}(exclude_text));
    mine.extra = shrink_extra(listeners.published(), exclude_text);
    std::vector<bool> candidates(excluded.size());
    for (size_t q = 0; q < excluded.size(); ++q) candidates[q] = !excluded[q];
    epoch = control_->epoch;
    FloodAgreement a(rank_, size_, epoch, candidates, mine);
    d = run_agreement(*control_, a, deadline, timeout);
  } else {
    AgreeEntry mine;
    mine.rank = rank_;
    mine.extra = shrink_extra(listeners.published(), exclude_text);
    d.survivors.push_back(mine);
  }
  if (!d.has(rank_)) throw Error("the other ranks went on without this rank", ErrorCode::aborted);
  // Every survivor sees the same decision, so every one raises this alike.
  std::string lists;
  bool differ = false;
  for (const auto& e : d.survivors) {
    differ |= extra_exclude(e.extra) != exclude_text;
    lists += (lists.empty() ? "" : ", ") + std::string("rank ") + std::to_string(e.rank) + " " +
             extra_exclude(e.extra);
  }
  if (differ)
    throw InvalidArgument("the survivors passed different exclude lists: " + lists +
                          " (every survivor must pass the same)");
  const std::vector<int> members = d.ranks();
  uint64_t lo = UINT64_MAX, hi = 0;
  for (const auto& e : d.survivors) lo = std::min(lo, e.completed), hi = std::max(hi, e.completed);
  if (lo != hi)
    RR_LOG(warn, ft, rank_, "shrink: the survivors completed different calls before the failure: ",
           "the last collective completed is #", lo, " on some and #", hi,
           " on others (Communicator::agree tells a program which, to redo or roll back alike)");
  Membership sf;
  uint64_t id = mix_u64(mix_u64(0xcbf29ce484222325ull, comm_id_), epoch);
  for (int q : members) id = mix_u64(id, static_cast<uint64_t>(q));
  sf.comm_id = id;
  for (const auto& e : d.survivors) {
    sf.hosts.push_back(hosts_.at(static_cast<size_t>(e.rank)));
    sf.published.push_back(extra_published(e.extra));
  }
  sf.listeners = &listeners;
  if (!cost_kind_.empty()) {
    sf.costs = tuner_->costs();
    sf.cost_kind = cost_kind_;
  }
  sf.parent_ranks = members;
  // Looked at by the links' start-up waits; the kinds keep it (a TCP receive waiting for its
  // connection looks again later), so it goes dark once the communicator is made, when the
  // parent and this decision may be gone.
  struct Watch {
    ControlChannel* channel = nullptr;
    std::vector<int> members;
    bool active = true;
  };
  auto watch = std::make_shared<Watch>();
  watch->channel = control_.get();
  watch->members = members;
  sf.check_failed = [watch] {
    if (!watch->active || !watch->channel) return;
    watch->channel->poll_losses();  // takes in what has arrived since the last look
    // Every loss of a member counts, not only those that arrive during the wait: the agreement
    // decides on the ranks heard in its last round, so a member that died just after its last
    // message may have been recorded lost by the agreement itself, before this wait began. Only
    // new losses were looked at before, and a host's first rank then waited for that member's
    // shared-memory hello until the deadline while the others committed without it (the
    // launch.shrink-mix flake: "rank 0 did not answer before the deadline").
    for (int q : watch->members)
      if (auto it = watch->channel->lost.find(q); it != watch->channel->lost.end())
        throw PeerError("rank " + std::to_string(q) + " " + it->second +
                            " while the survivors made their links",
                        q);
  };
  SplitFrom from{store_, stall_store_, store_host_, local_size_, store_server_, &sf, job_store_};
  Options o;
  o.rank = static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  o.world_size = static_cast<int>(members.size());
  o.timeout = timeout_.load();
  o.settings = overrides_;
  o.store_prefix = "shrink" + std::to_string(epoch);
  std::unique_ptr<CommImpl> child;
  std::string why;
  try {
    child = std::make_unique<CommImpl>(o, &from);
    watch->active = false;
  } catch (const std::exception& e) {
    watch->active = false;
    why = e.what();
    RR_LOG(info, ft, rank_, "shrink: making the communicator of ranks ", rank_list(members),
           " failed: ", why);
  }
  if (!control_) return child;
  // The commit: only if every member has it does any return it.
  AgreeEntry built;
  built.flag = child != nullptr;
  std::vector<bool> in_it(static_cast<size_t>(size_), false);
  for (int q : members) in_it[static_cast<size_t>(q)] = true;
  FloodAgreement commit(rank_, size_, control_->epoch, in_it, built);
  // The commit gets a window of its own even when the first agreement or the links used up the
  // call's deadline: with none left, members alive and answering would be taken for dead before
  // their first word was read, and every survivor would fail the shrink (seen once under ASan
  // in CI: "ranks kept failing ... (1 attempts)" after a slow first phase).
  const auto floor = std::min(timeout, std::chrono::milliseconds(2000));
  const auto commit_deadline =
      deadline.remaining_ms() < floor.count() ? core::Deadline::after(floor) : deadline;
  const AgreeDecision c = run_agreement(*control_, commit, commit_deadline, timeout);
  if (c.flag() && c.ranks() == members) return child;
  if (c.ranks() == members)
    // Nobody died: what failed will fail again. Every survivor raises, the one that failed
    // with its cause.
    throw Error(why.empty() ? "a survivor could not make the new communicator (its error says why)"
                            : "making the new communicator failed: " + why);
  RR_LOG(info, ft, rank_, "shrink: the communicator of ranks ", rank_list(members),
         " was not made everywhere (committed by ranks ", rank_list(c.ranks()),
         c.flag() ? "" : ", not all of which made it", "): again without the ranks lost");
  return nullptr;
}

}  // namespace ringreduce::detail
