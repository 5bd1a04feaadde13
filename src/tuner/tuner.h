// The tuner: the one place that chooses, per call, which algorithm runs, with what segment size and
// how many channels. It predicts each candidate's time with the alpha-beta-gamma model
// (cost_model.h, docs/TUNING.md) over the link costs measured at start-up, and runs the cheapest.
#pragma once

#include <array>
#include <map>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "core/config.h"
#include "tuner/cost_model.h"

namespace ringreduce::tuner {

struct Plan {
  const algorithms::Algorithm* algorithm = nullptr;
  size_t segment_bytes = 0;
  int channels = 1;
  bool sliced = false;         // post ring schedules slice by slice (algorithms/ring_phases.h)
  bool stream_output = false;  // receives write the output with streaming stores (Transport)
};

class Tuner {
 public:
  // Reads RINGREDUCE_ALGO ("ring", or per collective "allreduce:ring,broadcast:chain", or a list
  // for one collective "allreduce:flat,allreduce:direct"),
  // RINGREDUCE_SEGMENT_BYTES and RINGREDUCE_CHANNELS; InvalidArgument names a bad value.
  // shared_memory: every link is a shared-memory one (one host). host_size: ranks per host when
  // the communicator spans several hosts with as many on each, else 0.
  Tuner(const core::Config& config, int world_size, int transport_channels, bool shared_memory,
        int host_size = 0);
  Plan choose(const algorithms::Args& args) const;
  // The costs the model predicts with, as measured at start-up by the communicator (or read
  // from RINGREDUCE_TUNING_FILE). Until set: defaults for the link kind (default_costs).
  void set_costs(const Costs& costs);
  const Costs& costs() const { return costs_; }
  // The model's time for `algorithm` running a `kind` call of `bytes` (per rank; infinity for
  // one it does not model: star, hierarchical, and the collectives that have one algorithm).
  double predict(const algorithms::Algorithm& algorithm, algorithms::Collective kind,
                 size_t bytes) const;
  // What the costs are before anything is measured: this machine's, per link kind
  // ("shm", "tcp", "net"), from the measurements in docs/TUNING.md.
  static Costs default_costs(const std::string& link_kind);

 private:
  const algorithms::Algorithm* pick(const algorithms::Args& args) const;
  // The candidates the model compares for a collective (empty: it has one algorithm).
  std::vector<const algorithms::Algorithm*> candidates(algorithms::Collective kind) const;
  // The cheapest candidate by the model for a call of `bytes`.
  const algorithms::Algorithm* cheapest(algorithms::Collective kind, size_t bytes) const;
  // Fills choice_: the cheapest candidate for each size class, so that a call costs a lookup
  // (a 4-byte allreduce takes a fraction of a microsecond; evaluating six formulas would add a
  // visible share). Four classes per power of two, each decided at its smallest size.
  void tabulate();
  static size_t size_class(size_t bytes);
  static size_t class_bytes(size_t cls);
  static constexpr size_t kClasses = 4 * 64;
  // Per modelled collective (index: allreduce 0, broadcast 1, reduce 2).
  std::array<std::array<const algorithms::Algorithm*, kClasses>, 3> choice_{};
  int tree_depth_ = 0;
  size_t choose_segment(const algorithms::Algorithm& algorithm, algorithms::Collective kind,
                        size_t bytes) const;
  Costs costs_;

  int size_;
  int channels_;
  bool shared_memory_;
  int host_size_;
  size_t stream_min_bytes_;
  size_t forced_segment_ = 0;
  // RINGREDUCE_ALGO: per collective, the forced algorithms in order; a call runs the first whose
  // max_bytes admits it (none: the tuner's own choice).
  std::map<algorithms::Collective, std::vector<const algorithms::Algorithm*>> forced_;
  std::map<algorithms::Collective, const algorithms::Algorithm*> first_;  // each kind's default
  const algorithms::Algorithm* rd_ = nullptr;
  const algorithms::Algorithm* rabenseifner_ = nullptr;
  const algorithms::Algorithm* tree_ = nullptr;
  const algorithms::Algorithm* binomial_broadcast_ = nullptr;
  const algorithms::Algorithm* binomial_reduce_ = nullptr;
  const algorithms::Algorithm* flat_allreduce_ = nullptr;
  const algorithms::Algorithm* flat_barrier_ = nullptr;
  const algorithms::Algorithm* hierarchical_ = nullptr;
  const algorithms::Algorithm* direct_ = nullptr;
};

}  // namespace ringreduce::tuner
