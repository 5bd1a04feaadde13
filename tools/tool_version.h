// What every tool's --version prints: "TOOL 0.2.0", the version of the headers it was built with,
// and beside it the library's own if that differs (a tool run against another release's
// libringreduce.so), so that a bug report names both.
#pragma once

#include <cstring>
#include <string>

#include "ringreduce/communicator.h"
#include "ringreduce/version.h"

namespace ringreduce_tools {

inline std::string version_text(const char* tool) {
  std::string text = std::string(tool) + " " + RINGREDUCE_VERSION_STRING;
  const char* library = ringreduce::Communicator::version();
  if (std::strcmp(library, RINGREDUCE_VERSION_STRING) != 0)
    text += std::string(" (library ") + library + ")";
  return text;
}

}  // namespace ringreduce_tools
