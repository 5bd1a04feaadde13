// How the ranks of a job meet in the store, check that they belong together, and learn the job's
// table, in a constant number of store round trips per rank (rank 0: one per rank).
//
//   1. Each rank claims its rank (a counter per rank: a second claim is a rank started twice, or a
//      store that still holds a job which has already started) and publishes a record: world
//      size, host identity, the settings every rank must agree on, and where it runs (host, pid).
//   2. Rank 0 waits for every record, checks them against its own, and publishes the table (the
//      communicator id, every rank's host and what it published for its peers to reach it:
//      the only per-peer facts start-up needs), or marks the job failed with one message naming
//      the ranks and the values that differ.
//   3. The others wait for the table, and check it against themselves.
//
// A rank that fails at start-up marks the job failed (mark_failed); every rank waiting in the
// store at start-up (through a FailFastStore) then fails within ~100 ms with that message,
// instead of waiting out its timeout.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

struct JoinRecord {
  int rank = 0;
  int world_size = 0;
  std::string host;      // host identity (shared memory and the ring's order by host)
  std::string settings;  // "NAME=value" lines of the settings that must agree, sorted
  std::string where;     // "host vm pid 1234", for messages
  std::string links;     // what peers need to reach this rank (transport::Listeners), one line
};

struct JobTable {
  uint64_t comm_id = 0;
  std::vector<std::string> hosts;  // every rank's host identity
  std::vector<std::string> links;  // every rank's JoinRecord::links
};

// Marks the job failed with `message` (best effort: a store that cannot be reached is ignored,
// the caller is failing anyway). The first mark stays: later ones are usually its echoes.
void mark_failed(Store& store, const std::string& message);

// The message of the job's failure, if it is marked failed.
std::optional<std::string> job_failure(Store& store);

// A store that outlives the groups made on it, by design: torch 2.x's torchrun keeps one TCPStore
// (the agent store, shared by every rendezvous round) for the whole job, and a restart under
// 1.13's static rendezvous reuses the agent's; keys of an earlier round (its table, its failure
// mark) must not confuse the next. Each group then joins under the first generation, "gen<k>",
// in which no group has started (no table) or failed (no failure mark). Every rank of a new
// group finds the same one: its table is written only after every rank of the group has claimed
// there, so a table a rank finds before its own claim is an earlier group's. Returns "gen<k>".
std::string first_free_generation(Store& store);

// For the rank that hosts the store and fails: waits until `others` ranks have read the mark
// (FailFastStore counts its readers), or `limit`, so that the store outlives the news.
void linger_for_readers(Store& store, int others, std::chrono::milliseconds limit);

// A store whose waits also watch the job's failure mark: if it is set, the wait throws the
// failure (an Error naming the rank that marked it, code aborted) instead of waiting out its
// timeout. A get is one Store::get_unless (the TCP store answers it when either key is set); a
// wait is cut into slices of `slice`, and between them the mark is read.
class FailFastStore : public Store {
 public:
  explicit FailFastStore(std::shared_ptr<Store> inner,
                         std::chrono::milliseconds slice = std::chrono::milliseconds(100))
      : inner_(std::move(inner)), slice_(slice) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override;
  int64_t add(const std::string& key, int64_t delta) override { return inner_->add(key, delta); }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override;
  bool check(const std::vector<std::string>& keys) override { return inner_->check(keys); }
  // Throws the failure (as wait does) if the job is marked failed: for start-up waits that are
  // not store waits (the links' accepts), between their slices.
  void throw_if_failed();

 private:
  std::shared_ptr<Store> inner_;
  std::chrono::milliseconds slice_;
};

// Steps 1-3 above. Throws InvalidArgument (this rank's setting is wrong), MismatchError (ranks
// disagree: every rank's message names them and the values) or the failure another rank marked;
// marks the job failed itself when it finds the fault. comm_id: rank 0's fresh id.
JobTable join(Store& store, const JoinRecord& mine, uint64_t comm_id,
              std::chrono::milliseconds timeout);

}  // namespace ringreduce::rendezvous
