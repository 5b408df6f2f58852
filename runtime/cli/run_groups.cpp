// Grouping runs by config values, and the table of the groups.
#include "runtime/cli/run_groups.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "runtime/cli/command_support.h"
#include "runtime/core/did_you_mean.h"
#include "runtime/core/json_text.h"
#include "runtime/core/number_text.h"

namespace runner::cli {

std::vector<RunGroup> group_runs(const std::vector<const index::RunRecord*>& runs,
                                 const std::vector<std::vector<std::optional<double>>>& values,
                                 const std::vector<std::string>& keys) {
  std::vector<RunGroup> groups;
  std::vector<std::vector<std::size_t>> members;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    std::vector<nlohmann::json> key;
    const nlohmann::json& config = runs[r]->config;
    for (const std::string& name : keys)
      key.push_back(config.is_object() && config.contains(name) ? config[name] : nlohmann::json());
    std::size_t g = 0;
    while (g < groups.size() && groups[g].key != key) ++g;
    if (g == groups.size()) {
      groups.push_back({key, {}, {}});
      members.emplace_back();
    }
    groups[g].runs.push_back(runs[r]);
    members[g].push_back(r);
  }
  const std::size_t metric_count = values.empty() ? 0 : values.front().size();
  for (std::size_t g = 0; g < groups.size(); ++g) {
    for (std::size_t m = 0; m < metric_count; ++m) {
      MetricSpread spread;
      double sum = 0;
      for (std::size_t r : members[g])
        if (values[r][m] && !std::isnan(*values[r][m])) {
          ++spread.count;
          sum += *values[r][m];
        }
      spread.mean = spread.count ? sum / static_cast<double>(spread.count) : std::numeric_limits<double>::quiet_NaN();
      double squares = 0;
      for (std::size_t r : members[g])
        if (values[r][m] && !std::isnan(*values[r][m]))
          squares += (*values[r][m] - spread.mean) * (*values[r][m] - spread.mean);
      spread.std = spread.count > 1 ? std::sqrt(squares / static_cast<double>(spread.count - 1))
                                    : std::numeric_limits<double>::quiet_NaN();
      groups[g].metrics.push_back(spread);
    }
  }
  return groups;
}

std::vector<std::string> default_group_keys(const std::vector<const index::RunRecord*>& runs) {
  std::set<std::string> keys;
  for (const index::RunRecord* run : runs)
    if (run->config.is_object())
      for (const auto& [key, value] : run->config.items())
        if (key != "seed") keys.insert(key);
  return {keys.begin(), keys.end()};
}

RunGrouping group_runs_by(const std::vector<const index::RunRecord*>& runs,
                          const std::vector<std::vector<std::optional<double>>>& values,
                          const std::optional<std::vector<std::string>>& group_by, const std::string& option) {
  RunGrouping grouping;
  grouping.keys = group_by ? *group_by : default_group_keys(runs);
  if (group_by && !runs.empty()) {
    std::set<std::string> names;
    for (const index::RunRecord* run : runs)
      if (run->config.is_object())
        for (const auto& [key, value] : run->config.items()) names.insert(key);
    const std::vector<std::string> known(names.begin(), names.end());
    for (const std::string& key : grouping.keys)
      if (!names.count(key))
        throw UsageError(fmt::format("{} '{}': no run shown has it (known: {}){}", option, key, fmt::join(known, ", "),
                                     core::did_you_mean(key, known)));
  }
  grouping.groups = group_runs(runs, values, grouping.keys);
  if (!group_by) {  // --group: the keys that tell the groups apart
    for (std::size_t k = grouping.keys.size(); k-- > 0;) {
      const bool varies = std::any_of(grouping.groups.begin(), grouping.groups.end(),
                                      [&](const RunGroup& g) { return g.key[k] != grouping.groups.front().key[k]; });
      if (varies) continue;
      grouping.keys.erase(grouping.keys.begin() + static_cast<std::ptrdiff_t>(k));
      for (RunGroup& group : grouping.groups) group.key.erase(group.key.begin() + static_cast<std::ptrdiff_t>(k));
    }
  }
  return grouping;
}

std::string group_label(const RunGroup& group, const std::vector<std::string>& keys) {
  std::vector<std::string> parts;
  for (std::size_t k = 0; k < keys.size(); ++k)
    parts.push_back(keys[k] + "=" +
                    (group.key[k].is_string() ? group.key[k].get<std::string>() : core::json_text(group.key[k])));
  return parts.empty() ? "all runs" : fmt::format("{}", fmt::join(parts, " "));
}

Table group_table(const std::vector<RunGroup>& groups, const std::vector<std::string>& keys,
                  const std::vector<std::string>& metrics, TableFormat format) {
  const bool aligned = format == TableFormat::aligned;
  Table table;
  table.columns = keys;
  table.columns.push_back("runs");
  for (const std::string& metric : metrics) {
    table.columns.push_back(metric);
    if (!aligned) table.columns.push_back(metric + " std");
  }
  for (const RunGroup& group : groups) {
    std::vector<Cell> row;
    for (const nlohmann::json& value : group.key) row.push_back(json_cell(value));
    row.push_back(static_cast<std::int64_t>(group.runs.size()));
    for (const MetricSpread& spread : group.metrics) {
      const auto cell = [](double value) { return std::isnan(value) ? Cell(std::monostate{}) : Cell(value); };
      if (!aligned) {
        row.push_back(cell(spread.mean));
        row.push_back(cell(spread.std));
      } else if (spread.count == 0) {
        row.push_back(std::monostate{});
      } else {
        const std::string mean = core::number_text(spread.mean);
        row.push_back(spread.count > 1
                          ? fmt::format("{} \u00b1 {} ({})", mean, core::number_text(spread.std), spread.count)
                          : fmt::format("{} (1)", mean));
      }
    }
    table.rows.push_back(std::move(row));
  }
  return table;
}

}  // namespace runner::cli
