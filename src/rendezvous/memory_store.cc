// The in-process store: a map under one mutex, with a condition variable that every set()
// broadcasts on. Ranks that run as threads of one test process rendezvous through it.
#include <condition_variable>
#include <map>
#include <mutex>

#include "rendezvous/store_util.h"
#include "ringreduce/error.h"
#include "ringreduce/store.h"

namespace ringreduce {
namespace {

class MemoryStore : public Store {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = value;
    }
    // Waiters may wait on any subset of keys, so every one of them re-checks its own condition.
    changed_.notify_all();
  }

  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    auto deadline = rendezvous::store_deadline(timeout);
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_until(lock, deadline.at(), [&] { return data_.count(key) > 0; }))
      throw TimeoutError(rendezvous::missing_keys_message(kName, {key}, timeout));
    return data_.at(key);
  }

  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      auto it = data_.find(key);
      int64_t current = it == data_.end() ? 0 : rendezvous::parse_counter(kName, key, it->second);
      result = rendezvous::add_counter(kName, key, current, delta);
      data_[key] = rendezvous::format_counter(result);
    }
    changed_.notify_all();
    return result;
  }

  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    auto deadline = rendezvous::store_deadline(timeout);
    std::unique_lock<std::mutex> lock(mu_);
    if (!changed_.wait_until(lock, deadline.at(), [&] { return all_present(keys); })) {
      std::vector<std::string> missing;
      for (const auto& k : keys)
        if (data_.count(k) == 0) missing.push_back(k);
      throw TimeoutError(rendezvous::missing_keys_message(kName, missing, timeout));
    }
  }

  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> lock(mu_);
    return all_present(keys);
  }

 private:
  static constexpr const char* kName = "memory store";

  // Caller holds mu_.
  bool all_present(const std::vector<std::string>& keys) const {
    for (const auto& k : keys)
      if (data_.count(k) == 0) return false;
    return true;
  }

  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::vector<uint8_t>> data_;
};

}  // namespace

std::shared_ptr<Store> make_memory_store() {
  return std::make_shared<MemoryStore>();
}

}  // namespace ringreduce
