// The one registry of named settings. Every setting is resolved as: Options (explicit override)
// > environment > built-in default. Nothing outside this file reads the environment.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace ringreduce::core {

struct SettingInfo {
  const char* name;
  const char* default_value;  // "" means unset
  const char* help;
};

// Every setting the library knows, in the order the README documents them.
const std::vector<SettingInfo>& all_settings();

// RINGREDUCE_* variables that are not settings but are not typos either: ringrun tells each rank
// its place on the host with the first two (rendezvous/launch_env.cc reads them), and the
// examples and tests find the build tree by the third.
inline constexpr const char* kLocalRankVariable = "RINGREDUCE_LOCAL_RANK";
inline constexpr const char* kLocalSizeVariable = "RINGREDUCE_LOCAL_SIZE";
inline constexpr const char* kOtherKnownVariables[] = {kLocalRankVariable, kLocalSizeVariable,
                                                       "RINGREDUCE_BUILD"};

// The known name nearest to `name` (edit distance, at most a third of its length), or "".
std::string nearest_setting(const std::string& name);
// One line per RINGREDUCE_* variable of `environment` ("NAME=value" entries) that no setting
// and no kOtherKnownVariables entry names: "RINGREDUCE_TIMEOT is not a ringreduce setting; did
// you mean RINGREDUCE_TIMEOUT?".
std::vector<std::string> unknown_variables(const std::vector<std::string>& environment);
// Logs unknown_variables() of this process's environment as warnings, once per process (the
// first communicator calls it; `rank` names it in the lines).
void warn_unknown_variables(int rank);

// Raw environment access for variables that are not ringreduce settings (the launcher chain:
// RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID, ...). The only getenv in the code base.
std::optional<std::string> env(const std::string& name);

// Parses "65536", "64K", "4M", "1G" (binary multiples). Returns nullopt on garbage.
std::optional<uint64_t> parse_size(const std::string& text);

class Config {
 public:
  // Overrides are keyed by setting name; an unknown name is an InvalidArgument.
  explicit Config(const std::map<std::string, std::string>& overrides = {});

  // Resolved value ("" when unset and without default).
  std::string str(const std::string& name) const;
  bool has(const std::string& name) const { return !str(name).empty(); }
  // Integer with optional K/M/G suffix; InvalidArgument names the setting on garbage.
  uint64_t size(const std::string& name) const;
  int64_t integer(const std::string& name) const;
  double number(const std::string& name) const;
  // Where the value came from: "options", "environment" or "default".
  std::string source(const std::string& name) const;
  // One line per setting, for RINGREDUCE_DEBUG=INFO at start-up.
  std::string dump() const;

 private:
  struct Value {
    std::string value;
    std::string source;
  };
  const Value& lookup(const std::string& name) const;
  std::map<std::string, Value> values_;
};

}  // namespace ringreduce::core
