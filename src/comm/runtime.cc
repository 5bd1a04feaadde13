// What a communicator runs on, built once its members are known (by a join through the store,
// bootstrap.cc; by the survivors' agreement, shrink.cc; by handles, membership.cc): the ring's
// order by host, the links (the transport table), the tuner and its costs (the probes,
// calibrate.cc), the control plane a later shrink talks over, and the stall monitor.
#include <dirent.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>

#include "comm/agree.h"
#include "comm/comm_impl.h"
#include "comm/errors.h"
#include "core/log.h"
#include "ringreduce/error.h"
#include "transport/table.h"

namespace ringreduce::detail {
namespace {

size_t open_descriptors() {
  size_t n = 0;
  if (DIR* d = opendir("/proc/self/fd")) {
    while (readdir(d) != nullptr) ++n;
    closedir(d);
    n = n > 3 ? n - 3 : 0;  // ".", ".." and the directory's own
  }
  return n;
}

// The descriptors this rank's links will hold (`links`, each kind's estimate:
// transport::Routes::open_files), and some of its own (store, epoll, listeners): beside those
// already open (the application's, another communicator's). A short soft limit is raised towards
// the hard one (as ringrun does for itself; the default soft limit, 1,024, holds about 250
// same-host peers); where even the hard one is short the rank fails now, naming both, instead of
// meeting EMFILE halfway through its links.
void ensure_open_files(size_t links, const std::string& per_kind) {
  links += 32;
  const size_t open = open_descriptors();
  const rlim_t needed = static_cast<rlim_t>(links + open);
  // With room for the application's own files.
  if (core::raise_open_files_limit(needed, needed + 256) >= needed) return;
  rlimit l{};
  getrlimit(RLIMIT_NOFILE, &l);
  throw Error("its links need about " + std::to_string(links) + " open files (" + per_kind +
              ") beside the " + std::to_string(open) + " it has open, but its limit is " +
              std::to_string(l.rlim_cur) + " and the hard limit " + std::to_string(l.rlim_max) +
              " (raise it with ulimit -Hn, or LimitNOFILE in a systemd unit)");
}

}  // namespace

void CommImpl::build(const Membership& members, const StartSettings& st, int local_size) {
  const std::vector<std::string>& hosts = members.hosts;
  const std::vector<std::string>& published = members.published;
  const int64_t channels = st.channels;
  int same_host = 0;
  for (int q = 0; q < size_; ++q)
    same_host += hosts[static_cast<size_t>(q)] == hosts[static_cast<size_t>(rank_)] ? 1 : 0;
  if (local_size < 0) local_size = same_host;
  local_size_ = local_size;
  ring_order(hosts);
  // More ranks than cores on this host: polling steals the core from the rank that would
  // produce the data, so poll briefly and yield while doing it.
  const long cores = cores_ = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  const bool oversubscribed = local_size > 0 && local_size > cores;
  // Ranks per core on this host, rounded up (1 with cores to spare).
  const int crowding = oversubscribed ? static_cast<int>((local_size + cores - 1) / cores) : 1;
  transport::ConnectArgs args;
  args.rank = rank_;
  args.size = size_;
  args.comm_id = members.comm_id;
  args.channels = static_cast<int>(channels);
  if (size_ > 1) args.hosts = hosts;
  args.hosts_given = !config_.str("RINGREDUCE_HOST_ID").empty();
  args.token = st.token;
  args.store_host = store_host_;
  args.config = &config_;
  args.engine.rank = rank_;
  args.engine.size = size_;
  args.engine.channels = static_cast<int>(channels);
  args.engine.spin_us = config_.has("RINGREDUCE_SPIN_US")
                            ? static_cast<int>(config_.integer("RINGREDUCE_SPIN_US"))
                            : (oversubscribed ? 20 : 50);
  args.engine.oversubscribed = oversubscribed;
  args.check_failed = members.check_failed;
  // Enough yields for every rank that shares this core to run twice.
  if (oversubscribed) args.engine.max_idle_yields = 4 * crowding;
  // Every rank routes each pair alike (the transport table over the same host identities):
  // shared memory between the ranks of a host, TCP between hosts.
  // The kinds take no store: what they need is in the membership.
  transport::Routes routes = transport::route(args, published, members.listeners);
  {
    std::string per_kind;
    ensure_open_files(routes.open_files(args, &per_kind), per_kind);
  }
  transport_ = transport::connect(args, routes, st.deadline);
  const auto t_linked = core::Clock::now();
  const int64_t cpu_linked = thread_cpu_ms();
  transport_->set_describer([this](const transport::OpTag& t) { return describe(t); });
  tuner::Setup setup;
  setup.size = size_;
  setup.channels = static_cast<int>(channels);
  setup.link = transport_->traits();
  setup.window = transport_->window() != nullptr;
  setup.host_size = host_size_ < size_ ? host_size_ : 0;
  tuner_ = std::make_unique<tuner::Tuner>(config_, setup);
  const std::string kind = same_host < size_ ? "net" : transport_->traits().name;
  if (members.costs && members.cost_kind == kind) {
    // A shrink: the parent's measured costs, its links being of the same kind (the survivors'
    // are a subset of them). Probing again would cost ~100 ms.
    tuner_->set_costs(*members.costs);
    cost_kind_ = kind;
  } else if (same_host < size_ && startup_store_) {
    probe_network(hosts, st.deadline);
  } else if (same_host < size_) {
    // Across hosts the probe's result travels through the store, and there is none (handles)
    // or it may be gone (a shrink from another kind of links): the kind's defaults.
    RR_LOG(info, tune, rank_, "network costs: the defaults (no store to share a probe through)");
  } else if (size_ > 1) {
    probe_links(st.deadline);
  }
  // What a later shrink builds from: who is where, how to reach them without the store.
  comm_id_ = members.comm_id;
  hosts_ = hosts;
  published_ = published;
  if (size_ > 1 && members.listeners && members.listeners->ctl.valid()) {
    transport::ControlPlane::Options c;
    c.rank = rank_;
    c.size = size_;
    c.comm_id = members.comm_id;
    c.token = st.token;
    c.listener = std::move(members.listeners->ctl);
    c.nonce = members.listeners->ctl_nonce;
    for (const std::string& p : published)
      c.published.push_back(transport::published_part(p, "ctl="));
    control_ = std::make_unique<ControlChannel>(std::move(c));
  }
  // Always there with 2+ ranks: besides the warnings it finds mismatches no message shows.
  // (Not without a store: a communicator made from handles.)
  if (size_ > 1 && stall_store_)
    stall_ = std::make_unique<StallMonitor>(
        rank_, size_, std::chrono::milliseconds(static_cast<int64_t>(st.stall_s * 1000)),
        StallMonitor::Hooks{stall_store_, [this](const transport::OpTag& t) { return describe(t); },
                            [this](const std::string& reason) {
                              transport_->interrupt(reason, static_cast<int>(ErrorCode::mismatch));
                            }},
        crowding);
  if (timeline_) {
    // Start-up from the timeline's opening (the join, the links, the probes); the engine records
    // waits from here on, so that the probes' do not bury the first op.
    timeline_->complete(
        "init", "start-up", timeline_opened_us_, core::Timeline::now_us(),
        "\"size\":" + std::to_string(size_) + ",\"links\":\"" + transport_->kinds_text() + "\"");
    transport_->set_timeline(timeline_.get());
  }
  auto ms = [](core::Clock::time_point a, core::Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
  };
  const auto now = core::Clock::now();
  RR_LOG(info, init, rank_, "communicator ready: ", size_, " ranks over ", transport_->kinds_text(),
         "; start-up ", ms(st.clock.begin, now), " ms: join ", ms(st.clock.begin, st.clock.joined),
         ", links ", ms(st.clock.joined, t_linked), ", probe and monitor ", ms(t_linked, now),
         "; cpu ", st.clock.cpu_joined - st.clock.cpu_begin, " + ",
         cpu_linked - st.clock.cpu_joined, " + ", thread_cpu_ms() - cpu_linked, " ms");
}

void CommImpl::ring_order(const std::vector<std::string>& hosts) {
  // Hosts in the order of their lowest rank, each host's ranks in rank order. On one host (or
  // with ranks placed host by host, as launchers do by default) this is rank order.
  ring_.clear();
  std::vector<bool> placed(hosts.size(), false);
  for (size_t r = 0; r < hosts.size(); ++r) {
    if (placed[r]) continue;
    for (size_t q = r; q < hosts.size(); ++q)
      if (!placed[q] && hosts[q] == hosts[r]) {
        placed[q] = true;
        ring_.push_back(static_cast<int>(q));
      }
  }
  // Every host the same size? (Then host h holds ring positions h*size ...)
  host_size_ = 0;
  for (size_t p = 0; p < ring_.size(); ++p) {
    size_t run = 1;
    const auto& h = hosts[static_cast<size_t>(ring_[p])];
    while (p + run < ring_.size() && hosts[static_cast<size_t>(ring_[p + run])] == h) ++run;
    if (host_size_ == 0) host_size_ = static_cast<int>(run);
    if (static_cast<int>(run) != host_size_) {
      host_size_ = 0;
      break;
    }
    p += run - 1;
  }
  ring_pos_.assign(hosts.size(), 0);
  for (size_t p = 0; p < ring_.size(); ++p)
    ring_pos_[static_cast<size_t>(ring_[p])] = static_cast<int>(p);
}

}  // namespace ringreduce::detail
