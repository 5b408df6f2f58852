// Runs grouped by config values (runner runs --group-by): each group's runs and each metric's mean and standard
// deviation over them, as W&B groups runs that differ only in their seed.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/cli/text_table.h"
#include "runtime/index/run_store.h"

namespace runner::cli {

// A metric over the runs of a group that have it: the count, the mean and the sample standard deviation (n - 1; NaN
// for one run).
struct MetricSpread {
  std::size_t count = 0;
  double mean = 0, std = 0;
};

struct RunGroup {
  std::vector<nlohmann::json> key;  // per grouping key: the runs' value (null where they have none)
  std::vector<const index::RunRecord*> runs;
  std::vector<MetricSpread> metrics;  // per metric
};

// `values[r][m]`: run r's value of metric m. Groups come in the order of their first run.
std::vector<RunGroup> group_runs(const std::vector<const index::RunRecord*>& runs,
                                 const std::vector<std::vector<std::optional<double>>>& values,
                                 const std::vector<std::string>& keys);

// The keys `--group-by` without a list means: every config key of the runs but seed.
std::vector<std::string> default_group_keys(const std::vector<const index::RunRecord*>& runs);

struct RunGrouping {
  std::vector<std::string> keys;  // the grouping keys shown
  std::vector<RunGroup> groups;
};
// The grouping of `--group-by KEYS` (`group_by`) or of `--group` (none: default_group_keys, keeping only the keys
// whose value differs between groups): the one grouping of `runner runs`, `runner report`, `runner compare` and the
// dashboard. A key of `group_by` that no run has is a UsageError naming `option`.
RunGrouping group_runs_by(const std::vector<const index::RunRecord*>& runs,
                          const std::vector<std::vector<std::optional<double>>>& values,
                          const std::optional<std::vector<std::string>>& group_by,
                          const std::string& option = "--group-by");

// A group as a legend names it: "lr=0.01 objective=flow" (texts bare); "all runs" without keys.
std::string group_label(const RunGroup& group, const std::vector<std::string>& keys);

// One row per group: the keys, "runs" (the count) and each metric, aligned as "mean ± std"; in --csv and --json
// the mean under the metric's name and the standard deviation under "<metric> std".
Table group_table(const std::vector<RunGroup>& groups, const std::vector<std::string>& keys,
                  const std::vector<std::string>& metrics, TableFormat format);

}  // namespace runner::cli
