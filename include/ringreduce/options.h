// How a Communicator is built. Every field left unset falls back to the environment (the
// RINGREDUCE_* settings, see README's table) and then to the built-in default.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace ringreduce {

class Store;  // rendezvous key-value store (rendezvous layer); tests and bindings may supply one

struct Options {
  std::optional<int> rank;
  std::optional<int> world_size;
  // Rendezvous store address "host:port" (rank 0 hosts it unless RINGREDUCE_STORE_SERVER=0).
  std::optional<std::string> addr;
  // Shared secret for the store and data connections (RINGREDUCE_TOKEN).
  std::optional<std::string> token;
  // Deadline for every wait unless an op gives its own (RINGREDUCE_TIMEOUT).
  std::optional<std::chrono::milliseconds> timeout;
  // Any registered setting by its environment name, e.g. {"RINGREDUCE_SEGMENT_BYTES", "65536"}.
  // These take precedence over the environment.
  std::map<std::string, std::string> settings;
  // A store to rendezvous through instead of the TCP store (in-process tests, torch's store).
  std::shared_ptr<Store> store;
  // Keys are namespaced under this prefix in the store, so several communicators can share one.
  std::string store_prefix = "rr";
};

}  // namespace ringreduce
