// The index commands' options and value formatting.
#include "runtime/cli/command_support.h"

#include <cmath>
#include <ctime>
#include <fmt/format.h>

#include "runtime/core/json_text.h"
#include "runtime/core/launch_context.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_store.h"

namespace runner::cli {

ParsedArguments parse_arguments(int argc, char** argv, const std::set<std::string>& value_options,
                                const std::set<std::string>& flag_options) {
  CommandOptions options;
  for (const std::string& option : value_options) options.values[option] = "";
  options.flags = flag_options;
  ParsedArguments parsed = parse_command_line(argc, argv, options);
  if (parsed.help) throw HelpRequested{};
  return parsed;
}

index::IndexLocation command_index() { return index::index_location(core::launch_context()); }

std::string count_text(std::int64_t count, const char* noun) {
  return fmt::format("{} {}{}", count, noun, count == 1 ? "" : "s");
}

index::LastAmong last_among(const ParsedArguments& arguments) {
  return arguments.has("--sweep") ? index::LastAmong::all_runs : index::LastAmong::runs_outside_sweeps;
}

TableFormat table_format(const ParsedArguments& arguments) {
  if (arguments.has("--csv") && arguments.has("--json")) throw UsageError("give --csv or --json, not both");
  if (arguments.has("--csv")) return TableFormat::csv;
  if (arguments.has("--json")) return TableFormat::json;
  return TableFormat::aligned;
}

Cell json_cell(const nlohmann::json& value) {
  if (value.is_null()) return std::monostate{};
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number()) return value.get<double>();
  if (value.is_string()) return value.get<std::string>();
  if (value.is_array()) {
    std::string text;
    for (const auto& item : value)
      text += (text.empty() ? "" : ",") + (item.is_string() ? item.get<std::string>() : core::json_text(item));
    return text;
  }
  return core::json_text(value);
}

double parse_since(const std::string& text) {
  if (!text.empty() && std::isdigit(static_cast<unsigned char>(text[0]))) {
    size_t used = 0;
    double amount = 0;
    try {
      amount = std::stod(text, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    const std::string unit = text.substr(used);
    const std::map<std::string, double> units = {{"s", 1}, {"m", 60}, {"h", 3600}, {"d", 86400}, {"w", 604800}};
    if (used > 0 && units.count(unit)) return index::now_seconds() - amount * units.at(unit);
    std::tm local{};
    for (const char* format : {"%Y-%m-%d %H:%M", "%Y-%m-%d"}) {
      local = {};
      const char* end = ::strptime(text.c_str(), format, &local);
      if (end && *end == '\0') {
        local.tm_isdst = -1;
        return static_cast<double>(std::mktime(&local));
      }
    }
  }
  throw UsageError("--since '" + text + "': expected an age such as 30m, 6h, 2d, 1w or a date such as 2026-11-20");
}

int64_t parse_count(const std::string& option, const std::string& text) {
  size_t used = 0;
  int64_t value = -1;
  try {
    value = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != text.size() || value < 0) throw UsageError(option + " '" + text + "': expected a non-negative integer");
  return value;
}

}  // namespace runner::cli
