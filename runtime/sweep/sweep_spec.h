// A sweep's definition: the experiment script, the search space, the objective, the trial budget, the
// pruner and the slots; read from the JSON that runner.sweep { ... } makes (and the index stores), checked
// field by field with errors that name the sweep file's line.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace runner::sweep {

// A bad sweep definition; what() starts with the sweep file's "path:line: ".
struct SweepError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

enum class ParameterKind { choice, uniform, log_uniform, integer };

struct Parameter {
  std::string name;
  ParameterKind kind = ParameterKind::choice;
  nlohmann::json values = nlohmann::json::array();  // choice: the values, in order
  double low = 0;                                   // uniform, log_uniform, integer: the closed range
  double high = 0;
  double step = 1;    // integer: values low, low + step, ... up to high
  bool log = false;   // integer: sampled on a log scale
  std::string where;  // "sweep.lua:7": where the sweep file gives it
};

enum class Method { grid, random, tpe };

// Asynchronous successive halving: rung k is the first objective value a trial logs at or after step
// min_steps * reduction^k (below max_steps); a trial goes on past rung k only while it is in the best
// 1/reduction of the trials that reached rung k.
struct AshaOptions {
  std::int64_t min_steps = 0;
  int reduction = 3;
  std::int64_t max_steps = 0;  // the trials' full length (prune.max_steps, else the `steps` config key)
};

struct SweepSpec {
  std::string name;
  std::string script;                               // absolute path of the experiment script
  std::string sweep_file;                           // the sweep file as given
  std::string where;                                // "sweep.lua:3": the runner.sweep { ... } call
  std::map<std::string, std::string> lines;         // field (a fixed key: "fixed.KEY") -> "sweep.lua:9": where given
  std::vector<Parameter> parameters;                // sorted by name
  nlohmann::json fixed = nlohmann::json::object();  // key -> value given to every trial
  Method method = Method::random;
  std::int64_t trials = 0;
  std::string metric;
  bool minimize = true;
  std::int64_t seed = 0;
  std::optional<AshaOptions> asha;
  int slots = 0;  // 0: auto (one per visible GPU, else 1)
  int gpus_per_trial = 1;
  std::int64_t max_failures = 0;  // failed trials that stop the sweep (0: trials / 2 + 1)
  int retries = 1;          // times a trial killed by a signal (the OOM killer's SIGKILL) or a full disk is continued
  int takeover_after = 60;  // seconds without a heartbeat from a worker on another host (or its trial's run)
                            // before another worker takes its trials over
};

// The range of takeover_after, in seconds: two worker heartbeats (index::kHeartbeatSeconds) at least, a week at most.
inline constexpr int kMinTakeoverAfter = 10;
inline constexpr int kMaxTakeoverAfter = 7 * 24 * 3600;

// Reads runner.sweep's JSON: {name, script, sweep_file, where, lines = {field -> "file:line"}, parameters =
// {name -> list | {kind = ..., ...}}, fixed, method, trials, metric, mode, seed, prune, slots,
// gpus_per_trial, max_failures, retries, takeover_after}. Throws SweepError naming the field and its line: for a name
// that is not a valid run name, text that is not UTF-8, and whole numbers outside their range (read as 64-bit values).
SweepSpec parse_sweep(const nlohmann::json& definition);
// The stored form (what parse_sweep reads back, and what decides whether two definitions are the same).
nlohmann::json sweep_json(const SweepSpec& spec);

// Where the sweep file gives `field` ("sweep.lua:9"), else its runner.sweep { ... } call.
std::string where_of(const SweepSpec& spec, const std::string& field);

const char* method_name(Method method);
const char* kind_name(ParameterKind kind);

// The number of points of the grid: the product of the choice lists' and integer ranges' sizes; a SweepError
// for a continuous parameter.
std::int64_t grid_size(const SweepSpec& spec);

// A value as the key=value text the experiment's config {} parses: numbers shortest round-trip, lists
// comma-separated.
std::string override_text(const nlohmann::json& value);
// The trial's command-line overrides: the fixed values, then the parameters, sorted by key.
std::vector<std::string> trial_overrides(const SweepSpec& spec, const nlohmann::json& params);

// What `runner --print-config SCRIPT` reports of one config key.
struct ConfigKey {
  nlohmann::json default_value;
  bool integer = false;  // a whole-number key (its default is an integer literal)
};
using ScriptConfig = std::map<std::string, ConfigKey>;
ScriptConfig parse_script_config(const nlohmann::json& printed);

// Every parameter and fixed key is one of the script's config keys, with values of its type (whole numbers
// for integer keys); the ASHA length comes from the `steps` key when prune.max_steps is not given. Throws
// SweepError naming the parameter's line.
void check_against_config(SweepSpec& spec, const ScriptConfig& config);

}  // namespace runner::sweep
