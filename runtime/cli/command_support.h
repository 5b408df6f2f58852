// Shared parts of the index commands: their options, and how JSON values and counts are shown.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/cli/command_line.h"
#include "runtime/cli/text_table.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_store.h"

namespace runner::cli {

// The index commands parse with parse_command_line (command_line.h); -h / --help among the options throws
// HelpRequested, for run_index_command to print the usage.
using ParsedArguments = CommandLine;
struct HelpRequested {};
ParsedArguments parse_arguments(int argc, char** argv, const std::set<std::string>& value_options,
                                const std::set<std::string>& flag_options);

// The index the commands read and write: the launch context's (RUNNER_HOME, RUNNER_INDEX or --index).
index::IndexLocation command_index();

// The commands that take RUNs: `last` is the newest run not started by a sweep, with --sweep the newest of all.
index::LastAmong last_among(const ParsedArguments& arguments);

// "1 checkpoint", "3 checkpoints"
std::string count_text(std::int64_t count, const char* noun);

// --csv / --json / aligned
TableFormat table_format(const ParsedArguments& arguments);

// A JSON value as a table cell: numbers stay numbers, strings text, others compact JSON.
Cell json_cell(const nlohmann::json& value);
// "2h", "3d", "45m", "90s" before now, or a date "2026-11-20" / "2026-11-20 14:00" in local time.
double parse_since(const std::string& text);
int64_t parse_count(const std::string& option, const std::string& text);

}  // namespace runner::cli
