// Shared parts of the index commands: option parsing, usage errors, and how times, durations, sizes and
// values are shown.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/cli/text_table.h"
#include "runtime/index/run_store.h"

namespace runner::cli {

// Exit status 2 with the command's usage.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// "--name VALUE", "--name=VALUE" and flags; everything else is positional. Unknown options are usage errors.
struct ParsedArguments {
  std::vector<std::string> positional;
  std::map<std::string, std::string> values;
  std::set<std::string> flags;
  bool has(const std::string& flag) const { return flags.count(flag) > 0; }
  std::optional<std::string> value(const std::string& option) const;
};
ParsedArguments parse_arguments(int argc, char** argv, const std::set<std::string>& value_options,
                                const std::set<std::string>& flag_options);

// The commands that take RUNs: `last` is the newest run not started by a sweep, with --sweep the newest of all.
index::LastAmong last_among(const ParsedArguments& arguments);

// "1 checkpoint", "3 checkpoints"
std::string count_text(std::int64_t count, const char* noun);

// --csv / --json / aligned
TableFormat table_format(const ParsedArguments& arguments);

std::string format_time(double unix_seconds);        // local "2026-11-22 14:03:12"
std::string format_duration(double seconds);         // "3m 12s", "1h 04m", "2d 3h"
// A JSON value as a table cell: numbers stay numbers, strings text, others compact JSON.
Cell json_cell(const nlohmann::json& value);
// "2h", "3d", "45m", "90s" before now, or a date "2026-11-20" / "2026-11-20 14:00" in local time.
double parse_since(const std::string& text);
int64_t parse_count(const std::string& option, const std::string& text);

}  // namespace runner::cli
