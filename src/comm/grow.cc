// Adding ranks to a running job (ncclCommGrow): the members choose the point by calling
// grow(name, k) together; k new processes call Communicator::join(name). They meet in the job's
// store under "grow/<name>/": everyone opens an Endpoint and leaves its handle there, a newcomer
// after taking a slot (the order they arrive in is the order of their ranks); member 0 waits for
// all of them and writes the table (a fresh uuid and every handle: members in rank order, then
// newcomers by slot), and everyone makes the communicator from it (membership.cc). A replacement
// for a rank that died is a newcomer like any other: it takes the next rank, not the dead one's.
//
// The store authenticates every client, and the data and control connections prove the token
// as well, so a process without the job's RINGREDUCE_TOKEN cannot join: the store refuses it,
// and the members, waiting for it, time out naming the slot it did not fill.
#include <algorithm>
#include <random>

#include "comm/comm_impl.h"
#include "comm/errors.h"
#include "core/log.h"
#include "core/security.h"
#include "rendezvous/launch_env.h"
#include "ringreduce/error.h"

namespace ringreduce::detail {
namespace {

constexpr const char* kTableMagic = "ringreduce-grow 1";

std::vector<uint8_t> bytes(const std::string& s) {
  return {s.begin(), s.end()};
}
std::string text(const std::vector<uint8_t>& v) {
  return {v.begin(), v.end()};
}

// The table: the magic, then "ok", the uuid and the handles (each as its length, a newline and
// itself: handles hold newlines), or "error" and why (a member's arguments differ).
struct Table {
  std::string error;
  uint64_t uuid = 0;
  std::vector<std::string> handles;
};

std::string encode(const Table& t) {
  std::string s = std::string(kTableMagic) + "\n";
  if (!t.error.empty()) return s + "error\n" + t.error;
  s += "ok\n" + std::to_string(t.uuid) + "\n" + std::to_string(t.handles.size()) + "\n";
  for (const auto& h : t.handles) s += std::to_string(h.size()) + "\n" + h;
  return s;
}

Table decode(const std::string& s) {
  Table t;
  size_t at = 0;
  auto line = [&] {
    const size_t nl = s.find('\n', at);
    if (nl == std::string::npos) throw Error("grow: an unreadable table in the store");
    std::string l = s.substr(at, nl - at);
    at = nl + 1;
    return l;
  };
  if (line() != kTableMagic) throw Error("grow: an unreadable table in the store");
  if (line() == "error") {
    t.error = s.substr(at);
    return t;
  }
  t.uuid = std::stoull(line());
  const size_t n = std::stoul(line());
  for (size_t i = 0; i < n; ++i) {
    const size_t len = std::stoul(line());
    if (s.size() - at < len) throw Error("grow: an unreadable table in the store");
    t.handles.push_back(s.substr(at, len));
    at += len;
  }
  return t;
}

// Waits for `keys`; a timeout names what did not come (`what(i)` for keys[i]).
void wait_for(Store& store, const std::vector<std::string>& keys, const core::Deadline& deadline,
              const std::function<std::string(size_t)>& what) {
  for (;;) {
    std::vector<std::string> missing;
    std::vector<size_t> which;
    for (size_t i = 0; i < keys.size(); ++i)
      if (!store.check({keys[i]})) missing.push_back(keys[i]), which.push_back(i);
    if (missing.empty()) return;
    if (deadline.expired()) {
      std::string names;
      for (size_t i : which) names += (names.empty() ? "" : ", ") + what(i);
      throw TimeoutError("timed out waiting for " + names);
    }
    try {
      store.wait(missing, std::chrono::milliseconds(std::min(deadline.remaining_ms(), 100)));
    } catch (const TimeoutError&) {  // looked again above, with what is missing named
    }
  }
}

}  // namespace

std::unique_ptr<CommImpl> CommImpl::grow(const std::string& name, int newcomers,
                                         const CallOptions& call) {
  const std::string me = "rank " + std::to_string(rank_) + ": grow '" + name + "'";
  const auto timeout = call.timeout.value_or(timeout_.load());
  const auto deadline = core::Deadline::after(timeout);
  if (!job_store_)
    throw InvalidArgument(me +
                          ": this communicator has no store (it was made from handles), and "
                          "newcomers find the job through one");
  if (name.empty() || name.find('/') != std::string::npos)
    throw InvalidArgument(me + ": the name must be non-empty, without '/'");
  if (newcomers < 0) throw InvalidArgument(me + ": " + std::to_string(newcomers) + " newcomers");
  Options o;
  o.settings = overrides_;
  EndpointImpl endpoint(o, store_host_);
  PrefixStore g(job_store_, "grow/" + name);
  g.set("member/" + std::to_string(rank_),
        bytes(std::to_string(newcomers) + "\n" + std::to_string(size_) + "\n" + endpoint.handle));
  if (rank_ == 0) {
    Table t;
    try {
      std::vector<std::string> keys;
      for (int q = 0; q < size_; ++q) keys.push_back("member/" + std::to_string(q));
      wait_for(g, keys, deadline, [](size_t i) {
        return "member rank " + std::to_string(i) + " (it did not call grow)";
      });
      for (int q = 0; q < size_; ++q) {
        const std::string v = text(g.get("member/" + std::to_string(q), timeout));
        const size_t a = v.find('\n'), b = v.find('\n', a + 1);
        const std::string theirs = v.substr(0, a), their_size = v.substr(a + 1, b - a - 1);
        if (theirs != std::to_string(newcomers) || their_size != std::to_string(size_))
          t.error = "member rank " + std::to_string(q) + " called grow with " + theirs +
                    " newcomers in a communicator of " + their_size + ", rank 0 with " +
                    std::to_string(newcomers) + " in one of " + std::to_string(size_) +
                    " (every member passes the same)";
        t.handles.push_back(v.substr(b + 1));
      }
      if (t.error.empty()) {
        keys.clear();
        for (int i = 0; i < newcomers; ++i) keys.push_back("new/" + std::to_string(i));
        wait_for(g, keys, deadline, [&](size_t i) {
          return "newcomer " + std::to_string(i + 1) + " of " + std::to_string(newcomers) +
                 " (never called Communicator::join('" + name +
                 "'), or the store refused it: a different RINGREDUCE_TOKEN?)";
        });
        for (int i = 0; i < newcomers; ++i)
          t.handles.push_back(text(g.get("new/" + std::to_string(i), timeout)));
        std::random_device rd;
        t.uuid = (static_cast<uint64_t>(rd()) << 32) ^ rd();
      }
    } catch (const Error& e) {
      // The other members wait for the table: it carries the reason to them.
      t.error = e.what();
    }
    g.set("table", bytes(encode(t)));
  }
  Table t;
  try {
    t = decode(text(g.get("table", std::chrono::milliseconds(deadline.remaining_ms()))));
  } catch (const TimeoutError&) {
    throw TimeoutError(me +
                       ": member rank 0 wrote no table within the timeout (it did not call "
                       "grow, or died)");
  }
  if (!t.error.empty()) throw InvalidArgument(me + ": " + t.error);
  RR_LOG(info, ft, rank_, "grow '", name, "': ", size_, " members and ", newcomers,
         " newcomer(s) make a communicator of ", t.handles.size());
  return from_handles(endpoint, t.uuid, t.handles, o, job_store_, "grow." + name);
}

std::unique_ptr<CommImpl> CommImpl::join(const std::string& name, const Options& options) {
  const std::string me = "join '" + name + "'";
  const core::Config config(overrides_from(options));
  const auto timeout = options.timeout.value_or(
      std::chrono::milliseconds(static_cast<int64_t>(config.number("RINGREDUCE_TIMEOUT") * 1000)));
  const auto deadline = core::Deadline::after(timeout);
  std::shared_ptr<Store> job_store;
  std::string store_host;
  if (options.store) {
    job_store = std::make_shared<PrefixStore>(options.store, options.store_prefix);
    store_host = "127.0.0.1";
  } else {
    const rendezvous::LaunchHints hints = rendezvous::launch_hints(config);
    if (hints.store_host.empty() || hints.store_port <= 0)
      throw InvalidArgument(me +
                            ": no store address: set RINGREDUCE_ADDR=host:port (or MASTER_ADDR "
                            "and MASTER_PORT) to the job's store");
    store_host = hints.store_host;
    std::shared_ptr<Store> tcp;
    try {
      tcp = rendezvous::connect_store(hints.store_host, hints.store_port, hints.torch_store,
                                      timeout, core::security_settings(config));
    } catch (const Error& e) {
      std::rethrow_exception(with_prefix(e, me + ": the job's store: ", ""));
    }
    const std::string job = rendezvous::job_id(config);
    job_store = std::make_shared<PrefixStore>(
        tcp, job.empty() ? options.store_prefix : options.store_prefix + "/" + job);
  }
  EndpointImpl endpoint(options, store_host);
  PrefixStore g(job_store, "grow/" + name);
  const int64_t slot = g.add("slots", 1) - 1;
  g.set("new/" + std::to_string(slot), bytes(endpoint.handle));
  Table t;
  try {
    t = decode(text(g.get("table", std::chrono::milliseconds(deadline.remaining_ms()))));
  } catch (const TimeoutError&) {
    throw TimeoutError(me + ": no member called grow('" + name + "') within the timeout");
  }
  if (!t.error.empty()) throw InvalidArgument(me + ": " + t.error);
  if (std::find(t.handles.begin(), t.handles.end(), endpoint.handle) == t.handles.end())
    throw InvalidArgument(me + ": this process came as newcomer " + std::to_string(slot + 1) +
                          ", and the members admit fewer");
  return from_handles(endpoint, t.uuid, t.handles, options, job_store, "grow." + name);
}

}  // namespace ringreduce::detail
