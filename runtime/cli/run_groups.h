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

// One row per group: the keys, "runs" (the count) and each metric, aligned as "mean ± std"; in --csv and --json
// the mean under the metric's name and the standard deviation under "<metric> std".
Table group_table(const std::vector<RunGroup>& groups, const std::vector<std::string>& keys,
                  const std::vector<std::string>& metrics, TableFormat format);

}  // namespace runner::cli
