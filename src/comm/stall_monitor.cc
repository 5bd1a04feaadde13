#include "comm/stall_monitor.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/log.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {

using std::chrono::milliseconds;

// A rank must have said where it is well before anyone reports on it. A second is long for a
// collective that is not stuck, and rare enough that the store never notices, while each core has
// a few ranks. With more, every step of an op waits for its partner's turn on the core (a slice of
// a few ms per rank sharing it), and a second is what an ordinary op takes: at 256 ranks on two
// cores every rank published for every op of a second, and the store's thread, one runnable
// thread among hundreds, left requests unanswered past the monitors' 5 s timeout ("stall reports
// are unavailable" on dozens of ranks). So one second per 16 ranks sharing a core, and at most
// half of RINGREDUCE_STALL_WARN (30 s by default), so that a rank has spoken before the reports.
static milliseconds publish_delay(milliseconds warn_after, int crowding) {
  const milliseconds base = milliseconds(1000) * std::max(1, (crowding + 15) / 16);
  return warn_after.count() > 0 ? std::min(base, warn_after / 2) : base;
}

StallMonitor::StallMonitor(int rank, int size, milliseconds warn_after, Hooks hooks, int crowding)
    : rank_(rank),
      size_(size),
      warn_after_(warn_after),
      publish_after_(publish_delay(warn_after, crowding)),
      // A quarter of that: a mismatch that only the store can show takes about 1.5 publish delays
      // to find (1.5 s where cores are to spare).
      tick_(std::max(milliseconds(10), publish_after_ / 4)),
      hooks_(std::move(hooks)) {
  thread_ = std::thread([this] { loop(); });
}

StallMonitor::~StallMonitor() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void StallMonitor::op_failed(const transport::OpTag& tag, bool timed_out, std::string how) {
  if (!timed_out && warned_seq_.load(std::memory_order_relaxed) != tag.seq) return;
  {
    std::lock_guard<std::mutex> lk(mu_);
    pending_failure_ = true;
    failed_tag_ = tag;
    failed_how_ = std::move(how);
  }
  cv_.notify_all();
}

transport::OpTag StallMonitor::unpack(uint64_t seq, uint64_t count, uint64_t meta) {
  transport::OpTag t;
  t.seq = seq;
  t.count = count;
  t.root = static_cast<int32_t>(static_cast<uint32_t>(meta));
  t.kind = static_cast<uint8_t>(meta >> 32);
  t.dtype = static_cast<uint8_t>(meta >> 40);
  t.op = static_cast<uint8_t>(meta >> 48);
  return t;
}

void StallMonitor::loop() {
  uint64_t watched = 0;  // the op being timed, and for how many ticks it has been seen running
  int64_t ticks = 0;
  bool published = false, warned = false, mismatched = false;
  bool compared = false;  // with the first rank to report the watched op
  std::unique_lock<std::mutex> lk(mu_);
  // Bounded: every pass waits a tick or returns on stop_.
  while (!stop_) {
    cv_.wait_for(lk, tick_, [&] { return stop_ || pending_failure_; });
    if (stop_) return;
    if (pending_failure_) {
      pending_failure_ = false;
      const transport::OpTag tag = failed_tag_;
      const std::string how = failed_how_;
      lk.unlock();
      report(tag, how);
      lk.lock();
      continue;
    }
    // A seqlock read: the op's description is consistent if its number did not change meanwhile.
    const uint64_t seq = seq_.load(std::memory_order_acquire);
    const uint64_t count = count_.load(std::memory_order_relaxed);
    const uint64_t meta = meta_.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (seq == 0 || seq != seq_.load(std::memory_order_relaxed) || seq != watched) {
      watched = seq;
      ticks = 0;
      published = warned = mismatched = false;
      continue;
    }
    // Seen running at two samples `ticks` apart: it has waited at least that long.
    ++ticks;
    const milliseconds waited = tick_ * ticks;
    if (waited < publish_after_) continue;
    lk.unlock();
    const transport::OpTag tag = unpack(seq, count, meta);
    if (!published) {
      publish(tag);
      published = true;
      compared = false;
    }
    // Once per publish_after: a few store requests per rank, however many ranks there are.
    if (!mismatched && (ticks - 1) % 4 == 0 && hooks_.mismatch)
      mismatched = compare(tag, &compared);
    if (!warned && warn_after_.count() > 0 && waited >= warn_after_) {
      warned_seq_.store(seq, std::memory_order_relaxed);
      std::ostringstream how;
      how << "has waited " << static_cast<double>(waited.count()) / 1000.0 << " s";
      report(unpack(seq, count, meta), how.str());
      warned = true;
    }
    lk.lock();
  }
}

Store* StallMonitor::store() {
  if (store_failed_) return nullptr;
  if (!store_) {
    try {
      store_ = hooks_.store();
    } catch (const std::exception& e) {
      store_failed_ = true;
      RR_LOG(warn, stall, rank_, "stall reports are unavailable: ", e.what());
      return nullptr;
    }
  }
  return store_.get();
}

void StallMonitor::publish(const transport::OpTag& tag) {
  Store* s = store();
  if (!s) return;
  try {
    const std::string v =
        std::to_string(tag.seq) + " " + std::to_string(tag.count) + " " + std::to_string(pack(tag));
    s->set("stall/" + std::to_string(rank_), std::vector<uint8_t>(v.begin(), v.end()));
    // The first rank to report this op leaves its call for the others to compare with.
    const std::string op = "stallop/" + std::to_string(tag.seq) + "/";
    if (s->add(op + "n", 1) == 1) {
      const std::string first = v + " " + std::to_string(rank_);
      s->set(op + "first", std::vector<uint8_t>(first.begin(), first.end()));
    }
  } catch (const std::exception& e) {
    store_failed_ = true;
    RR_LOG(warn, stall, rank_, "stall reports are unavailable: ", e.what());
  }
}

transport::OpTag StallMonitor::word_of(Store& s, int q) {
  const std::string key = "stall/" + std::to_string(q);
  transport::OpTag t;
  t.seq = 0;
  if (!s.check({key})) return t;
  const std::vector<uint8_t> v = s.get(key, milliseconds(0));
  unsigned long long seq = 0, count = 0, meta = 0;
  // Written by our own kind, but read defensively: anything unreadable counts as no word.
  if (std::sscanf(std::string(v.begin(), v.end()).c_str(), "%llu %llu %llu", &seq, &count, &meta) !=
      3)
    return t;
  return unpack(seq, count, meta);
}

bool StallMonitor::compare(const transport::OpTag& mine, bool* compared) {
  Store* s = store();
  if (!s) return false;
  const std::string op = "stallop/" + std::to_string(mine.seq) + "/";
  try {
    // Another rank found a mismatch in this op: the same verdict here.
    if (s->check({op + "mismatch"})) {
      const std::vector<uint8_t> v = s->get(op + "mismatch", milliseconds(0));
      hooks_.mismatch(std::string(v.begin(), v.end()));
      return true;
    }
    if (*compared || !s->check({op + "first"})) return false;
    *compared = true;
    const std::vector<uint8_t> v = s->get(op + "first", milliseconds(0));
    unsigned long long seq = 0, count = 0, meta = 0;
    int first = -1;
    // Written by our own kind, but read defensively: anything unreadable compares equal.
    if (std::sscanf(std::string(v.begin(), v.end()).c_str(), "%llu %llu %llu %d", &seq, &count,
                    &meta, &first) != 4 ||
        first == rank_)
      return false;
    const transport::OpTag t = unpack(seq, count, meta);
    if (t.seq != mine.seq || (t.count == mine.count && pack(t) == pack(mine))) return false;
    const std::string why = "(seen through the store: the two calls had exchanged no message)";
    // For the ranks that issued either call and have not compared: both calls, both ranks.
    const std::string verdict = "mismatched call: rank " + std::to_string(rank_) + " issued " +
                                hooks_.describe(mine) + " where rank " + std::to_string(first) +
                                " issued " + hooks_.describe(t) + " " + why;
    if (!s->check({op + "mismatch"}))
      s->set(op + "mismatch", std::vector<uint8_t>(verdict.begin(), verdict.end()));
    hooks_.mismatch("mismatched call: rank " + std::to_string(first) + " issued " +
                    hooks_.describe(t) + " " + why);
    return true;
  } catch (const std::exception& e) {
    store_failed_ = true;
    RR_LOG(warn, stall, rank_, "stall reports are unavailable: ", e.what());
  }
  return false;
}

std::string StallMonitor::missing_ranks(Store& s, uint64_t seq) {
  std::vector<int> behind;
  std::ostringstream detail;
  for (int q = 0; q < size_; ++q) {
    if (q == rank_) continue;
    const uint64_t at = word_of(s, q).seq;
    if (at >= seq) continue;
    behind.push_back(q);
    if (behind.size() <= 16) {
      detail << (behind.size() > 1 ? ", " : "") << "rank " << q;
      if (at > 0)
        detail << " last waited in #" << at;
      else
        detail << " never reported a wait";
    }
  }
  if (behind.empty()) return "";
  std::ostringstream out;
  out << (behind.size() == 1 ? "rank " : "ranks ");
  for (size_t i = 0; i < behind.size() && i < 64; ++i) out << (i ? ", " : "") << behind[i];
  if (behind.size() > 64) out << ", ... (" << behind.size() << " in all)";
  out << " (" << detail.str() << (behind.size() > 16 ? ", ..." : "") << ")";
  return out.str();
}

void StallMonitor::report(const transport::OpTag& tag, const std::string& how) {
  Store* s = store();
  std::string missing;
  if (s) {
    try {
      missing = missing_ranks(*s, tag.seq);
    } catch (const std::exception& e) {
      store_failed_ = true;
      RR_LOG(warn, stall, rank_, "stall reports are unavailable: ", e.what());
      return;
    }
  }
  std::ostringstream msg;
  msg << "stall: " << hooks_.describe(tag) << " " << how << "; ";
  if (!s)
    msg << "the store cannot say which ranks have not reached it";
  else if (missing.empty())
    msg << "every rank has reached it (one of them is stuck inside it)";
  else
    msg << "not known to have reached it: " << missing;
  RR_LOG(warn, stall, rank_, msg.str());
}

}  // namespace ringreduce::detail
