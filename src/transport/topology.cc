#include "transport/topology.h"

#include <sys/stat.h>
#include <unistd.h>

#include <fstream>

namespace ringreduce::transport {

std::string host_identity() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  std::string boot;
  std::ifstream f("/proc/sys/kernel/random/boot_id");
  std::getline(f, boot);
  struct stat st {};
  const unsigned long long netns =
      stat("/proc/self/ns/net", &st) == 0 ? static_cast<unsigned long long>(st.st_ino) : 0;
  return std::string(host) + "|" + boot + "|" + std::to_string(netns);
}

std::vector<std::string> exchange_host_identities(Store& store, int rank, int size,
                                                  const std::string& mine,
                                                  std::chrono::milliseconds timeout) {
  store.set("host/" + std::to_string(rank), std::vector<uint8_t>(mine.begin(), mine.end()));
  std::vector<std::string> ids(static_cast<size_t>(size));
  for (int q = 0; q < size; ++q) {
    if (q == rank) {
      ids[static_cast<size_t>(q)] = mine;
      continue;
    }
    auto v = store.get("host/" + std::to_string(q), timeout);
    ids[static_cast<size_t>(q)] = std::string(v.begin(), v.end());
  }
  return ids;
}

}  // namespace ringreduce::transport
