#include "transport/table.h"

#include "ringreduce/error.h"
#include "transport/device/device_entry.h"
#include "transport/shm/shm_entry.h"
#include "transport/tcp/socket.h"
#include "transport/tcp/tcp_entry.h"

namespace ringreduce::transport {

const std::vector<KindEntry>& kind_table() {
  static const std::vector<KindEntry> kTable = {
      device::kind_entry(),
      shm::kind_entry(),
      tcp::kind_entry(),
  };
  return kTable;
}

Listeners::Listeners(const core::Config& config, const std::string& token,
                     const std::string& store_host) {
  for (const KindEntry& k : kind_table()) kinds.push_back(k.listen(config, token, store_host));
  tcp::PublishedListener c = tcp::listen_published(config, !token.empty(), store_host);
  ctl = std::move(c.fd);
  ctl_nonce = c.nonce;
  ctl_published = std::move(c.published);
}

std::string Listeners::published() const {
  std::string out;
  const auto& table = kind_table();
  for (size_t k = 0; k < table.size(); ++k)
    if (kinds[k]) out += std::string(table[k].name) + "=" + kinds[k]->published() + ";";
  return out + "ctl=" + ctl_published;
}

std::string published_part(const std::string& published, const std::string& prefix) {
  size_t at = 0;
  // At the start of the record or after a ';': "tcp=" must not match inside another field.
  while ((at = published.find(prefix, at)) != std::string::npos && at > 0 &&
         published[at - 1] != ';')
    ++at;
  if (at == std::string::npos) return "";
  return published.substr(at + prefix.size(), published.find(';', at) - at - prefix.size());
}

std::string agreed_settings(const core::Config& config) {
  std::string out;
  for (const KindEntry& k : kind_table())
    for (const char* name : k.agreed_settings)
      out += std::string(name) + "=" + config.str(name) + "\n";
  return out;
}

void check_settings(const core::Config& config) {
  for (const KindEntry& k : kind_table()) k.check_settings(config);
}

Routes route(const ConnectArgs& args, const std::vector<std::string>& published,
             Listeners* listeners) {
  const auto& table = kind_table();
  Routes r;
  // Each kind's share: this rank's listener and every rank's part of the record under its name.
  // A row whose listener is absent here may still link peers (TCP alone, with one rank).
  r.shares.resize(table.size());
  for (size_t k = 0; k < table.size(); ++k) {
    if (listeners) r.shares[k].listener = listeners->kinds[k].get();
    const std::string prefix = std::string(table[k].name) + "=";
    for (const std::string& p : published)
      r.shares[k].published.push_back(published_part(p, prefix));
  }
  r.row.assign(static_cast<size_t>(args.size), -1);
  r.device_row.assign(static_cast<size_t>(args.size), -1);
  // The first row serving `space` that links q, or table.size().
  auto first = [&](MemorySpace space, int q) {
    size_t k = 0;
    while (k < table.size() &&
           !((table[k].memory & memory_mask(space)) && table[k].can_link(args, r.shares[k], q)))
      ++k;
    return k;
  };
  for (int q = 0; q < args.size; ++q) {
    if (q == args.rank) continue;
    const size_t k = first(MemorySpace::host, q);
    if (k == table.size())
      throw Error("rank " + std::to_string(args.rank) + ": no kind of link reaches rank " +
                  std::to_string(q));
    r.row[static_cast<size_t>(q)] = static_cast<int>(k);
    if (const size_t d = first(MemorySpace::device, q); d < table.size())
      r.device_row[static_cast<size_t>(q)] = static_cast<int>(d);
  }
  return r;
}

size_t Routes::open_files(const ConnectArgs& args, std::string* per_kind) const {
  const auto& table = kind_table();
  std::vector<size_t> peers(table.size(), 0);
  for (int k : row)
    if (k >= 0) ++peers[static_cast<size_t>(k)];
  for (int k : device_row)
    if (k >= 0) ++peers[static_cast<size_t>(k)];
  size_t files = 0;
  per_kind->clear();
  for (size_t k = 0; k < table.size(); ++k) {
    if (peers[k] == 0) continue;
    files += table[k].open_files(args, peers[k]);
    *per_kind += (per_kind->empty() ? std::to_string(peers[k]) + " peers over "
                                    : ", " + std::to_string(peers[k]) + " over ") +
                 table[k].name;
  }
  return files;
}

std::unique_ptr<Engine> connect(const ConnectArgs& args, Routes& routes,
                                const core::Deadline& deadline) {
  const auto& table = kind_table();
  std::vector<std::vector<int>> peers(table.size());
  for (int q = 0; q < args.size; ++q) {
    const int k = routes.row[static_cast<size_t>(q)], d = routes.device_row[static_cast<size_t>(q)];
    if (k >= 0) peers[static_cast<size_t>(k)].push_back(q);
    if (d >= 0 && d != k) peers[static_cast<size_t>(d)].push_back(q);
  }
  std::vector<std::unique_ptr<LinkKind>> kinds;
  std::vector<int> route_to(static_cast<size_t>(args.size), -1);
  std::vector<int> device_to(static_cast<size_t>(args.size), -1);
  for (size_t k = 0; k < table.size(); ++k) {
    // Alone, the last kind stands in, so that its settings are still checked (a bad interface
    // should fail now, not when the job grows).
    if (peers[k].empty() && !(args.size == 1 && k + 1 == table.size())) continue;
    for (int q : peers[k]) {
      const auto at = static_cast<size_t>(q);
      if (routes.row[at] == static_cast<int>(k)) route_to[at] = static_cast<int>(kinds.size());
      if (routes.device_row[at] == static_cast<int>(k))
        device_to[at] = static_cast<int>(kinds.size());
    }
    kinds.push_back(table[k].connect(args, routes.shares[k], peers[k], deadline));
  }
  return std::make_unique<Engine>(args.engine, std::move(kinds), std::move(route_to),
                                  std::move(device_to));
}

}  // namespace ringreduce::transport
