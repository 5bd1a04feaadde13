// A store in a directory on a (shared) filesystem: one file per key, written atomically by rename.
#pragma once

#include <memory>
#include <string>

#include "ringreduce/store.h"

namespace ringreduce::rendezvous {

std::shared_ptr<Store> make_file_store(const std::string& directory);

}  // namespace ringreduce::rendezvous
