// In-process test harness: N ranks as threads, each with its own Communicator over real loopback
// sockets, rendezvousing through an in-memory store.
#pragma once

#include <gtest/gtest.h>
#include <malloc.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "../../tools/exact_data.h"
#include "ringreduce/ringreduce.hpp"

namespace rrtest {

// The tests allocate and free megabyte buffers thousands of times. glibc maps each one afresh
// above its mmap threshold, and the page faults of touching it again were half of a large
// matrix test's time; heap memory that is kept is reused without faults. (Sanitizers bring their
// own allocator and ignore this.)
inline const bool kBuffersReused = [] {
  mallopt(M_MMAP_THRESHOLD, 256 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}();

using ringreduce::DataType;
using ringreduce::ReduceOp;

// Seconds since t, for the tests that bound how long a failure takes to show.
inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

inline std::string unique_prefix() {
  static std::atomic<int> n{0};
  return "test" + std::to_string(n.fetch_add(1));
}

// Rank r's Options for an in-process job over `store`. "TEST_HOSTS" in settings: K emulates K
// hosts, rank r on host r mod K (interleaved, so the ring must reorder ranks by host): ranks of
// one host share memory, the others talk TCP.
inline ringreduce::Options rank_options(int r, int size, std::shared_ptr<ringreduce::Store> store,
                                        std::chrono::milliseconds timeout,
                                        std::map<std::string, std::string> settings,
                                        const std::string& prefix = "rr") {
  ringreduce::Options o;
  o.rank = r;
  o.world_size = size;
  o.store = std::move(store);
  o.store_prefix = prefix;
  o.timeout = timeout;
  o.settings = std::move(settings);
  if (auto it = o.settings.find("TEST_HOSTS"); it != o.settings.end()) {
    o.settings["RINGREDUCE_HOST_ID"] = "emulated-host-" + std::to_string(r % std::stoi(it->second));
    o.settings.erase("TEST_HOSTS");
  }
  return o;
}

// Runs body(comm) on `size` threads, one communicator each; rethrows the first failure after
// every thread has finished (threads are always joined).
// `per_rank` may adjust each rank's settings (e.g. RINGREDUCE_HOST_ID to emulate hosts).
inline void run_ranks(
    int size, const std::function<void(ringreduce::Communicator&)>& body,
    std::map<std::string, std::string> settings = {},
    std::chrono::milliseconds timeout = std::chrono::seconds(60),
    const std::function<void(int, std::map<std::string, std::string>&)>& per_rank = {}) {
  auto store = ringreduce::make_memory_store();
  const std::string prefix = unique_prefix();
  std::vector<std::exception_ptr> errors(static_cast<size_t>(size));
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r) {
    threads.emplace_back([&, r] {
      try {
        ringreduce::Options o = rank_options(r, size, store, timeout, settings, prefix);
        if (per_rank) per_rank(r, o.settings);
        ringreduce::Communicator comm(o);
        body(comm);
      } catch (...) {
        errors[static_cast<size_t>(r)] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  // Every rank's error is shown (the first is rethrown): the one that started it may be any.
  std::exception_ptr first;
  for (size_t r = 0; r < errors.size(); ++r) {
    if (!errors[r]) continue;
    if (!first) first = errors[r];
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      std::cerr << "[run_ranks] rank " << r << " failed: " << e.what() << "\n";
    } catch (...) {
      std::cerr << "[run_ranks] rank " << r << " failed\n";
    }
  }
  if (first) std::rethrow_exception(first);
}

// ---- exact test data (shared with ringreduce-perf) -------------------------------------------

using ringreduce::exact::expected_value;
using ringreduce::exact::input_value;
using ringreduce::exact::load_value;
using ringreduce::exact::store_value;

inline std::vector<char> make_input(int rank, size_t count, DataType t, ReduceOp op) {
  std::vector<char> buf(std::max<size_t>(1, count * ringreduce::dtype_size(t)));
  for (size_t i = 0; i < count; ++i) store_value(t, buf.data(), i, input_value(rank, i, t, op));
  return buf;
}

inline const std::vector<DataType>& all_dtypes() {
  static const std::vector<DataType> v = {
      DataType::f16, DataType::bf16, DataType::f32, DataType::f64, DataType::i8,
      DataType::u8,  DataType::i32,  DataType::u32, DataType::i64, DataType::u64};
  return v;
}
inline const std::vector<ReduceOp>& all_ops() {
  static const std::vector<ReduceOp> v = {ReduceOp::sum, ReduceOp::prod, ReduceOp::min,
                                          ReduceOp::max, ReduceOp::avg};
  return v;
}

// ---- the size of the matrix ------------------------------------------------------------------

// RR_TEST_MATRIX=small (scripts/sanitize, where every memory access costs several times more): the
// same tests and code paths over fewer combinations. Each test says what it drops through
// ranks_in_matrix() and in_matrix(); the normal matrix is the full one.
inline bool small_matrix() {
  static const bool small = [] {
    const char* v = std::getenv("RR_TEST_MATRIX");
    return v != nullptr && std::string(v) == "small";
  }();
  return small;
}

// `full` normally, `small` under RR_TEST_MATRIX=small.
inline std::vector<int> ranks_in_matrix(std::vector<int> full, std::vector<int> small) {
  return small_matrix() ? small : full;
}

// Whether the (dtype, op) pair runs at this count with n ranks. Small counts run every pair. A
// large count (the multi-segment, multi-round paths, which dominate the time) runs one op per
// dtype: dtype i with op (i + shift) mod 5, so every dtype and every op still goes through them.
//   - Full matrix, N <= 4, `every_pair` (shared memory): every pair. The reduction kernels are
//     the same whatever the transport, so one transport runs each of them at the large counts.
//   - Full matrix otherwise: shift = N. How a large count is cut into chunks, segments, stripes
//     and rounds depends on N and on the element size, never on the op, and every (dtype, op)
//     kernel has already run at the large counts over shared memory with N = 1..4. Each N still
//     runs every dtype and every op at the large counts; mix's N (2, 3, 4, 5, 6, 8) take every
//     shift, so each Matrix test still runs every pair at a large count over shared memory and
//     over mixed hosts' TCP links, for a fifth of the time; tcp (N = 2, 3, 5) takes three.
//   - Small matrix (RR_TEST_MATRIX=small, N <= 4): shift = 0.
inline bool in_matrix(DataType t, ReduceOp op, bool large, int n, bool every_pair = true) {
  if (!large) return true;
  if (!small_matrix() && n <= 4 && every_pair) return true;
  const auto& ts = all_dtypes();
  const auto& ops = all_ops();
  const auto ti = static_cast<size_t>(std::find(ts.begin(), ts.end(), t) - ts.begin());
  const auto oi = static_cast<size_t>(std::find(ops.begin(), ops.end(), op) - ops.begin());
  const auto shift = small_matrix() ? size_t{0} : static_cast<size_t>(n);
  return (ti + shift) % ops.size() == oi;
}

// The transports the tests run over, named once for the whole suite: "shm" (ranks on one host,
// shared memory, the default there), "tcp" (one host, TCP only) and "mix" (two emulated hosts,
// ranks placed alternately: shared memory within a host, TCP between, the ring reordered).
inline const std::vector<std::string>& transports() {
  static const std::vector<std::string> kinds = {"shm", "tcp", "mix"};
  return kinds;
}
// The settings run_ranks takes for a transport, added to `s`.
inline std::map<std::string, std::string> transport_settings(
    const std::string& kind, std::map<std::string, std::string> s = {}) {
  if (kind == "tcp") s["RINGREDUCE_SHM"] = "0";
  if (kind == "mix") s["TEST_HOSTS"] = "2";
  return s;
}

// A test run over each transport: the parameter is its name (INSTANTIATE_TEST_SUITE_P with
// ::testing::ValuesIn(rrtest::transports())), and transport() the settings run_ranks takes.
class OverEachTransport : public ::testing::TestWithParam<std::string> {
 protected:
  std::map<std::string, std::string> transport() const { return transport_settings(GetParam()); }
};

}  // namespace rrtest
