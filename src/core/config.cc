#include "core/config.h"

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "core/log.h"
#include "ringreduce/error.h"

extern char** environ;

namespace ringreduce::core {

const std::vector<SettingInfo>& all_settings() {
  static const std::vector<SettingInfo> kSettings = {
      {"RINGREDUCE_RANK", "", "this process's rank (else torchrun/OpenMPI/Slurm/PMI variables)"},
      {"RINGREDUCE_WORLD_SIZE", "", "number of ranks (else the launcher's variables)"},
      {"RINGREDUCE_ADDR", "",
       "rendezvous store host:port (else MASTER_ADDR:MASTER_PORT); rank 0 hosts it"},
      {"RINGREDUCE_TOKEN", "", "shared secret that authenticates store and data connections"},
      {"RINGREDUCE_ENCRYPT", "off",
       "encrypt and integrity-check TCP data and store connections: off, psk (keys from "
       "RINGREDUCE_TOKEN; "
       "AES-256-GCM or ChaCha20-Poly1305), tls (keys from a TLS 1.3 handshake with "
       "RINGREDUCE_TLS_KEY, _CERT, _CA)"},
      {"RINGREDUCE_TLS_KEY", "", "RINGREDUCE_ENCRYPT=tls: this rank's private key (PEM file)"},
      {"RINGREDUCE_TLS_CERT", "",
       "RINGREDUCE_ENCRYPT=tls: this rank's certificate (PEM file; the chain, the leaf first)"},
      {"RINGREDUCE_TLS_CA", "",
       "RINGREDUCE_ENCRYPT=tls: the CA every peer's certificate must be signed by (PEM file)"},
      {"RINGREDUCE_TIMEOUT", "300", "seconds any wait may take before a TimeoutError"},
      {"RINGREDUCE_STALL_WARN", "60",
       "seconds an op may wait before a warning lists the ranks that have not reached it (again at "
       "the timeout); 0: no stall reports"},
      {"RINGREDUCE_DEBUG", "WARN", "log level: WARN, INFO or TRACE"},
      {"RINGREDUCE_DEBUG_SUBSYS", "ALL",
       "subsystems whose INFO/TRACE lines show (warnings always do): init, coll, p2p, net, shm, "
       "store, tune, stall, env, ALL; ^ before the list excludes (^store,net)"},
      {"RINGREDUCE_DEBUG_FILE", "",
       "write log lines to this file instead of stderr (appended); %h: hostname, %p: pid"},
      {"RINGREDUCE_TIMELINE", "",
       "write a Chrome/Perfetto trace of every op, its phases and its waits on peers per rank: "
       "<value>.<rank>.json, or the value with %r (rank), %h (hostname), %p (pid) replaced; merge "
       "with ringreduce-timeline"},
      {"RINGREDUCE_ALGO", "", "force an algorithm, e.g. ring or allreduce:ring (default: tuner)"},
      {"RINGREDUCE_SEGMENT_BYTES", "", "pipeline segment size (default: chosen by the tuner)"},
      {"RINGREDUCE_WIRE", "none",
       "wire format of float32 allreduce, reduce_scatter, allgather: none, bf16, f16, fp8e4m3, "
       "fp8e5m2, auto"},
      {"RINGREDUCE_CHANNELS", "1", "independent rings over disjoint parts of the buffer"},
      {"RINGREDUCE_NSOCKS", "1",
       "TCP connections per link; > 1 stripes each message of 128 KiB or more over them (not in "
       "communicators that mix shared memory and TCP)"},
      {"RINGREDUCE_SOCKET_IFNAME", "",
       "network interface(s) for data sockets: eth0, ^docker,lo (exclude), =eth0 (exact)"},
      {"RINGREDUCE_SOCKET_FAMILY", "", "AF_INET or AF_INET6 to force an address family"},
      {"RINGREDUCE_SOCKET_BUFFER", "0",
       "SO_SNDBUF/SO_RCVBUF of data sockets; 0 leaves them to the kernel's autotuning"},
      {"RINGREDUCE_TUNING_FILE", "",
       "link and reduction costs for the tuner, as written by ringreduce-perf --calibrate (read on "
       "rank 0; default: measured at start-up)"},
      {"RINGREDUCE_PROBE_BATCHES", "3",
       "batches of the start-up link measurement; the best counts (ringreduce-perf --calibrate "
       "takes 30)"},
      {"RINGREDUCE_SOCKET_CC", "cubic",
       "TCP congestion control of data sockets (system: the kernel's default); cubic kept 1 Gbit/s "
       "links at 99-100% where bbr's probing cost 2-4% on long ring transfers"},
      {"RINGREDUCE_SPIN_US", "",
       "microseconds to poll before sleeping (default 50; with more ranks than cores a waiter "
       "yields instead and sleeps after 4 fruitless yields per rank sharing its core)"},
      {"RINGREDUCE_SHM", "1",
       "0: ranks on one host talk over TCP loopback instead of shared memory"},
      {"RINGREDUCE_SHM_CONNECT", "first",
       "how a host's ranks exchange their shared memory: first (through the host's first "
       "rank; N - 1 connections) or mesh (every pair; used anyway where ranks are in different "
       "pid namespaces)"},
      {"RINGREDUCE_DEVICE_LINKS", "auto",
       "device-to-device links between a host's ranks for calls on GPU buffers: auto (when the "
       "process uses CUDA as the communicator is made), 1 (insist), 0 (stage through host memory)"},
      {"RINGREDUCE_DEVICE_SLOT_BYTES", "8M",
       "bytes of each of the 4 slots of a device link's inbox (per ring neighbour, in GPU memory)"},
      {"RINGREDUCE_HOST_ID", "",
       "names this rank's host for the topology (default: hostname, boot id and network "
       "namespace); ranks with different ids use TCP between them, e.g. to emulate hosts"},
      {"RINGREDUCE_STORE_SERVER", "1", "0: rank 0 does not host the store (a standalone one runs)"},
      {"RINGREDUCE_JOB_ID", "",
       "this job's own namespace in the store (default: the launcher's job id: ringrun's, "
       "torchrun's run id, Slurm's job and step); two jobs on one reused store need two ids"},
  };
  return kSettings;
}

namespace {

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diag = up;
    }
  }
  return row[b.size()];
}

bool known_variable(const std::string& name) {
  for (const auto& s : all_settings())
    if (name == s.name) return true;
  for (const char* other : kOtherKnownVariables)
    if (name == other) return true;
  return false;
}

}  // namespace

std::string nearest_setting(const std::string& name) {
  std::string best;
  size_t best_d = SIZE_MAX;
  auto consider = [&](const char* candidate) {
    const size_t d = edit_distance(name, candidate);
    if (d < best_d) best_d = d, best = candidate;
  };
  for (const auto& s : all_settings()) consider(s.name);
  for (const char* other : kOtherKnownVariables) consider(other);
  // Past a third of the name, the nearest is a guess rather than a typo.
  return best_d <= std::max<size_t>(1, name.size() / 3) ? best : std::string();
}

std::vector<std::string> unknown_variables(const std::vector<std::string>& environment) {
  std::vector<std::string> lines;
  for (const std::string& entry : environment) {
    const std::string name = entry.substr(0, entry.find('='));
    if (!name.starts_with("RINGREDUCE_") || known_variable(name)) continue;
    const std::string near = nearest_setting(name);
    lines.push_back(name + " is not a ringreduce setting; " +
                    (near.empty() ? std::string("the settings are listed in README.md")
                                  : "did you mean " + near + "?"));
  }
  return lines;
}

void warn_unknown_variables(int rank) {
  static std::once_flag once;
  std::call_once(once, [rank] {
    std::vector<std::string> entries;
    for (char** e = environ; e && *e; ++e) entries.emplace_back(*e);
    for (const std::string& line : unknown_variables(entries)) RR_LOG(warn, env, rank, line);
  });
}

std::optional<std::string> env(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (v == nullptr) return std::nullopt;
  return std::string(v);
}

std::optional<uint64_t> parse_size(const std::string& text) {
  if (text.empty()) return std::nullopt;
  size_t pos = 0;
  uint64_t v = 0;
  while (pos < text.size() && text[pos] >= '0' && text[pos] <= '9') {
    uint64_t next = v * 10 + static_cast<uint64_t>(text[pos] - '0');
    if (next / 10 != v) return std::nullopt;  // overflow
    v = next;
    ++pos;
  }
  if (pos == 0) return std::nullopt;
  if (pos == text.size()) return v;
  if (pos + 1 != text.size() &&
      !(pos + 2 == text.size() && (text[pos + 1] == 'B' || text[pos + 1] == 'b')))
    return std::nullopt;
  int shift = 0;
  switch (text[pos]) {
    case 'k':
    case 'K':
      shift = 10;
      break;
    case 'm':
    case 'M':
      shift = 20;
      break;
    case 'g':
    case 'G':
      shift = 30;
      break;
    default:
      return std::nullopt;
  }
  if (v > (UINT64_MAX >> shift)) return std::nullopt;
  return v << shift;
}

Config::Config(const std::map<std::string, std::string>& overrides) {
  for (const auto& [name, value] : overrides) {
    bool known = false;
    for (const auto& s : all_settings()) known = known || name == s.name;
    if (!known) throw InvalidArgument("unknown setting '" + name + "' in Options::settings");
  }
  for (const auto& s : all_settings()) {
    if (auto it = overrides.find(s.name); it != overrides.end()) {
      values_[s.name] = {it->second, "options"};
    } else if (auto e = env(s.name); e && !e->empty()) {
      values_[s.name] = {*e, "environment"};
    } else {
      values_[s.name] = {s.default_value, "default"};
    }
  }
}

const Config::Value& Config::lookup(const std::string& name) const {
  auto it = values_.find(name);
  if (it == values_.end()) throw InvalidArgument("unknown setting '" + name + "'");
  return it->second;
}

std::string Config::str(const std::string& name) const {
  return lookup(name).value;
}
std::string Config::source(const std::string& name) const {
  return lookup(name).source;
}

uint64_t Config::size(const std::string& name) const {
  const Value& v = lookup(name);
  auto parsed = parse_size(v.value);
  if (!parsed)
    throw InvalidArgument(name + "='" + v.value + "' (from " + v.source +
                          ") is not a size such as 65536, 64K or 4M");
  return *parsed;
}

int64_t Config::integer(const std::string& name) const {
  const Value& v = lookup(name);
  try {
    size_t used = 0;
    int64_t r = std::stoll(v.value, &used);
    if (used == v.value.size()) return r;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(name + "='" + v.value + "' (from " + v.source + ") is not an integer");
}

double Config::number(const std::string& name) const {
  const Value& v = lookup(name);
  try {
    size_t used = 0;
    double r = std::stod(v.value, &used);
    if (used == v.value.size()) return r;
  } catch (const std::exception&) {
  }
  throw InvalidArgument(name + "='" + v.value + "' (from " + v.source + ") is not a number");
}

std::string Config::dump() const {
  std::ostringstream out;
  for (const auto& s : all_settings()) {
    const Value& v = values_.at(s.name);
    if (std::string(s.name) == "RINGREDUCE_TOKEN" && !v.value.empty()) {
      out << s.name << "=<set> (" << v.source << ")\n";  // never log the secret
    } else {
      out << s.name << "=" << v.value << " (" << v.source << ")\n";
    }
  }
  return out.str();
}

}  // namespace ringreduce::core
