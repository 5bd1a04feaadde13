#include "tuner/tuner.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <limits>
#include <sstream>

#include "reduce/reduce.h"
#include "reduce/wire.h"
#include "ringreduce/error.h"

namespace ringreduce::tuner {

using algorithms::Algorithm;
using algorithms::Collective;

namespace {

Collective parse_collective(const std::string& s) {
  const algorithms::CollectiveFacts* f = algorithms::facts_by_name(s);
  if (!f) throw InvalidArgument("RINGREDUCE_ALGO: unknown collective '" + s + "'");
  return f->kind;
}

}  // namespace

const Algorithm& Tuner::default_algorithm(Collective c) const {
  const Algorithm* a = default_[static_cast<size_t>(c)];
  if (!a) throw Error(std::string("no default algorithm for ") + algorithms::collective_name(c));
  return *a;
}

Tuner::Tuner(const core::Config& config, const Setup& setup)
    : setup_(setup), stream_min_bytes_(reduce::stream_output_threshold()) {
  in_.n = setup_.size;
  in_.tree_depth = algorithms::tree_depth(setup_.size);
  in_.host_size = setup_.host_size;
  in_.link_segment = setup_.link.segment_bytes;
  in_.costs = default_costs(setup_.link);
  for (const auto& f : algorithms::all_facts()) {
    default_[static_cast<size_t>(f.kind)] = algorithms::find_algorithm(f.kind, f.default_algorithm);
    coded_[static_cast<size_t>(f.kind)] = algorithms::find_algorithm(f.kind, "wire");
  }
  if (!parse_wire(config.str("RINGREDUCE_WIRE"), &wire_setting_))
    throw InvalidArgument("RINGREDUCE_WIRE='" + config.str("RINGREDUCE_WIRE") +
                          "': not a wire format (none, bf16, f16, fp8e4m3, fp8e5m2, auto)");
  if (config.has("RINGREDUCE_SEGMENT_BYTES")) {
    forced_segment_ = config.size("RINGREDUCE_SEGMENT_BYTES");
    if (forced_segment_ == 0) throw InvalidArgument("RINGREDUCE_SEGMENT_BYTES must be > 0");
  }
  std::stringstream spec(config.str("RINGREDUCE_ALGO"));
  std::string item;
  // A bare name applies to every collective that has an algorithm of that name (the last one
  // named wins); "collective:name" items take precedence over bare names, and several of them
  // for one collective form a list in order ("allreduce:flat,allreduce:direct": a call runs the
  // first whose size limit admits it, here flat up to its limit and direct above).
  std::map<Collective, const Algorithm*> bare;
  while (std::getline(spec, item, ',')) {
    if (item.empty()) continue;
    auto colon = item.find(':');
    if (colon == std::string::npos) {
      bool any = false;
      for (const auto& f : algorithms::all_facts()) {
        if (const auto* a = algorithms::find_algorithm(f.kind, item)) bare[f.kind] = a, any = true;
      }
      if (!any) throw InvalidArgument("RINGREDUCE_ALGO: no algorithm named '" + item + "'");
    } else {
      Collective c = parse_collective(item.substr(0, colon));
      const auto* a = algorithms::find_algorithm(c, item.substr(colon + 1));
      if (!a)
        throw InvalidArgument("RINGREDUCE_ALGO: " + item.substr(0, colon) + " has no algorithm '" +
                              item.substr(colon + 1) + "'");
      forced_[c].push_back(a);
    }
  }
  for (const auto& [c, a] : bare)
    if (!forced_.contains(c)) forced_[c] = {a};
  for (const auto& [c, list] : forced_)
    for (const auto* a : list)
      if (a->needs_window && !setup_.window && setup_.size > 1)
        throw InvalidArgument(std::string("RINGREDUCE_ALGO: ") + algorithms::collective_name(c) +
                              ":" + a->name +
                              " reads peers' memory directly and needs every rank on one host "
                              "(with shared memory enabled)");
  for (const auto& a : algorithms::all_algorithms())
    if (a.rule && usable(a)) rules_[static_cast<size_t>(a.kind)].push_back(&a);
  tabulate();
}

Costs Tuner::default_costs(const transport::KindTraits& link) {
  // The link's defaults; the reduce kernel as the start-up probe measures it on this project's
  // 2-core VM (docs/TUNING.md). They decide only until set_costs(): a single rank, and tests of
  // the tuner alone.
  Costs c;
  c.link = link.costs;
  c.gamma = 1.0 / 8e9;
  c.codec = 2 * c.gamma;
  return c;
}

bool Tuner::wire_applies(const algorithms::Args& a) {
  if (a.dtype != DataType::f32) return false;
  if (a.kind == Collective::allgather) return true;
  if (a.kind != Collective::allreduce && a.kind != Collective::reduce_scatter) return false;
  return a.op == ReduceOp::sum || a.op == ReduceOp::avg || a.op == ReduceOp::premul_sum;
}

double Tuner::predict_coded(Collective kind, size_t bytes, Wire w) const {
  const int n = setup_.size;
  if (n <= 1) return 0;
  const Costs& c = in_.costs;
  const double k = static_cast<double>(bytes);
  const double ratio =
      static_cast<double>(reduce::wire_bytes(w, bytes / sizeof(float))) / std::max(k, 1.0);
  // Per phase: N-1 messages in flight at once (one alpha each on the sender's side), and a share
  // of the buffer ((N-1)/N of it for an allreduce, N-1 blocks for the others) coded through the
  // links, coded and decoded (and added) once each: codec is both, the add included.
  const int phases = kind == Collective::allreduce ? 2 : 1;
  const double share = kind == Collective::allreduce ? (n - 1.0) / n * k : (n - 1.0) * k;
  return phases * ((n - 1) * c.link.alpha + share * ratio * c.link.beta + share * c.codec);
}

Wire Tuner::resolve_wire(const algorithms::Args& args, std::optional<Wire> requested) const {
  const Wire w = requested.value_or(wire_setting_);
  if (w == Wire::none || !wire_applies(args) || !coded_[static_cast<size_t>(args.kind)])
    return Wire::none;
  if (w != Wire::automatic) return w;
  // auto: only where the model finds it pays, and only as bf16 (the format whose rounding a
  // float32 training run does not notice; the narrower ones are asked for by name).
  if (setup_.size <= 1 || args.count == 0) return Wire::none;
  const size_t bytes = args.count * sizeof(float);
  const Costs& c = in_.costs;
  const double n = setup_.size, k = static_cast<double>(bytes);
  double t;
  if (args.kind == Collective::allreduce) {
    algorithms::Args plain = args;
    plain.wire = Wire::none;
    t = predict(*pick(plain, false), bytes);
    // One the model does not describe (hierarchical, by its rule): the ring's time instead.
    if (!std::isfinite(t)) t = algorithms::ring_allreduce_cost(in_, k, 0);
  } else {
    // The ring reduce_scatter or allgather: N-1 steps of one rank's block (count per rank).
    t = (n - 1) * (c.link.alpha + k * c.link.beta) +
        (args.kind == Collective::reduce_scatter ? (n - 1) * k * c.gamma : 0);
  }
  return predict_coded(args.kind, bytes, Wire::bf16) < 0.9 * t ? Wire::bf16 : Wire::none;
}

bool Tuner::usable(const Algorithm& a) const {
  return (!a.needs_window || setup_.window) && a.suited_to(setup_.link.name);
}

double Tuner::predict(const Algorithm& a, size_t bytes) const {
  if (!a.cost) return std::numeric_limits<double>::infinity();
  const double seg = static_cast<double>(choose_segment(a, bytes));
  return a.cost(in_, static_cast<double>(bytes), seg);
}

const Algorithm* Tuner::cheapest(Collective kind, size_t bytes) const {
  const Algorithm* best = nullptr;
  double best_t = std::numeric_limits<double>::infinity();
  // From the ring step at which the links post the ring slice by slice, its forwards leave from
  // cache right after each slice is reduced, while recursive doubling, Rabenseifner and the tree
  // put each step's whole result through memory before sending it on: a cost pi, measured on a
  // buffer that fits the caches, cannot show (shared memory, sliced at every size, does not
  // consider them at all). Over loopback the ring was the best forced allreduce from 16 MiB at
  // N = 2, 4 and 8 in the three sweeps since it went slice by slice (1.1-1.8x ahead of
  // Rabenseifner; one round of the tree aside), while the model took Rabenseifner whenever pi
  // came out below a few ps/B, as start-up probes on 1 MiB, where the two tie, often measure
  // (0-47 ps/B at N = 4, 0 at N = 8; docs/TUNING.md).
  const bool ring_fused =
      kind == Collective::allreduce && setup_.link.sliced(ring_step(kind, bytes));
  // Ties keep the earlier candidate (the registry lists them in tie-break order).
  for (const auto& a : algorithms::all_algorithms()) {
    if (a.kind != kind || !a.cost || !usable(a) || bytes > a.max_bytes) continue;
    if (ring_fused && !a.needs_window && a.run != algorithms::ring_allreduce) continue;
    const double t = predict(a, bytes);
    if (best == nullptr || t < best_t) best = &a, best_t = t;
  }
  return best;
}

size_t Tuner::ring_step(Collective kind, size_t bytes) const {
  return kind == Collective::allreduce ? bytes / static_cast<size_t>(std::max(setup_.size, 1))
                                       : bytes;
}

size_t Tuner::size_class(size_t bytes) {
  if (bytes < 4) return bytes;
  const int e = std::bit_width(bytes) - 1;  // 2^e <= bytes < 2^(e+1), e >= 2
  return 4 * static_cast<size_t>(e) + ((bytes >> (e - 2)) & 3);
}

size_t Tuner::class_bytes(size_t cls) {
  if (cls < 4) return cls;
  // size_class() never gives 4..7 (4..7 bytes are classes 8..11); their table entries are filled
  // anyway, as 4 bytes, since the formula below would shift by e - 2 = -1.
  if (cls < 8) return 4;
  const size_t e = cls / 4;
  return (4 + cls % 4) << (e - 2);
}

void Tuner::tabulate() {
  for (const auto& f : algorithms::all_facts()) {
    auto& row = choice_[static_cast<size_t>(f.kind)];
    row.clear();
    const auto& all = algorithms::all_algorithms();
    if (std::none_of(all.begin(), all.end(),
                     [&](const Algorithm& a) { return a.kind == f.kind && a.cost && usable(a); }))
      continue;  // nothing modelled: the collective's default runs
    row.resize(kClasses);
    for (size_t cls = 0; cls < kClasses; ++cls) row[cls] = cheapest(f.kind, class_bytes(cls));
  }
}

void Tuner::set_costs(const Costs& costs) {
  in_.costs = costs;
  tabulate();
  generation_.v.fetch_add(1, std::memory_order_release);
}

const Algorithm* Tuner::pick(const algorithms::Args& args, bool registered) const {
  const size_t bytes = args.count * dtype_size(args.dtype);
  auto is_registered = [](const Algorithm* a) {
    return a->run == algorithms::registered_allreduce;
  };
  if (auto it = forced_.find(args.kind); it != forced_.end())
    for (const auto* a : it->second)
      if (bytes <= a->max_bytes && (registered || !is_registered(a))) return a;
  if (setup_.size <= 1) return &default_algorithm(args.kind);
  // An algorithm the model does not describe may take the call by its rule (the registered
  // allreduce on one host while there is registered memory, the hierarchical one across hosts,
  // the window's barrier).
  const bool any_registered = registered && registered_.v.load(std::memory_order_relaxed);
  for (const auto* a : rules_[static_cast<size_t>(args.kind)])
    if (bytes <= a->max_bytes && (any_registered || !is_registered(a)) && a->rule(in_, bytes))
      return a;
  const auto& row = choice_[static_cast<size_t>(args.kind)];
  if (row.empty()) return &default_algorithm(args.kind);
  const Algorithm* a = row[size_class(bytes)];
  // A class's choice was made at its smallest size; one with a size limit inside the class (flat)
  // is checked against the call's own size.
  if (a && bytes <= a->max_bytes) return a;
  a = cheapest(args.kind, bytes);
  return a ? a : &default_algorithm(args.kind);
}

size_t Tuner::choose_segment(const Algorithm& algorithm, size_t bytes) const {
  if (forced_segment_ > 0) return forced_segment_;
  if (algorithm.segment) return algorithm.segment(in_, bytes);
  return setup_.link.segment_bytes;
}

Plan Tuner::choose(const algorithms::Args& args) const {
  Plan plan;
  if (args.wire != Wire::none) {
    // Coded: every rank sends to every peer, and the links cut the messages themselves.
    plan.algorithm = coded_[static_cast<size_t>(args.kind)];
    if (!plan.algorithm)
      throw InvalidArgument(std::string(algorithms::collective_name(args.kind)) +
                            " has no coded algorithm");
    const size_t bytes = args.count * dtype_size(args.dtype);
    plan.channels = bytes / static_cast<size_t>(std::max(setup_.size, 1)) >= (size_t{4} << 20)
                        ? setup_.channels
                        : 1;
    plan.segment_bytes = setup_.link.segment_bytes;
    return plan;
  }
  plan.algorithm = pick(args, true);
  if (plan.algorithm->run == algorithms::registered_allreduce) plan.fallback = pick(args, false);
  const size_t bytes = args.count * dtype_size(args.dtype);
  const size_t per_step = ring_step(args.kind, bytes);
  // Channels only pay when there is enough data for every ring to stream.
  plan.channels = per_step >= (size_t{4} << 20) ? setup_.channels : 1;
  // Shared memory forwards a slice the moment it arrives only if the schedule is posted slice by
  // slice (otherwise the forwards queue behind a whole chunk of first sends and go through DRAM);
  // TCP from a step size (KindTraits::sliced_from_step_bytes).
  plan.sliced = setup_.link.sliced(per_step);
  // Out of place, a large output is not in cache and is not read again by this call: streaming
  // stores skip reading each line before writing it. Interleaved medians of 3 rounds, 64 and
  // 256 MiB, busbw GB/s, ordinary -> streaming: out of place N=2 5.2 -> 9.0, N=4 3.8 -> 6.0,
  // N=8 1.8 -> 2.7; in place (the output lines were just read as input, so they are cached)
  // within noise either way, so in place keeps ordinary stores (docs/PERFORMANCE.md).
  plan.stream_output =
      setup_.link.stream_output && args.send != args.recv && bytes >= stream_min_bytes_;
  plan.segment_bytes = choose_segment(*plan.algorithm, bytes);
  return plan;
}

}  // namespace ringreduce::tuner
