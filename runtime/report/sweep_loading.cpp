// What the sweep commands and the dashboard read of a sweep from the index: its status as shown, its summary line,
// its trials in the table's order, and its report.
#include "runtime/report/sweep_loading.h"

#include <algorithm>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/core/json_text.h"
#include "runtime/core/local_time_text.h"
#include "runtime/report/run_loading.h"
#include "runtime/sweep/parameter_importance.h"
#include "runtime/sweep/sweep_worker.h"

namespace runner::report {
namespace {

// The table's groups: finished, stopped by ASHA, still going, failed.
int status_rank(const std::string& status) {
  if (status == "finished") return 0;
  if (status == "pruned" || status == "paused") return 1;
  if (status == "running" || status == "stopped") return 2;
  return 3;
}

}  // namespace

void sort_trials_for_table(const sweep::SweepSpec& spec, std::vector<sweep::TrialRecord>& trials) {
  auto better = [&](const std::optional<double>& a, const std::optional<double>& b) {
    const bool va = a && !std::isnan(*a), vb = b && !std::isnan(*b);
    if (va != vb) return va;
    if (!va) return false;
    return spec.minimize ? *a < *b : *a > *b;
  };
  std::stable_sort(trials.begin(), trials.end(), [&](const sweep::TrialRecord& a, const sweep::TrialRecord& b) {
    if (status_rank(a.status) != status_rank(b.status)) return status_rank(a.status) < status_rank(b.status);
    if (a.rung != b.rung && status_rank(a.status) == 1) return a.rung > b.rung;
    if (better(a.metric, b.metric) != better(b.metric, a.metric)) return better(a.metric, b.metric);
    return a.trial < b.trial;
  });
}

ShownSweepStatus shown_sweep_status(index::Database& db, const sweep::SweepRecord& record) {
  if (record.status != "running") return {record.status, ""};
  const sweep::WorkerPresence presence = sweep::worker_presence(db, record);
  if (presence.alive) return {record.status, ""};
  const std::string seen = core::local_time_text(presence.last_seen);
  const bool today = seen.substr(0, 10) == core::local_time_text(index::now_seconds()).substr(0, 10);
  return {"stopped", fmt::format("no live worker since {}; run the same command to continue",
                                 today ? seen.substr(11, 5) : seen.substr(0, 16))};
}

std::string sweep_summary_line(const sweep::SweepRecord& record, const ShownSweepStatus& shown,
                               const sweep::SweepCounts& counts) {
  const sweep::SweepSpec& spec = record.spec;
  std::vector<std::string> names;
  for (const sweep::Parameter& parameter : spec.parameters) names.push_back(parameter.name);
  return fmt::format("{}, {}, {} of {} trials done ({} finished, {} pruned, {} failed) over {}; {} ({}){}",
                     shown.note.empty() ? shown.status : fmt::format("{} ({})", shown.status, shown.note),
                     sweep::method_name(spec.method), counts.finished + counts.pruned + counts.failed, spec.trials,
                     counts.finished, counts.pruned, counts.failed, fmt::join(names, ", "), spec.metric,
                     spec.minimize ? "min" : "max",
                     spec.asha ? fmt::format("; ASHA rungs from step {} by {} up to {}", spec.asha->min_steps,
                                             spec.asha->reduction, spec.asha->max_steps)
                               : "");
}

SweepReport load_sweep_report(index::Database& db, const std::string& reference, XAxis curves_x) {
  const sweep::SweepRecord record = sweep::load_sweep(db, reference);
  const sweep::SweepSpec& spec = record.spec;
  std::vector<sweep::TrialRecord> trials = sweep::list_trials(db, record.sweep);
  const sweep::SweepCounts counts = sweep::count_trials(record, trials);
  SweepReport page;
  page.name = record.name;
  page.title = "runner sweep report: " + record.name;
  page.curves_x = curves_x;
  page.generated_at = core::local_time_text(index::now_seconds());
  const ShownSweepStatus shown = shown_sweep_status(db, record);
  page.status = shown.status;
  page.summary = sweep_summary_line(record, shown, counts);
  page.metric = spec.metric;
  page.minimize = spec.minimize;
  page.asha = spec.asha.has_value();
  page.best_trial = counts.best_trial;
  page.best_command = sweep::best_trial_command(record, trials);
  for (const sweep::Parameter& parameter : spec.parameters) {
    SweepReportParameter column;
    column.name = parameter.name;
    column.log_scale = parameter.kind == sweep::ParameterKind::log_uniform || parameter.log;
    if (parameter.kind == sweep::ParameterKind::choice &&
        !std::all_of(parameter.values.begin(), parameter.values.end(),
                     [](const nlohmann::json& v) { return v.is_number(); }))
      for (const nlohmann::json& value : parameter.values)
        column.categories.push_back(value.is_string() ? value.get<std::string>() : core::json_text(value));
    std::vector<nlohmann::json> values;
    std::vector<double> objective;
    for (const sweep::TrialRecord& trial : trials) {
      if (trial.status != "finished" || !trial.metric) continue;
      values.push_back(trial.params.contains(parameter.name) ? trial.params[parameter.name] : nlohmann::json());
      objective.push_back(*trial.metric);
    }
    column.importance = sweep::parameter_importance(values, objective);
    page.parameters.push_back(std::move(column));
  }
  for (const sweep::RungRow& row : sweep::rung_results(db, record.sweep))
    page.rungs.push_back({row.trial, row.rung, row.step, row.value});
  sort_trials_for_table(spec, trials);
  for (const sweep::TrialRecord& trial : trials) {
    SweepReportTrial row;
    row.trial = trial.trial;
    row.status = trial.status;
    row.value = trial.metric;
    row.step = trial.step;
    row.rung = trial.rung;
    row.params = trial.params;
    row.error = trial.error.value_or("");
    if (trial.run) {
      const index::RunRecord run = index::load_run(db, *trial.run);
      row.run_id = run.id;
      row.curve = metric_points(db, run, spec.metric, curves_x);
    }
    page.trials.push_back(std::move(row));
  }
  return page;
}

}  // namespace runner::report
