// The communicator's machinery: op queue, progress driving, error handling.
//
// Progress is driven by whichever thread waits. A blocking call runs its op in the calling thread
// (no hand-off to another thread, which on a machine whose idle cores halt would cost tens of µs
// per wake-up). Async ops are run by a progress thread, started on the first async call, while the
// caller computes; if the caller waits on one and no thread is driving, it drives itself.
// Exactly one thread drives at a time (`driving_`), and ops run strictly in issue order.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "algorithms/algorithm.h"
#include "comm/stall_monitor.h"
#include "core/config.h"
#include "core/mapping.h"
#include "ringreduce/communicator.h"
#include "ringreduce/store.h"
#include "transport/engine.h"
#include "transport/link.h"
#include "tuner/tuner.h"

namespace ringreduce::reduce {
class DeviceRuntime;
}
namespace ringreduce::transport {
struct Listeners;
}  // namespace ringreduce::transport

namespace ringreduce::rendezvous {
class TcpStoreServer;
class FailFastStore;
}  // namespace ringreduce::rendezvous

namespace ringreduce::detail {

class DeviceStage;
class StagingPool;

struct OpState {
  // A point-to-point op: `p2p` is its request, run by the engine's P2p beside the queue (its own
  // matching space, no sequence number).
  bool is_p2p = false;
  transport::P2pRequest p2p;
  algorithms::Args args;
  tuner::Plan plan;
  transport::OpTag tag;
  std::chrono::milliseconds timeout{0};
  double premul_factor = 1.0;  // ReduceOp::premul_sum (CallOptions)
  // CallOptions::wire as the caller set it (validate refuses it on a call it cannot apply to);
  // what the call runs with is args.wire.
  std::optional<Wire> wire_requested;
  bool async = false;
  CommImpl* comm = nullptr;
  // Guarded by CommImpl::mu_; `finished` may be read without it.
  std::atomic<bool> finished{false};
  std::exception_ptr error;
  // Work::then's callback. Its own lock, not CommImpl::mu_: then() may be called after the
  // communicator is gone. `fired`: the completer has taken (or found no) callback; set once,
  // after `finished`.
  std::mutex callback_mu;
  std::function<void(std::exception_ptr)> callback;
  bool fired = false;
  // A call on device memory: its host staging and stream (device.h); released when the op
  // completes, before its callback.
  std::shared_ptr<DeviceStage> stage;
  // RINGREDUCE_TIMELINE: when a point-to-point op was submitted (0: not traced).
  double traced_since_us = 0;
};

// The settings every rank of a communicator must agree on, as "NAME=value" lines (the join's
// record, rendezvous/join.h).
std::string agreed_settings(const core::Config& config);

// This thread's CPU time in ms (the start-up's accounts).
int64_t thread_cpu_ms();

// Runs op's then() callback, if any, once; called without CommImpl::mu_ after op finished.
void fire_callback(OpState& op);

// A send or receive's arguments (Communicator::send / recv).
struct P2pArgs {
  bool send = false;
  void* buf = nullptr;
  size_t count = 0;
  DataType dtype = DataType::u8;
  int peer = -1;  // the destination, or the source (transport::kAnySource: any)
  uint64_t tag = 0;
};

// Who the members are and how to reach them: what a join through the store yields
// (bootstrap.cc), or what was decided without one: by the survivors' agreement (shrink.cc) or by
// handles exchanged out of band (membership.cc, Communicator::from_handles).
struct Membership {
  uint64_t comm_id = 0;
  std::vector<std::string> hosts;      // every member's host identity, by rank
  std::vector<std::string> published;  // what every member published (its listeners), by rank
  transport::Listeners* listeners = nullptr;  // this rank's (the TCP and control ones are taken)
  // A shrink's: the parent's measured link costs, and the kind they describe.
  std::optional<tuner::Costs> costs;
  std::string cost_kind;
  std::vector<int> parent_ranks;  // a shrink's: each member's rank in the parent
  // Throws when the members are known to have failed (the job's mark in the store; a member's
  // control connection closing): the links' start-up waits look at it between their slices.
  std::function<void()> check_failed;
};

// What a communicator made by split(), shrink() or from_handles() takes from where it came from:
// the parent's store (no new rendezvous server; null for from_handles), how to reach it for stall
// reports, the data interface's host, the job's ranks on this host (its cores are shared with
// the other groups), and the store server, which must live as long as any communicator using it.
struct SplitFrom {
  std::shared_ptr<Store> store;
  std::function<std::shared_ptr<Store>()> stall_store;
  std::string store_host;
  int local_size = -1;
  std::shared_ptr<rendezvous::TcpStoreServer> server;
  // Members known already (shrink, from_handles): no join.
  const Membership* membership = nullptr;
  // The job's namespace in the store (grow's rendezvous with newcomers); null: store itself.
  std::shared_ptr<Store> job_store;
};

struct ControlChannel;

// Communicator's Endpoint (membership.cc): the settings, this rank's listeners and its handle.
struct EndpointImpl {
  // host_of_store: the store's host, which picks the interface (else options.addr's, else the
  // launcher's).
  explicit EndpointImpl(const Options& options,
                        std::optional<std::string> host_of_store = std::nullopt);
  ~EndpointImpl();  // where Listeners is complete
  std::map<std::string, std::string> overrides;
  core::Config config;
  std::string store_host;  // what picked the interface (the launcher's store, or "")
  std::unique_ptr<transport::Listeners> listeners;
  std::string handle;
};
// The overrides an Options stands for (bootstrap.cc).
std::map<std::string, std::string> overrides_from(const Options& o);

class CommImpl {
 public:
  explicit CommImpl(const Options& options, const SplitFrom* from = nullptr);
  ~CommImpl();

  int rank() const { return rank_; }
  int size() const { return size_; }
  uint64_t sequence_number() {
    std::lock_guard<std::mutex> lk(mu_);
    return next_seq_ - 1;
  }

  // device: whether the call is on device memory, when the caller has asked already
  // (DeviceStage::wanted asks the CUDA driver about each buffer).
  std::shared_ptr<OpState> submit(const algorithms::Args& args, const CallOptions& call, bool async,
                                  std::optional<bool> device = std::nullopt);
  // A blocking call: runs in the calling thread, from an OpState on its stack, unless other ops
  // are queued or running (then it waits its turn like submit() + wait()). The path every
  // training step's small allreduces take, so it allocates nothing and builds no strings.
  void call(const algorithms::Args& args, const CallOptions& call);
  // A send or receive: handed to the engine's P2p at once, beside the collectives' queue. With
  // async the progress thread drives it while nobody waits; without, the caller is about to.
  std::shared_ptr<OpState> submit_p2p(const P2pArgs& args, const CallOptions& call, bool async);
  // Waits for op; with a timeout, returns false if it has not finished by then.
  bool wait(OpState& op, std::optional<std::chrono::milliseconds> timeout);
  void abort(const std::string& reason);
  // The error that aborted the communicator (an op's failure, abort(), a shrink), or null.
  std::exception_ptr error();
  // The default timeout of later calls (Options::timeout, RINGREDUCE_TIMEOUT).
  void set_timeout(std::chrono::milliseconds timeout);
  // Communicator::on_abort.
  void on_abort(std::function<void(std::exception_ptr)> fn);
  // Fault-tolerant agreement among the ranks still alive (agree.h; Communicator::agree).
  Agreement agree(bool flag, const CallOptions& call);
  // ncclCommShrink / MPIX_Comm_shrink, among the ranks still alive (shrink.cc;
  // Communicator::shrink).
  std::unique_ptr<CommImpl> shrink(std::span<const int> exclude, ShrinkFlags flags,
                                   const CallOptions& call);
  // For a communicator made by shrink(): each rank's rank in the parent (empty otherwise).
  const std::vector<int>& parent_ranks() const { return parent_ranks_; }
  // MPI_Comm_split / ncclCommSplit, collective over this communicator: the ranks that pass one
  // color form a new communicator, ordered by key (then by rank), through this one's store. Null
  // for color < 0 (Communicator::kNoColor).
  std::unique_ptr<CommImpl> split(int color, int key);
  // The tuner's link and reduction costs, in RINGREDUCE_TUNING_FILE's format.
  std::string tuning() const;
  // Communicator::alloc / free (memory.cc): collectives.
  void* alloc(size_t bytes);
  void free(void* p);

  static Work make_work(std::shared_ptr<OpState> s) { return Work(std::move(s)); }
  // Communicator::from_handles (membership.cc); job_store (may be null): the store a grown
  // communicator keeps for its stall reports, splits and later grows.
  static std::unique_ptr<CommImpl> from_handles(EndpointImpl& endpoint, uint64_t uuid,
                                                std::span<const std::string> handles,
                                                const Options& options,
                                                std::shared_ptr<Store> job_store = nullptr,
                                                const std::string& prefix = "");
  // Communicator::grow and Communicator::join (grow.cc).
  std::unique_ptr<CommImpl> grow(const std::string& name, int newcomers, const CallOptions& call);
  static std::unique_ptr<CommImpl> join(const std::string& name, const Options& options);

 private:
  // Fills in plan and tag (all but the sequence number).
  // Everything the constructor does; its errors get the rank's prefix there: this rank's
  // settings, the store, the join (bootstrap.cc), then build().
  void init(const Options& options, const SplitFrom* from);
  // What init() has read of this rank's settings, and when start-up began and joined (for the
  // "communicator ready" line: where start-up spends its time, and the CPU this thread spent,
  // since where ranks crowd the cores the wall time is mostly other ranks' turns).
  struct StartSettings {
    int64_t channels = 1;
    double stall_s = 0;
    std::string token;
    core::Deadline deadline = core::Deadline::never();
    struct {
      core::Clock::time_point begin, joined;
      int64_t cpu_begin = 0, cpu_joined = 0;
    } clock;
  };
  // The links, the tuner and its costs, the control plane and the stall monitor, once the members
  // are known (runtime.cc).
  void build(const Membership& members, const StartSettings& st, int local_size);
  // This rank's host identity (RINGREDUCE_HOST_ID, or detected).
  std::string host_id() const;
  // A start-up failure: names the rank (the launcher's, if this rank's own settings did not
  // parse) and marks the job failed in the store, reaching it from the launcher's address if
  // start-up failed before connecting, so that the other ranks fail now rather than at their
  // timeout. Returns the error to throw.
  std::exception_ptr startup_failed(const Error& e, const Options& options, const SplitFrom* from);
  void prepare(OpState& op, const algorithms::Args& args, const CallOptions& call, bool async);
  // What validate() and prepare() read of a call, all but its buffers' addresses: calls of one
  // shape get the same checks, plan and tag (but for the sequence number).
  struct CallShape {
    algorithms::Collective kind{};
    size_t count = 0;
    DataType dtype{};
    ReduceOp op{};
    int root = 0;
    bool send_null = false, recv_null = false, in_place = false;
    std::chrono::milliseconds timeout{0};
    double premul_factor = 1.0;
    std::optional<Wire> wire;
    uint64_t tuner_generation = 0;  // the tuner's state (Tuner::generation)
    bool operator==(const CallShape&) const = default;
  };
  // The shape of a blocking call on host memory; nullopt for one whose blocks have their own
  // sizes (the v-collectives), which call() checks and plans every time.
  std::optional<CallShape> shape_of(const algorithms::Args& args, const CallOptions& call) const;
  // Gives op the next sequence number (mu_ held); on a bad argument throws InvalidArgument and
  // gives the number back, so that the call is not issued at all.
  void number(OpState& op);
  void validate(const OpState& op) const;
  std::string describe(const transport::OpTag& tag) const;
  // Runs queued ops in order until `target` has finished (or, for the progress thread with
  // target == nullptr, until the head of the queue is a blocking op, or the queue is empty and no
  // point-to-point op is pending); with the queue empty it drives point-to-point ops.
  void drive(OpState* target);
  // Drives the engine while only point-to-point ops are pending, until target has finished
  // (target null: until none is pending), an op is queued, or the communicator stops.
  void drive_p2p(OpState* target);
  // The engine's P2p finished a request (the driving thread, without mu_).
  static void p2p_done(transport::P2pRequest* request, std::exception_ptr error);
  // After an error in the thread that drives: names its deepest cause, fails the transport and
  // every point-to-point request, and aborts the communicator. Returns the error to report.
  // Runs op's algorithm on args: whole, or piece by piece as its device staging has it.
  void run_algorithm(OpState& op, algorithms::Context& ctx, const algorithms::Args& args,
                     bool in_pieces);
  std::exception_ptr fail_communicator(std::exception_ptr error,
                                       const std::function<std::string()>& prefix,
                                       bool passed_on = false);
  void run(OpState& op);
  // Runs op's algorithm (or fails it if the communicator is aborted); returns its error.
  std::exception_ptr execute(OpState& op);
  void finish(OpState& op, std::exception_ptr error);
  void progress_loop();
  // Starts the progress thread if it is not running (mu_ held). Never once the destructor has
  // begun: it has taken the thread to join it, and a new one would be destroyed while joinable
  // (std::terminate). Callers check stop_ first and refuse the op.
  void start_progress_locked();
  // An op submitted while the communicator is being destroyed (from a callback the destructor
  // fires, say): the error its Work reports.
  std::exception_ptr destroyed_error(const std::string& what) const;
  // Gives up the driver role (mu_ held) and wakes whoever should drive or wait next.
  void release_driver();
  void* scratch(size_t bytes);
  // scratch() as an algorithm calls it (Context::scratch: no std::function to build per op).
  algorithms::Context::Scratch scratch_fn() {
    return {[](void* self, size_t bytes) { return static_cast<CommImpl*>(self)->scratch(bytes); },
            this};
  }
  // A call on device memory (device.h): stages op's device buffers through host memory on its
  // stream. For a collective, under mu_ once it has its number; a failure gives the number back.
  void stage_device(OpState& op, const CallOptions& call);
  // Whether op runs on its device buffers over device links rather than staged (device.cc).
  bool runs_on_device(const OpState& op, const CallOptions& call,
                      reduce::DeviceRuntime& runtime) const;
  // shrink()'s steps (shrink.cc): the checks of its arguments every rank makes alone, and one
  // attempt (agreement, links, commit), which returns null when a survivor died meanwhile.
  std::string shrink_refusal(std::span<const int> exclude, ShrinkFlags flags,
                             std::vector<bool>* excluded);
  std::unique_ptr<CommImpl> shrink_attempt(const std::vector<bool>& excluded,
                                           const std::string& exclude_text,
                                           const core::Deadline& deadline,
                                           std::chrono::milliseconds timeout);
  // Orders the ring by host (hosts: every rank's host identity).
  void ring_order(const std::vector<std::string>& hosts);
  // Several hosts: measures the network between two of them (rank 0 and the first rank after it
  // in the ring on another host) and tells the tuner; every rank reads the same result from the
  // store, so every rank's tuner decides alike.
  void probe_network(const std::vector<std::string>& hosts, const core::Deadline& deadline);
  // One host: measures the links every rank uses at once (a shift around the ring) and the
  // reduce kernel, and tells the tuner; rank 0's numbers go around the ring so that every rank's
  // tuner decides alike. RINGREDUCE_TUNING_FILE (read on rank 0) replaces the measurement.
  void probe_links(const core::Deadline& deadline);
  // Seconds per call of an allreduce algorithm on `count` floats in place, for the probes (the
  // op-less tag must be set).
  double time_probe_allreduce(algorithms::RunFn fn, float* buf, size_t count, int reps,
                              const core::Deadline& deadline);
  // Runs `fn` on `args` `reps` times on the op-less probe tag; seconds per run.
  double time_probe_op(algorithms::RunFn fn, algorithms::Args args, int reps,
                       const core::Deadline& deadline);
  // The costs RINGREDUCE_TUNING_FILE gives for this communicator's link kind and size, if any.
  std::optional<tuner::Costs> tuning_file_costs(const std::string& kind) const;
  // RINGREDUCE_TIMELINE (trace.cc): opens this rank's file once the rank is known; records a
  // collective that began at begin_us, and a point-to-point op as it completes.
  void open_timeline();
  void trace_op(const OpState& op, double begin_us, bool failed);
  void trace_p2p(const OpState& op, bool failed);

  std::map<std::string, std::string> overrides_;  // the Options as settings (config_'s source)
  core::Config config_;
  int rank_ = 0;
  bool rank_known_ = false;  // rank_ is this process's (start-up errors name it)
  int size_ = 1;
  std::string cost_kind_;  // the link kind the tuner's costs describe ("net" across hosts)
  // Read by calls in any thread; set_timeout() may change it.
  std::atomic<std::chrono::milliseconds> timeout_{std::chrono::milliseconds(300000)};
  std::shared_ptr<rendezvous::TcpStoreServer> store_server_;  // rank 0's, shared with splits
  std::shared_ptr<Store> store_;
  // The job's namespace in the store, whatever this communicator's own prefix (a split's, a
  // shrink's): where grow() and newcomers' join() meet (grow.cc). Null: no store (handles).
  std::shared_ptr<Store> job_store_;
  // store_ for start-up: its waits end when another rank marks the job failed (join.h).
  std::shared_ptr<rendezvous::FailFastStore> startup_store_;
  std::function<std::shared_ptr<Store>()> stall_store_;  // a client for the stall monitor
  std::string store_host_;
  int local_size_ = -1;
  long cores_ = 1;       // this host's online cores (start-up's idle policy, stall monitor, probe)
  uint64_t splits_ = 0;  // split() calls so far: the same on every rank
  // Before transport_, which records its waits into it: destroyed after it, closing the file.
  std::unique_ptr<core::Timeline> timeline_;
  double timeline_opened_us_ = 0;
  std::unique_ptr<transport::Engine> transport_;
  std::unique_ptr<tuner::Tuner> tuner_;
  // call()'s last checked and planned call (mu_). A training loop repeats a few calls; for a
  // 4-byte allreduce validate() and prepare() were a fifth of the call (docs/PERFORMANCE.md).
  struct CallMemo {
    CallShape shape;
    tuner::Plan plan;
    transport::OpTag tag;
  };
  std::optional<CallMemo> memo_;
  std::unique_ptr<char[]> scratch_;
  std::unique_ptr<StagingPool> staging_;  // made by the first call on device memory (mu_)
  size_t scratch_bytes_ = 0;
  // alloc()'s memory (memory.cc): in the window's regions (shared: registered with every peer),
  // or mapped privately where there is no window. next_region_ counts alloc() calls, the same on
  // every rank.
  struct Allocation {
    void* p = nullptr;
    size_t bytes = 0;
    uint32_t region = 0;
    bool in_window = false;  // a window region (the transport owns its mappings)
    bool shared = false;
    core::Mapping mapping;  // the private mapping, where there is no window
  };
  std::vector<Allocation> allocations_;
  uint32_t next_region_ = 0;
  // An allgather of k int64s from every rank (alloc, free), as a collective like any other.
  std::vector<int64_t> gather_i64(const int64_t* mine, size_t k);
  // Tells the tuner whether any allocation is registered with every rank.
  void set_registered();
  // What a shrink builds from (bootstrap.cc): the communicator's id, every rank's host and
  // what it published (its listeners), and the control plane the survivors talk over (null
  // with one rank).
  uint64_t comm_id_ = 0;
  std::vector<std::string> hosts_;
  std::vector<std::string> published_;
  std::unique_ptr<ControlChannel> control_;
  std::mutex ft_mu_;  // one agreement or shrink at a time
  std::vector<int> parent_ranks_;
  // The sequence number of the last collective that completed here (what agree() reports).
  std::atomic<uint64_t> completed_{0};
  std::vector<int> ring_;      // rank at each ring position (algorithms::Context::ring)
  std::vector<int> ring_pos_;  // position of each rank
  int host_size_ = 0;          // ranks per host if every host has as many, else 0

  std::mutex mu_;
  // Two condition variables, so that finishing an op wakes only threads that wait for one: a
  // needless wake-up of the progress thread costs the peer ranks a core for tens of µs.
  std::condition_variable done_cv_;      // Work::wait callers while another thread drives
  std::condition_variable progress_cv_;  // the progress thread
  int waiters_ = 0;
  std::deque<std::shared_ptr<OpState>> queue_;
  std::atomic<bool> queued_{false};  // !queue_.empty(), for a driver that is not holding mu_
  // Point-to-point ops handed to the engine and not finished, each kept alive here (guarded by
  // mu_); how many of them are async (the progress thread drives those).
  std::map<OpState*, std::shared_ptr<OpState>> p2p_ops_;
  size_t p2p_async_ = 0;
  // When the async ones pending began to be (p2p_async_ went above 0): the progress thread takes
  // them over kP2pGrace after, if nobody has waited for them by then.
  core::Clock::time_point p2p_async_since_{};
  static constexpr auto kP2pGrace = std::chrono::microseconds(200);
  uint64_t next_seq_ = 1;
  bool driving_ = false;
  bool stop_ = false;
  std::atomic<bool> stopping_{false};  // stop_, for a driver that is not holding mu_
  std::thread progress_thread_;
  std::atomic<bool> aborted_{false};
  std::exception_ptr abort_error_;  // guarded by mu_
  // on_abort's hook (mu_); taken, and run without mu_, by whoever aborts the communicator.
  std::function<void(std::exception_ptr)> abort_hook_;
  void run_abort_hook(std::exception_ptr error);
  // Last: stopped first, while everything its hooks use still exists. Null with one rank or
  // RINGREDUCE_STALL_WARN=0.
  std::unique_ptr<StallMonitor> stall_;
};

}  // namespace ringreduce::detail
