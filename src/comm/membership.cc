// Communicators made from handles (Endpoint, Communicator::from_handles): torch's reconfigure
// and, through a store, how newcomers join (grow). Each rank opens its listeners first; its
// handle carries what a join record would (its host identity and what it published), and the
// list every member passes is the join's table, so the communicator is built (CommImpl::build)
// with no store at all.
//
// A handle: "ringreduce-handle 1", a random id, the host identity, what the rank published, one
// per line. The random id makes every endpoint's handle unique, so that a list naming one
// endpoint twice is caught even where two ranks share a host and a published address cannot
// (it can not: each listener has a port of its own; the id is the cheaper check).
#include <algorithm>
#include <random>

#include "comm/comm_impl.h"
#include "comm/errors.h"
#include "core/log.h"
#include "rendezvous/launch_env.h"
#include "ringreduce/error.h"
#include "transport/table.h"
#include "transport/topology.h"

namespace ringreduce::detail {
namespace {

constexpr const char* kMagic = "ringreduce-handle 1";

struct ParsedHandle {
  std::string id, host, published;
};

bool parse_handle(const std::string& h, ParsedHandle* out) {
  std::vector<std::string> lines;
  size_t at = 0;
  for (int i = 0; i < 4; ++i) {
    const size_t nl = h.find('\n', at);
    lines.push_back(h.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    if (nl == std::string::npos) break;
    at = nl + 1;
  }
  if (lines.size() != 4 || lines[0] != kMagic || lines[1].empty() || lines[2].empty() ||
      transport::published_part(lines[3], "ctl=").empty())
    return false;
  *out = {lines[1], lines[2], lines[3]};
  return true;
}

uint64_t mix(uint64_t h, const std::string& s) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return (h ^ 0xff) * 0x100000001b3ull;  // a separator, so that ["ab","c"] and ["a","bc"] differ
}

}  // namespace

EndpointImpl::EndpointImpl(const Options& options, std::optional<std::string> host_of_store)
    : overrides(overrides_from(options)), config(overrides) {
  // The interface: as a communicator joining through the launcher's store would pick it.
  if (host_of_store) {
    store_host = *host_of_store;
  } else if (options.addr) {
    const std::string& a = *options.addr;
    store_host = a.substr(0, a.rfind(':'));
    if (store_host.size() >= 2 && store_host.front() == '[') {
      store_host = store_host.substr(1, store_host.size() - 2);
    }
  } else {
    store_host = rendezvous::launch_hints(config).store_host;
  }
  listeners =
      std::make_unique<transport::Listeners>(config, config.str("RINGREDUCE_TOKEN"), store_host);
  std::random_device rd;
  char id[17];
  std::snprintf(id, sizeof id, "%08x%08x", rd(), rd());
  const std::string host = config.str("RINGREDUCE_HOST_ID").empty()
                               ? transport::host_identity()
                               : "id:" + config.str("RINGREDUCE_HOST_ID");
  handle = std::string(kMagic) + "\n" + id + "\n" + host + "\n" + listeners->published();
}

EndpointImpl::~EndpointImpl() = default;

std::unique_ptr<CommImpl> CommImpl::from_handles(EndpointImpl& endpoint, uint64_t uuid,
                                                 std::span<const std::string> handles,
                                                 const Options& options,
                                                 std::shared_ptr<Store> job_store,
                                                 const std::string& prefix) {
  const std::string me = "from_handles: ";
  if (!endpoint.listeners)
    throw InvalidArgument(me + "this endpoint was used already (a fresh one per communicator)");
  Membership m;
  int rank = -1;
  uint64_t id = mix(0xcbf29ce484222325ull, std::to_string(uuid));
  std::vector<std::string> ids;
  for (size_t i = 0; i < handles.size(); ++i) {
    ParsedHandle p;
    if (!parse_handle(handles[i], &p))
      throw InvalidArgument(me + "handles[" + std::to_string(i) +
                            "] is not a handle (Endpoint::handle() gives them)");
    if (std::find(ids.begin(), ids.end(), p.id) != ids.end())
      throw InvalidArgument(me + "handles[" + std::to_string(i) + "] is in the list twice");
    ids.push_back(p.id);
    if (handles[i] == endpoint.handle) rank = static_cast<int>(i);
    m.hosts.push_back(p.host);
    m.published.push_back(p.published);
    id = mix(id, handles[i]);
  }
  if (rank < 0)
    throw InvalidArgument(me + "this rank's handle is not among the " +
                          std::to_string(handles.size()) + " handles");
  m.comm_id = id;
  m.listeners = endpoint.listeners.get();
  SplitFrom from;
  from.store_host = endpoint.store_host;
  from.membership = &m;
  if (job_store) {
    from.store = job_store;
    from.job_store = job_store;
    from.stall_store = [job_store] { return job_store; };
  }
  Options o = options;
  o.store_prefix = prefix.empty() ? "handles" : prefix;
  o.rank = rank;
  o.world_size = static_cast<int>(handles.size());
  o.settings = endpoint.overrides;
  for (const auto& [k, v] : options.settings) o.settings[k] = v;
  std::unique_ptr<CommImpl> comm;
  try {
    comm = std::make_unique<CommImpl>(o, &from);
  } catch (const Error& e) {
    std::rethrow_exception(with_prefix(e, "rank " + std::to_string(rank) + ": from_handles: ", ""));
  }
  endpoint.listeners.reset();  // taken by the communicator's links (or closed with it)
  return comm;
}

}  // namespace ringreduce::detail
