// What the sweep commands and the dashboard read of a sweep from the index: its status as shown, its summary line,
// its trials in the table's order, and its report.
#pragma once

#include <string>
#include <vector>

#include "runtime/index/database.h"
#include "runtime/report/html_report.h"
#include "runtime/report/sweep_report.h"
#include "runtime/sweep/trial_store.h"

namespace runner::report {

// A sweep's status as shown: a running sweep that no live worker holds (its workers were killed, or died)
// is stopped, with a note of when a worker was last seen.
struct ShownSweepStatus {
  std::string status;
  std::string note;  // "no live worker since 14:02; run the same command to continue"
};
ShownSweepStatus shown_sweep_status(index::Database& db, const sweep::SweepRecord& record);
// "running, random, 3 of 8 trials done (...) over lr, width; loss (min)..."
std::string sweep_summary_line(const sweep::SweepRecord& record, const ShownSweepStatus& shown,
                               const sweep::SweepCounts& counts);
// Finished trials by the objective, then those ASHA stopped (furthest rung first), then the rest.
void sort_trials_for_table(const sweep::SweepSpec& spec, std::vector<sweep::TrialRecord>& trials);
// What `runner report SWEEP` and `runner serve` show of a sweep: its summary, trials in the table's order with
// their curves (over curves_x: metric_points), rungs, parameter importances and the best trial's command.
SweepReport load_sweep_report(index::Database& db, const std::string& reference, XAxis curves_x = XAxis::step);

}  // namespace runner::report
