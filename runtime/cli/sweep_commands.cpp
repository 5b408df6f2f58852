// `runner sweeps` and `runner sweep show`: sweeps and their trials as tables (and CSV/JSON).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <set>

#include "runtime/cli/command_support.h"
#include "runtime/cli/index_commands.h"
#include "runtime/core/byte_size_text.h"
#include "runtime/index/index_database.h"
#include "runtime/index/run_store.h"
#include "runtime/report/sweep_loading.h"
#include "runtime/report/sweep_report.h"
#include "runtime/sweep/parameter_importance.h"
#include "runtime/sweep/sweep_removal.h"
#include "runtime/sweep/sweep_worker.h"
#include "runtime/sweep/trial_store.h"
#include "runtime/core/local_time_text.h"
#include "runtime/core/number_text.h"

namespace runner::cli {
namespace {

void print(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

Cell optional_cell(const std::optional<double>& value) { return value ? Cell(*value) : Cell(std::monostate{}); }

Cell param_cell(const nlohmann::json& params, const std::string& name) {
  if (!params.contains(name)) return std::monostate{};
  const nlohmann::json& value = params[name];
  if (value.is_number_integer()) return value.get<int64_t>();
  if (value.is_number()) return value.get<double>();
  return sweep::override_text(value);
}

// The sweep's workers by host: each one's process, Slurm job, start, last heartbeat and the trials it runs.
void print_workers(index::Database& db, const sweep::SweepRecord& record,
                   const std::vector<sweep::TrialRecord>& trials) {
  const std::vector<sweep::WorkerRecord> workers = sweep::list_workers(db, record);
  if (workers.empty()) return;
  const double now = index::now_seconds();
  Table table;
  table.columns = {"host", "pid", "slurm_job", "started", "heartbeat", "trials"};
  std::set<std::string> hosts;
  for (const sweep::WorkerRecord& worker : workers) {
    hosts.insert(worker.host);
    std::vector<std::string> running;
    for (const sweep::TrialRecord& trial : trials)
      if (trial.status == "running" && trial.worker == worker.worker) running.push_back(std::to_string(trial.trial));
    const std::string heartbeat =
        worker.alive ? fmt::format("{:.0f} s ago", std::max(0.0, now - worker.heartbeat_at))
                     : fmt::format("none since {} (gone)", core::local_time_text(worker.heartbeat_at).substr(11, 5));
    table.rows.push_back(
        {worker.host, worker.pid, worker.slurm_job ? Cell(*worker.slurm_job) : Cell(std::monostate{}),
         core::local_time_text(worker.started_at).substr(0, 16), heartbeat,
         running.empty() ? Cell(std::monostate{}) : Cell(fmt::format("{}", fmt::join(running, ", ")))});
  }
  print(fmt::format("\nworkers ({} on {} host{}):\n", workers.size(), hosts.size(), hosts.size() == 1 ? "" : "s"));
  print(format_table(table, TableFormat::aligned));
}

}  // namespace

int sweeps_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--csv", "--json"});
  if (!arguments.positional.empty()) throw UsageError("unexpected argument '" + arguments.positional[0] + "'");
  const TableFormat format = table_format(arguments);
  index::Database db = index::open_index_for_reading(command_index());
  Table table;
  table.columns = {"sweep", "name", "status", "method", "trials", "done", "metric", "best", "best_trial", "created"};
  std::string notes;
  for (const sweep::SweepRecord& record : sweep::list_sweeps(db)) {
    const std::vector<sweep::TrialRecord> trials = sweep::list_trials(db, record.sweep);
    const sweep::SweepCounts counts = sweep::count_trials(record, trials);
    const report::ShownSweepStatus shown = report::shown_sweep_status(db, record);
    if (!shown.note.empty()) notes += fmt::format("sweep {}: {}\n", record.name, shown.note);
    table.rows.push_back({record.sweep, record.name, shown.status, sweep::method_name(record.spec.method),
                          record.spec.trials, static_cast<int64_t>(counts.finished + counts.pruned + counts.failed),
                          record.spec.metric + (record.spec.minimize ? " (min)" : " (max)"),
                          optional_cell(counts.best_value),
                          counts.best_trial ? Cell(*counts.best_trial) : Cell(std::monostate{}),
                          format == TableFormat::aligned ? Cell(core::local_time_text(record.created_at).substr(0, 16))
                                                         : Cell(record.created_at)});
  }
  if (format == TableFormat::aligned && table.rows.empty()) {
    print("no sweeps yet (runner sweep SWEEP.lua starts one)\n");
    return 0;
  }
  print(format_table(table, format));
  if (format == TableFormat::aligned && !notes.empty()) print("\n" + notes);
  return 0;
}

int sweep_rm_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--force"});
  if (arguments.positional.empty()) throw UsageError("expected one or more sweeps to delete (names or numbers)");
  const index::IndexLocation where = command_index();
  const std::string& home = where.home;
  index::Database db = index::open_index_for_writing(where);
  // Every sweep is found before anything is deleted, so a typo deletes nothing.
  std::vector<sweep::SweepRecord> sweeps;
  for (const std::string& reference : arguments.positional) sweeps.push_back(sweep::load_sweep(db, reference));
  for (const sweep::SweepRecord& record : sweeps) {
    const sweep::RemovedSweep removed = sweep::remove_sweep(db, home, record, arguments.has("--force"));
    print(fmt::format("deleted sweep {}: {}, {} with {}, {} freed\n", record.name, count_text(removed.trials, "trial"),
                      count_text(removed.runs, "run"), count_text(removed.checkpoints, "checkpoint"),
                      core::byte_size_text(removed.bytes)));
  }
  return 0;
}

int sweep_show_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--csv", "--json"});
  if (arguments.positional.size() != 1) throw UsageError("expected one sweep (a name or number)");
  const TableFormat format = table_format(arguments);
  index::Database db = index::open_index_for_reading(command_index());
  const sweep::SweepRecord record = sweep::load_sweep(db, arguments.positional[0]);
  const sweep::SweepSpec& spec = record.spec;
  std::vector<sweep::TrialRecord> trials = sweep::list_trials(db, record.sweep);
  const sweep::SweepCounts counts = sweep::count_trials(record, trials);
  const report::ShownSweepStatus shown = report::shown_sweep_status(db, record);
  report::sort_trials_for_table(spec, trials);

  Table table;
  table.columns = {"best", "trial", "status", spec.metric, "step", "rung", "run"};
  for (const sweep::Parameter& parameter : spec.parameters) table.columns.push_back(parameter.name);
  table.columns.push_back("error");
  for (const sweep::TrialRecord& trial : trials) {
    const bool best = counts.best_trial && *counts.best_trial == trial.trial;
    std::vector<Cell> row;
    row.push_back(format == TableFormat::aligned ? Cell(std::string(best ? "*" : "")) : Cell(int64_t{best ? 1 : 0}));
    row.push_back(trial.trial);
    row.push_back(trial.status == "running" && !shown.note.empty() ? std::string("stopped") : trial.status);
    row.push_back(optional_cell(trial.metric));
    row.push_back(trial.step);
    row.push_back(static_cast<int64_t>(trial.rung));
    row.push_back(trial.run ? Cell(index::load_run(db, *trial.run).id) : Cell(std::monostate{}));
    for (const sweep::Parameter& parameter : spec.parameters) row.push_back(param_cell(trial.params, parameter.name));
    std::string error = trial.error.value_or("");
    if (format == TableFormat::aligned && error.size() > 60) error.replace(57, std::string::npos, "...");
    if (const auto newline = error.find('\n'); format == TableFormat::aligned && newline != std::string::npos)
      error = error.substr(0, newline);
    row.push_back(error.empty() ? Cell(std::monostate{}) : Cell(error));
    table.rows.push_back(std::move(row));
  }
  if (format != TableFormat::aligned) {
    print(format_table(table, format));
    return 0;
  }
  print(
      fmt::format("sweep {} ({}): {}\n", record.name, record.sweep, report::sweep_summary_line(record, shown, counts)));
  print(fmt::format("script {}\n", spec.script));
  if (record.error) print(fmt::format("error: {}\n", *record.error));
  print("\n");
  if (table.rows.empty())
    print("no trials yet\n");
  else
    print(format_table(table, format));
  const std::string best = sweep::best_trial_command(record, sweep::list_trials(db, record.sweep));
  if (!best.empty())
    print(fmt::format("\nbest (trial {}, {} {}): {}\n", *counts.best_trial, spec.metric,
                      core::number_text(*counts.best_value), best));
  print_workers(db, record, trials);
  return 0;
}

}  // namespace runner::cli

namespace runner::cli {

bool is_sweep_reference(index::Database& db, const std::string& reference) {
  try {
    index::resolve_run(db, reference);
    return false;
  } catch (const index::IndexError&) {
  }
  try {
    sweep::load_sweep(db, reference);
    return true;
  } catch (const index::IndexError&) {
    return false;
  }
}

void write_sweep_report(index::Database& db, const std::string& reference, const std::string& output,
                        report::XAxis curves_x) {
  const report::SweepReport page = report::load_sweep_report(db, reference, curves_x);
  report::write_sweep_report(output, page);
  print(fmt::format("wrote {} (sweep {}, {} trials)\n", output, page.name, page.trials.size()));
}

}  // namespace runner::cli
