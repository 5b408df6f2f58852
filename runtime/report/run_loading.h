// What the index commands and the dashboard read of a run from the index: its JSON (`runner show --json`), its
// metric series and what its report shows.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"
#include "runtime/index/run_store.h"
#include "runtime/report/html_report.h"

namespace runner::report {

// `runner show RUN --json`: the run's row, attempts, inputs, latest metrics, checkpoints and artifacts, with its
// status and durations as of `now`; also the dashboard's run page.
nlohmann::json run_json(index::Database& db, const index::RunRecord& run, double now);
// A run's values of metric `key` over `x`: the steps, or (the dashboard's time axes) the time each was logged or the
// seconds since the run started; sorted by x.
SeriesPoints metric_points(index::Database& db, const index::RunRecord& record, const std::string& key, XAxis x);
// What `runner report` and `runner serve` show of a run: its row, the series of `keys` (none: every key it
// logged) over `x` (metric_points) and its image files (under `home`), with the status and duration as of `now`.
ReportRun load_report_run(index::Database& db, const std::string& home, const index::RunRecord& record,
                          const std::optional<std::vector<std::string>>& keys, double now, XAxis x = XAxis::step);

}  // namespace runner::report
