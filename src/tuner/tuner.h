// The tuner: the one place that chooses, per call, which algorithm runs, with what segment size and
// how many channels. It predicts each candidate's time with the cost each algorithm states
// (algorithms/cost.h, docs/TUNING.md) over the link costs measured at start-up, and runs the
// cheapest. The candidates are the registry's algorithms for the collective that suit the
// communicator's links (Algorithm::suits against the slowest kind's name) and whose needs (a
// window) the links meet.
#pragma once

#include <array>
#include <atomic>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "core/config.h"
#include "transport/kind.h"

namespace ringreduce::tuner {

using algorithms::Costs;

// The communicator as the tuner sees it.
struct Setup {
  int size = 1;
  int channels = 1;  // the links' channels (RINGREDUCE_CHANNELS)
  // The traits of the communicator's slowest kind of link (transport::Engine::traits()).
  transport::KindTraits link;
  bool window = false;  // every rank reads every rank's memory (transport::Window)
  // Ranks per host when the communicator spans several hosts with as many on each, else 0.
  int host_size = 0;
};

struct Plan {
  const algorithms::Algorithm* algorithm = nullptr;
  size_t segment_bytes = 0;
  int channels = 1;
  bool sliced = false;         // post ring schedules slice by slice (algorithms/ring_phases.h)
  bool stream_output = false;  // receives write the output with streaming stores (Transport)
  // For the registered allreduce: what runs when some rank's buffers turn out not to be
  // registered (the choice the tuner makes without it), so that plain buffers lose nothing while
  // the communicator has registered memory.
  const algorithms::Algorithm* fallback = nullptr;
};

class Tuner {
 public:
  // Reads RINGREDUCE_ALGO ("ring", or per collective "allreduce:ring,broadcast:chain", or a list
  // for one collective "allreduce:flat,allreduce:direct") and RINGREDUCE_SEGMENT_BYTES;
  // InvalidArgument names a bad value.
  Tuner(const core::Config& config, const Setup& setup);
  // A call with Args::wire set runs its collective's coded algorithm (wire_phases.h).
  Plan choose(const algorithms::Args& args) const;
  // The wire format a call runs with (its Args::wire): `requested` (CallOptions::wire; unset:
  // RINGREDUCE_WIRE) where the call can take one (wire_applies), else none; automatic becomes
  // bf16 where the model predicts the coded call at least 10% faster than the uncoded one's
  // choice, else none. The same on every rank: it reads only the call and the shared costs.
  Wire resolve_wire(const algorithms::Args& args, std::optional<Wire> requested) const;
  // Float32 allreduce, reduce_scatter or allgather, reducing (where it reduces) by sum, avg or
  // premul_sum: what a narrow format can serve with one rounding per input.
  static bool wire_applies(const algorithms::Args& args);
  // The model's time for the coded call of `bytes` in format w (per rank, as predict()).
  double predict_coded(algorithms::Collective kind, size_t bytes, Wire w) const;
  // The costs the model predicts with, as measured at start-up by the communicator (or read
  // from RINGREDUCE_TUNING_FILE). Until set: default_costs(setup.link).
  void set_costs(const Costs& costs);
  const Costs& costs() const { return in_.costs; }
  // Whether every rank has memory registered with its peers (Communicator::alloc): large
  // allreduces then go to the registered algorithm, which runs Plan::fallback for a call
  // whose buffers are not all registered. Set alike on every rank (alloc and free are
  // collectives).
  void set_registered(bool registered) {
    registered_.v.store(registered, std::memory_order_relaxed);
    generation_.v.fetch_add(1, std::memory_order_release);
  }
  // Changes with every set_costs() and set_registered(): a caller that keeps a plan for calls
  // of one shape (CommImpl::call) asks for a new one when this moves.
  uint64_t generation() const { return generation_.v.load(std::memory_order_acquire); }
  // The model's time for `algorithm` on a call of `bytes` (per rank; infinity for one it does
  // not model).
  double predict(const algorithms::Algorithm& algorithm, size_t bytes) const;
  // What the costs are before anything is measured: the link's defaults and this machine's
  // reduce kernel (docs/TUNING.md).
  static Costs default_costs(const transport::KindTraits& link);

 private:
  // registered: whether the registered allreduce may be picked (false: the plan's fallback).
  const algorithms::Algorithm* pick(const algorithms::Args& args, bool registered) const;
  // Whether the links meet an algorithm's needs and it suits them.
  bool usable(const algorithms::Algorithm& a) const;
  // Bytes each rank moves per ring step for a call of `bytes` (an allreduce's chunk, K / N).
  size_t ring_step(algorithms::Collective kind, size_t bytes) const;
  // The cheapest modelled candidate for a call of `bytes`; null when none is modelled.
  const algorithms::Algorithm* cheapest(algorithms::Collective kind, size_t bytes) const;
  // Fills choice_: the cheapest candidate for each size class, so that a call costs a lookup
  // (a 4-byte allreduce takes a fraction of a microsecond; evaluating six formulas would add a
  // visible share). Four classes per power of two, each decided at its smallest size.
  void tabulate();
  static size_t size_class(size_t bytes);
  static size_t class_bytes(size_t cls);
  static constexpr size_t kClasses = 4 * 64;
  size_t choose_segment(const algorithms::Algorithm& algorithm, size_t bytes) const;

  Setup setup_;
  algorithms::CostInputs in_;
  // Atomics that move with the tuner (it is built and then moved).
  template <class T>
  struct Movable {
    std::atomic<T> v{};
    Movable() = default;
    Movable(Movable&& o) noexcept : v(o.v.load()) {}
    Movable& operator=(Movable&& o) noexcept {
      v.store(o.v.load());
      return *this;
    }
  };
  // set_registered(): atomic, as a call's choice may be made in the progress thread (a Work's
  // callback issuing the next call) while alloc() runs in the caller's.
  Movable<bool> registered_;
  Movable<uint64_t> generation_;
  size_t stream_min_bytes_;
  size_t forced_segment_ = 0;
  Wire wire_setting_ = Wire::none;  // RINGREDUCE_WIRE
  // By Collective value: the cheapest candidate per size class (empty: none is modelled).
  std::array<std::vector<const algorithms::Algorithm*>, algorithms::kMaxCollective + 1> choice_;
  // By Collective value: the usable algorithms that take calls by a rule, in registry order.
  std::array<std::vector<const algorithms::Algorithm*>, algorithms::kMaxCollective + 1> rules_;
  // By Collective value: its default algorithm (null for a value that names no collective),
  // looked up by name once rather than per call.
  std::array<const algorithms::Algorithm*, algorithms::kMaxCollective + 1> default_{};
  const algorithms::Algorithm& default_algorithm(algorithms::Collective c) const;
  // By Collective value: its coded algorithm, if it has one.
  std::array<const algorithms::Algorithm*, algorithms::kMaxCollective + 1> coded_{};
  // RINGREDUCE_ALGO: per collective, the forced algorithms in order; a call runs the first whose
  // max_bytes admits it (none: the tuner's own choice).
  std::map<algorithms::Collective, std::vector<const algorithms::Algorithm*>> forced_;
};

}  // namespace ringreduce::tuner
