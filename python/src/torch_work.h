// What the torch backend (torch_backend.cc) shares between its calls: torch's store as a
// ringreduce Store, and the torch Work that completes from ringreduce's ops. The same for torch
// 1.13's ProcessGroup and torch 2.x's Backend: their Work and Store classes are the same.
#pragma once

#include <ATen/ThreadLocalState.h>

#include <optional>

#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "ringreduce/ringreduce.hpp"

namespace ringreduce::torch_backend {

namespace rr = ringreduce;

// torch's store (the prefix store init_process_group made for this group) as a ringreduce Store:
// the communicator's rendezvous and stall reports go through it.
class TorchStore : public rr::Store {
 public:
  explicit TorchStore(c10::intrusive_ptr<c10d::Store> s) : s_(std::move(s)) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    s_->set(key, value);
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    return s_->get(key);
  }
  int64_t add(const std::string& key, int64_t delta) override { return s_->add(key, delta); }
  // Polls check() rather than calling torch's wait: on torch 1.13's TCPStore a wait that times
  // out can leave a stray answer on the connection that breaks the next request ("Stop_waiting
  // response is expected", seen in CI), and ringreduce's start-up waits time out every slice by
  // design (they read the job's failure mark in between).
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    using std::chrono::milliseconds;
    const auto deadline =
        std::chrono::steady_clock::now() +
        std::clamp(timeout, milliseconds(0), milliseconds(std::chrono::hours(24 * 365 * 10)));
    milliseconds pause(1);
    for (;;) {
      bool present = false;
      try {
        present = s_->check(keys);
      } catch (const std::exception& e) {
        throw rr::Error("torch store: checking for " + names(keys) + ": " + e.what());
      }
      if (present) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline)
        throw rr::TimeoutError("torch store: " + names(keys) + " not set within " +
                               std::to_string(timeout.count()) + " ms");
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, milliseconds(20));
    }
  }
  bool check(const std::vector<std::string>& keys) override { return s_->check(keys); }

 private:
  static std::string names(const std::vector<std::string>& keys) {
    std::string out;
    for (const auto& k : keys) out += (out.empty() ? "'" : ", '") + k + "'";
    return out;
  }
  c10::intrusive_ptr<c10d::Store> s_;
};

// Set while this thread completes a Work (runs its Future's callbacks). Such a callback may issue
// the next collective (PowerSGD's hook does); it runs in the thread that finished the op, which
// may be ringreduce's progress thread still driving the queue, where a blocking call would wait
// for itself. So collectives issued from there always go async.
extern thread_local bool t_completing;

// A torch Work over one or more ringreduce Works (coalesced calls run several), done when all
// are. `after` runs once they have succeeded, before the Work and its Future complete (copying
// results out of staging buffers).
class WorkRR : public c10d::Work {
 public:
  // comm: what a SIGINT during wait() aborts (interrupt.h); it outlives every Work not completed.
  WorkRR(int rank, c10d::OpType type, std::vector<at::Tensor> outputs, std::function<void()> after,
         rr::Communicator* comm);

  // Starts watching the ops; `keep` holds tensors (staging buffers) they use until they complete.
  static c10::intrusive_ptr<c10d::Work> launch(c10::intrusive_ptr<WorkRR> self,
                                               std::vector<rr::Work> ops,
                                               std::vector<at::Tensor> keep);
  // A Work for what already ran in the calling thread (error: how it ended).
  static c10::intrusive_ptr<c10d::Work> done(c10::intrusive_ptr<WorkRR> self,
                                             std::exception_ptr error);

  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive from any source: the sender (torch's irecv without src).
  int sourceRank() const override;

 private:
  void one_done(std::exception_ptr e);
  void complete(std::exception_ptr e);

  std::vector<rr::Work> ops_;
  std::atomic<size_t> pending_{0};
  std::mutex first_error_mu_;
  std::exception_ptr first_error_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> keep_;
  std::function<void()> after_;
  // The issuing thread's (inference mode, grad mode, dispatch keys): `after` writes the caller's
  // output tensors from whichever thread completes the op, and torch refuses an in-place write
  // to an inference tensor outside inference mode (gloo carries the state to its worker too).
  // Taken only for a Work that has an `after`: most have none.
  std::optional<at::ThreadLocalState> caller_state_;
  rr::Communicator* comm_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

}  // namespace ringreduce::torch_backend
