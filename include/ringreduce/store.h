// The rendezvous key-value store: the only state ranks share before their links exist.
// Implementations: in-memory (tests), file (shared filesystem), TCP (rank 0 or standalone), and
// the torch backend's wrapper around c10d::Store. Public so that bindings can supply their own.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "ringreduce/export.h"

namespace ringreduce {

class RINGREDUCE_API Store {
 public:
  virtual ~Store() = default;
  // Stores value under key, replacing any previous value, and wakes waiters on it.
  virtual void set(const std::string& key, const std::vector<uint8_t>& value) = 0;
  // Waits until key exists, then returns its value. TimeoutError (naming the key) after timeout.
  virtual std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) = 0;
  // Atomically adds delta to the integer stored under key (missing = 0) and returns the result.
  virtual int64_t add(const std::string& key, int64_t delta) = 0;
  // Waits until every key exists. TimeoutError naming the keys still missing after timeout.
  virtual void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) = 0;
  // True if every key exists now; never waits.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Waits until key or `unless` exists: key's value if key is set, else nullopt once `unless` is
  // (a wait that another event, such as the job's failure mark, must cut short). TimeoutError
  // naming key after timeout. The TCP store answers it in one request; this default looks every
  // 100 ms.
  virtual std::optional<std::vector<uint8_t>> get_unless(const std::string& key,
                                                         const std::string& unless,
                                                         std::chrono::milliseconds timeout);
};

// Namespaces every key under "prefix/": lets several communicators share one store.
class RINGREDUCE_API PrefixStore : public Store {
 public:
  PrefixStore(std::shared_ptr<Store> inner, std::string prefix)
      : inner_(std::move(inner)), prefix_(std::move(prefix) + "/") {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    inner_->set(prefix_ + key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    return inner_->get(prefix_ + key, timeout);
  }
  int64_t add(const std::string& key, int64_t delta) override {
    return inner_->add(prefix_ + key, delta);
  }
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    inner_->wait(prefixed(keys), timeout);
  }
  bool check(const std::vector<std::string>& keys) override {
    return inner_->check(prefixed(keys));
  }
  std::optional<std::vector<uint8_t>> get_unless(const std::string& key, const std::string& unless,
                                                 std::chrono::milliseconds timeout) override {
    return inner_->get_unless(prefix_ + key, prefix_ + unless, timeout);
  }

 private:
  std::vector<std::string> prefixed(const std::vector<std::string>& keys) const {
    std::vector<std::string> out;
    out.reserve(keys.size());
    for (const auto& k : keys) out.push_back(prefix_ + k);
    return out;
  }
  std::shared_ptr<Store> inner_;
  std::string prefix_;
};

// An in-process store for tests that run ranks as threads.
RINGREDUCE_API std::shared_ptr<Store> make_memory_store();

}  // namespace ringreduce
