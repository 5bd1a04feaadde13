// The tuner: the one place that chooses, per call, which algorithm runs, with what segment size and
// how many channels. Today every collective has one algorithm, so the choice is mostly the
// segment size; the small-message algorithms and the cost model arrive with their issue.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "algorithms/algorithm.h"
#include "core/config.h"

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
  // The network between hosts as measured at start-up: one message's latency (seconds) and the
  // bandwidth of one connection (bytes/s). With it, small allreduces on several hosts choose
  // between recursive doubling and the ring by their cost (tuner.cc); without, by the loopback
  // threshold.
  void set_network(double alpha_s, double bytes_per_s) {
    net_alpha_ = alpha_s;
    net_bandwidth_ = bytes_per_s;
  }

 private:
  const algorithms::Algorithm* pick(const algorithms::Args& args) const;
  bool rd_beats_ring(size_t bytes) const;
  double net_alpha_ = 0;
  double net_bandwidth_ = 0;

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
  const algorithms::Algorithm* flat_allreduce_ = nullptr;
  const algorithms::Algorithm* flat_barrier_ = nullptr;
  const algorithms::Algorithm* hierarchical_ = nullptr;
  const algorithms::Algorithm* direct_ = nullptr;
};

}  // namespace ringreduce::tuner
