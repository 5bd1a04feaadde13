#include "rendezvous/join.h"

#include <algorithm>
#include <sstream>
#include <thread>

#include "rendezvous/store_util.h"
#include "ringreduce/error.h"

namespace ringreduce::rendezvous {
namespace {

using std::chrono::milliseconds;

constexpr const char* kFailed = "failed";
constexpr const char* kFailedSeen = "failed_seen";
// The timeout of a get whose key is known to exist: not 0, which torch 2.x's store takes as
// "time out at once" even then.
constexpr milliseconds kPresent(5000);

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}
// One line of a record: no newline may hide in a field.
std::string one_line(std::string s) {
  std::replace(s.begin(), s.end(), '\n', ' ');
  return s;
}

// world size, host, where, links, then the settings' lines.
std::string encode(const JoinRecord& r) {
  return std::to_string(r.world_size) + "\n" + one_line(r.host) + "\n" + one_line(r.where) + "\n" +
         one_line(r.links) + "\n" + r.settings;
}
JoinRecord decode(int rank, const std::string& s) {
  JoinRecord r;
  r.rank = rank;
  std::istringstream in(s);
  std::string world;
  std::getline(in, world);
  std::getline(in, r.host);
  std::getline(in, r.where);
  std::getline(in, r.links);
  r.settings.assign(std::istreambuf_iterator<char>(in), {});
  try {
    r.world_size = std::stoi(world);
  } catch (...) {
    throw Error("rank " + std::to_string(rank) + "'s start-up record in the store is unreadable");
  }
  return r;
}

// comm id, the number of ranks, their hosts (a line each), then their links, a line each after
// a '+' (an empty last line would not survive the trip).
std::string encode(const JobTable& t) {
  std::string s = std::to_string(t.comm_id) + "\n" + std::to_string(t.hosts.size());
  for (const auto& h : t.hosts) s += "\n" + one_line(h);
  for (const auto& l : t.links) s += "\n+" + one_line(l);
  return s;
}
JobTable decode_table(const std::string& s) {
  JobTable t;
  std::istringstream in(s);
  std::string line;
  try {
    std::getline(in, line);
    t.comm_id = std::stoull(line);
    std::getline(in, line);
    const size_t n = std::stoul(line);
    while (t.hosts.size() < n && std::getline(in, line)) t.hosts.push_back(line);
    while (std::getline(in, line))
      if (!line.empty() && line[0] == '+') t.links.push_back(line.substr(1));
  } catch (const std::exception&) {
    throw Error("rank 0's table in the store is unreadable");
  }
  t.links.resize(t.hosts.size());
  return t;
}

std::string who(const JoinRecord& r) {
  return "rank " + std::to_string(r.rank) + (r.where.empty() ? "" : " (" + r.where + ")");
}

// NAME -> value of a record's settings lines.
std::vector<std::pair<std::string, std::string>> settings_of(const JoinRecord& r) {
  std::vector<std::pair<std::string, std::string>> out;
  std::istringstream in(r.settings);
  std::string line;
  while (std::getline(in, line)) {
    const size_t eq = line.find('=');
    if (eq != std::string::npos) out.emplace_back(line.substr(0, eq), line.substr(eq + 1));
  }
  return out;
}

// How `theirs` differs from `ref` (rank 0's): "" if in nothing that must agree.
std::string differences(const JoinRecord& ref, const JoinRecord& theirs) {
  std::string out;
  auto add = [&](const std::string& what, const std::string& a, const std::string& b) {
    out += (out.empty() ? "" : "; ") + what + ": " + who(ref) + " has " + a + ", " + who(theirs) +
           " has " + b;
  };
  if (ref.world_size != theirs.world_size)
    add("the world size", std::to_string(ref.world_size), std::to_string(theirs.world_size));
  const auto a = settings_of(ref), b = settings_of(theirs);
  auto value = [](const auto& list, const std::string& name) -> std::string {
    for (const auto& [n, v] : list)
      if (n == name) return v.empty() ? "''" : v;
    return "(unset)";
  };
  std::vector<std::string> names;
  for (const auto& [n, v] : a) names.push_back(n);
  for (const auto& [n, v] : b)
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(n);
  for (const auto& n : names)
    if (value(a, n) != value(b, n)) add(n, value(a, n), value(b, n));
  return out;
}

[[noreturn]] void fail(Store& store, const std::string& msg) {
  mark_failed(store, msg);
  throw MismatchError(msg);
}

}  // namespace

void mark_failed(Store& store, const std::string& message) {
  try {
    if (!store.check({kFailed})) store.set(kFailed, bytes(message));
  } catch (...) {
    // The store is unreachable: the peers will time out instead, naming what they miss.
  }
}

std::optional<std::string> job_failure(Store& store) {
  if (!store.check({kFailed})) return std::nullopt;
  return text(store.get(kFailed, kPresent));
}

void linger_for_readers(Store& store, int others, milliseconds limit) {
  const core::Deadline deadline = store_deadline(limit);
  try {
    while (!deadline.expired() && (others <= 0 || store.add(kFailedSeen, 0) < others))
      std::this_thread::sleep_for(milliseconds(20));
  } catch (...) {
  }
}

void FailFastStore::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  const core::Deadline deadline = store_deadline(timeout);
  for (;;) {
    const milliseconds left(deadline.remaining_ms());
    try {
      inner_->wait(keys, std::min(left, slice_));
      return;
    } catch (const TimeoutError&) {
      if (deadline.expired()) {
        std::vector<std::string> missing;
        for (const auto& k : keys)
          if (!inner_->check({k})) missing.push_back(k);
        throw TimeoutError(missing_keys_message("store", missing, timeout));
      }
    }
    throw_if_failed();
  }
}

void FailFastStore::throw_if_failed() {
  auto failure = job_failure(*inner_);
  if (!failure) return;
  // "rank 1: start-up: why" reads here as "rank 1 failed: why".
  std::string msg = *failure;
  const size_t at = msg.find(": start-up: ");
  if (msg.rfind("rank ", 0) == 0 && at != std::string::npos && at < 16)
    msg = msg.substr(0, at) + " failed: " + msg.substr(at + 12);
  try {
    inner_->add(kFailedSeen, 1);  // the failing store host waits for its readers
  } catch (...) {
  }
  throw Error(msg, ErrorCode::aborted);
}

std::vector<uint8_t> FailFastStore::get(const std::string& key, milliseconds timeout) {
  // One request that the store answers when the key or the failure mark is set (the TCP store;
  // others look every 100 ms): at 1,024 ranks, waits cut into slices with a look at the mark
  // between them were about half of the store's 98,000 requests.
  if (auto v = inner_->get_unless(key, kFailed, timeout)) return std::move(*v);
  throw_if_failed();
  throw Error("store: the job's failure mark was set and then gone");  // not reached
}

std::string first_free_generation(Store& store) {
  // Bounded by the groups the store has seen: one per rendezvous round or restart.
  for (uint64_t k = 0;; ++k) {
    const std::string gen = "gen" + std::to_string(k);
    if (!store.check({gen + "/table"}) && !store.check({gen + "/" + kFailed})) return gen;
  }
}

JobTable join(Store& store, const JoinRecord& mine, uint64_t comm_id, milliseconds timeout) {
  const std::string r = std::to_string(mine.rank);
  const int n = mine.world_size;
  // 1. The claim: a second one is a rank started twice, or a job that already started on this
  // store under the same keys.
  if (store.add("claim/" + r, 1) > 1) {
    std::string holder = "another process";
    if (store.check({"join/" + r}))
      holder = decode(mine.rank, text(store.get("join/" + r, kPresent))).where;
    if (store.check({"table"}))
      throw InvalidArgument(
          "rank " + r + " of a job that has already started is in the store (" + holder +
          "): a reused store needs a job id of its own per job (RINGREDUCE_JOB_ID; ringrun, "
          "torchrun and Slurm give one), or a fresh store");
    const std::string msg = "rank " + r + " was claimed twice: by " + holder + " and by " +
                            mine.where +
                            " (two processes given one rank, or an earlier job's keys in a "
                            "reused store: every process needs a rank of its own, every job on "
                            "a shared store its own RINGREDUCE_JOB_ID)";
    mark_failed(store, msg);
    throw InvalidArgument(msg);
  }
  store.set("join/" + r, bytes(encode(mine)));
  if (mine.rank != 0) {
    // 2'. Each rank checks itself against rank 0 at once, so that a disagreement ends the job
    // on every rank now (rank 0 would otherwise wait for a rank that may never come).
    const JoinRecord zero = decode(0, text(store.get("join/0", timeout)));
    if (const std::string d = differences(zero, mine); !d.empty())
      fail(store, "ranks disagree on " + d);
    if (mine.rank >= zero.world_size)
      fail(store,
           who(mine) + " is not a rank of rank 0's world of " + std::to_string(zero.world_size));
    // 3. The table.
    const JobTable t = decode_table(text(store.get("table", timeout)));
    if (static_cast<int>(t.hosts.size()) != n)
      fail(store, "the world size: rank 0's table has " + std::to_string(t.hosts.size()) +
                      " ranks, " + who(mine) + " has " + std::to_string(n));
    return t;
  }
  // 2. Rank 0: every record, checked against its own, each one request that the store answers
  // when the record (or the job's failure mark) is there.
  const core::Deadline deadline = store_deadline(timeout);
  JobTable t;
  t.comm_id = comm_id;
  t.hosts.push_back(mine.host);
  t.links.push_back(mine.links);
  std::string problems;
  for (int q = 1; q < n; ++q) {
    std::string record;
    try {
      record = text(store.get("join/" + std::to_string(q), milliseconds(deadline.remaining_ms())));
    } catch (const TimeoutError&) {
      std::string missing;
      for (int p = q; p < n; ++p)
        if (!store.check({"join/" + std::to_string(p)})) missing += " " + std::to_string(p);
      throw TimeoutError("ranks" + missing + " did not join within " +
                         std::to_string(timeout.count() / 1000.0).substr(0, 5) +
                         " s (not started, or started with another address or job id?)");
    }
    const JoinRecord rec = decode(q, record);
    if (const std::string d = differences(mine, rec); !d.empty())
      problems += (problems.empty() ? "" : "; ") + d;
    t.hosts.push_back(rec.host);
    t.links.push_back(rec.links);
  }
  if (!problems.empty()) fail(store, "ranks disagree on " + problems);
  store.set("table", bytes(encode(t)));
  return t;
}

}  // namespace ringreduce::rendezvous
