// `runner sweep FILE.lua`: the sweep file run in a Lua host, its `return runner.sweep { ... }` as JSON.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <variant>

namespace runner::bindings {

// Runs the sweep file at `path` in a fresh host (runner.sweep finds the lines of its fields there) and returns
// the definition runner.sweep returned, as JSON for sweep::parse_sweep; or the exit status of a file that
// failed as a script (its error printed). Throws cli::UsageError for a file that cannot be opened or compiled
// or returns no runner.sweep { ... }, sweep::SweepError for a definition that is not JSON (at its line).
std::variant<nlohmann::json, int> read_sweep_file(const std::string& path);

}  // namespace runner::bindings
