// The torch backend's part in keeping a job alive (torch 2.14's c10d::Backend fault-tolerance
// contract, built where its headers define C10D_BACKEND_HAS_RECONFIGURE): shrink_group over
// Communicator::shrink, split over a new communicator through the store torch gives, reconfigure
// over Endpoint handles and Communicator::from_handles, and abort, shutdown, get_error,
// set_timeout and abort hooks over the communicator's own. On torch 1.13 and 2.6 only adopt()
// and the hooks' runner are compiled: their torch has none of these calls (docs/PYTHON.md).
#include <algorithm>

#include "torch_group.h"

namespace ringreduce::torch_backend {
namespace {

// Runs f without the GIL: torch's bindings of some of these calls release it already (newer
// pybind11 asserts that a release finds it held).
template <class F>
void without_gil(F&& f) {
  if (PyGILState_Check()) {
    py::gil_scoped_release nogil;
    f();
  } else {
    f();
  }
}

}  // namespace

void RingreduceGroup::adopt(std::unique_ptr<rr::Communicator> comm) {
  if (comm_) retired_.push_back(std::move(comm_));
  comm_ = std::move(comm);
#ifdef C10D_BACKEND_HAS_RECONFIGURE
  // A reconfigure changes them (torch reads the group's rank and size from its backend). Before,
  // only constructors adopt, with the rank and size they gave the base (and torch 1.13's are
  // const).
  rank_ = comm_->rank();
  size_ = comm_->size();
#endif
  comm_->on_abort([this](std::exception_ptr) { run_abort_hooks(); });
}

void RingreduceGroup::run_abort_hooks() {
  std::vector<std::function<void()>> hooks;
  {
    std::lock_guard<std::mutex> lk(hooks_mu_);
    for (auto& [id, h] : hooks_) hooks.push_back(h);
  }
  // torch's hooks may be Python functions: their wrapper takes the GIL itself.
  for (auto& h : hooks) {
    try {
      h();
    } catch (...) {  // a hook's failure is its own; the abort goes on
    }
  }
}

#ifdef C10D_BACKEND_HAS_HOOKS
void RingreduceGroup::registerAbortHook(int64_t hook_id, c10d::AbortHook hook) {
  std::lock_guard<std::mutex> lk(hooks_mu_);
  hooks_[hook_id] = std::move(hook);
}

void RingreduceGroup::unregisterAbortHook(int64_t hook_id) {
  std::lock_guard<std::mutex> lk(hooks_mu_);
  hooks_.erase(hook_id);
}
#endif

#ifdef C10D_BACKEND_HAS_RECONFIGURE

c10::intrusive_ptr<c10d::Backend> RingreduceGroup::shrink(
    const std::vector<int64_t>& ranks_to_exclude, int shrink_flags,
    const c10::intrusive_ptr<Options>& opts) {
  const std::vector<int> exclude(ranks_to_exclude.begin(), ranks_to_exclude.end());
  // torch passes SHRINK_DEFAULT (0) or SHRINK_ABORT (1), as ncclCommShrink's flags; another
  // value is the library's InvalidArgument on every survivor.
  const auto flags = static_cast<rr::ShrinkFlags>(shrink_flags);
  const std::chrono::milliseconds timeout =
      opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  std::unique_ptr<rr::Communicator> child;
  // An agreement among the survivors, then their links.
  without_gil([&] { child = std::make_unique<rr::Communicator>(comm().shrink(exclude, flags)); });
  return c10::make_intrusive<RingreduceGroup>(std::move(child), timeout);
}

c10::intrusive_ptr<c10d::Backend> RingreduceGroup::split(
    const c10::intrusive_ptr<c10d::Store>& store, const std::vector<int>& ranks,
    const c10::intrusive_ptr<Options>& opts) {
  // Like gloo's: only the new group's members take part, through the store torch gives (a prefix
  // of the parent's), so the parent's other ranks need not call anything.
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  check(me != ranks.end(), Call{rank_, "split"},
        "this rank is not among the ranks of the new group");
  const std::chrono::milliseconds timeout =
      opts && opts->timeout.count() > 0 ? opts->timeout : timeout_;
  c10::intrusive_ptr<c10d::Backend> group;
  without_gil([&] {
    group = c10::make_intrusive<RingreduceGroup>(store, static_cast<int>(me - ranks.begin()),
                                                 static_cast<int>(ranks.size()), timeout);
  });
  return group;
}

c10d::ReconfigureHandle RingreduceGroup::get_reconfigure_handle() const {
  // One endpoint until a reconfigure uses it: asking twice gives the same handle.
  if (!endpoint_) {
    rr::Options o;
    o.timeout = timeout_;
    endpoint_ = std::make_unique<rr::Endpoint>(o);
  }
  return endpoint_->handle();
}

c10::intrusive_ptr<c10d::Work> RingreduceGroup::reconfigure(const c10d::ReconfigureOptions& opts) {
  const Call c{rank_, "reconfigure"};
  check(std::find(uuids_.begin(), uuids_.end(), opts.uuid) == uuids_.end(), c,
        "uuid " + std::to_string(opts.uuid) +
            " was used before on this process group: pass a fresh one on every reconfigure");
  check(endpoint_ != nullptr, c,
        "this rank has no handle to reconfigure with: call get_reconfigure_handle() first and "
        "pass what every member's returned");
  std::vector<std::string> handles;
  if (const auto* list = std::get_if<std::vector<c10d::ReconfigureHandle>>(&opts.handles)) {
    handles = *list;
  } else {
    // A set: the backend chooses the ranks; every member sorts the same set alike.
    const auto& set = std::get<std::unordered_set<c10d::ReconfigureHandle>>(opts.handles);
    handles.assign(set.begin(), set.end());
    std::sort(handles.begin(), handles.end());
  }
  rr::Options o;
  o.timeout = opts.timeout.value_or(timeout_);
  std::exception_ptr error;
  try {
    std::unique_ptr<rr::Endpoint> endpoint = std::move(endpoint_);
    std::unique_ptr<rr::Communicator> comm;
    without_gil([&] {
      comm = std::make_unique<rr::Communicator>(rr::Communicator::from_handles(
          std::move(*endpoint), static_cast<uint64_t>(opts.uuid), handles, o));
    });
    uuids_.push_back(opts.uuid);
    adopt(std::move(comm));
    timeout_ = o.timeout.value_or(timeout_);
  } catch (...) {
    error = std::current_exception();
  }
  return WorkRR::done(work(c10d::OpType::UNKNOWN, {}), error);
}

c10::intrusive_ptr<c10d::Backend::Options> RingreduceGroup::getBackendOptions() {
  // What ProcessGroup::splitGroup clones for the new group's backend: the name and the timeout.
  return c10::make_intrusive<Options>("ringreduce", timeout_);
}

c10d::ErrorType RingreduceGroup::getError() {
  if (!comm_) return c10d::ErrorType::SUCCESS;
  const std::exception_ptr e = comm_->error();
  if (!e) return c10d::ErrorType::SUCCESS;
  try {
    std::rethrow_exception(e);
  } catch (const rr::TimeoutError&) {
    return c10d::ErrorType::TIMEOUT;
  } catch (const rr::PeerError&) {
    return c10d::ErrorType::REMOTE_ERROR;  // a peer died, or failed and said why
  } catch (...) {
  }
  return c10d::ErrorType::COMM_ERROR;
}

void RingreduceGroup::abort() {
  // Returns at once; pending Works fail with the reason, the peers learn it.
  if (comm_) comm_->abort("the process group was aborted (Backend.abort)");
}

void RingreduceGroup::shutdown() {
  // torch's destroy_process_group. Not an abort: that would tell the peers, and fail a peer's
  // call still finishing with data this rank has already sent (seen: a survivor done with its
  // last allreduce shut down while another was still in it). The communicator ends with this
  // group (never waiting for peers); until then calls say the group was shut down.
  if (comm_) retired_.push_back(std::move(comm_));
  shut_down_ = true;
}

void RingreduceGroup::setTimeout(std::chrono::milliseconds timeout) {
  timeout_ = timeout;
  if (comm_) comm_->set_timeout(timeout);
}

#endif  // C10D_BACKEND_HAS_RECONFIGURE

}  // namespace ringreduce::torch_backend
