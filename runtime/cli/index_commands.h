// The index commands of the runner CLI: runs, show, compare, query, report, rm, gc, tag, note, sweeps, sweep show,
// serve.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"
#include "runtime/index/run_store.h"
#include "runtime/report/html_report.h"
#include "runtime/report/sweep_report.h"

namespace runner::cli {

class RunWhere;

bool is_index_command(const std::string& name);
// argv[0] is the command name. Prints results on stdout and one-line errors on stderr
// ("runner show: no run matches 'x' ..."). Returns 0, 1 (an error) or 2 (a usage error).
int run_index_command(int argc, char** argv);

// Runs `command` as run_index_command runs the index commands: its usage errors are printed with the index
// commands' usage (exit status 2), its other errors as one line "runner NAME: ..." (1).
int run_reporting_errors(const std::string& name, int (*command)(int, char**), int argc, char** argv);
// `runner serve`, with the same error reporting (serve_command.cpp, in the runner_serve library with the server).
int run_serve_command(int argc, char** argv);
int serve_command(int argc, char** argv);

// Each command with argv[0] its name; they throw UsageError (command_support.h) or index::IndexError.
int runs_command(int argc, char** argv);     // runs_commands.cpp
int show_command(int argc, char** argv);     // runs_commands.cpp
int compare_command(int argc, char** argv);  // runs_commands.cpp
int query_command(int argc, char** argv);    // index_commands.cpp
int report_command(int argc, char** argv);   // index_commands.cpp
int rm_command(int argc, char** argv);       // index_commands.cpp
int gc_command(int argc, char** argv);       // index_commands.cpp
int tag_command(int argc, char** argv);      // index_commands.cpp
int note_command(int argc, char** argv);     // index_commands.cpp
int sweeps_command(int argc, char** argv);   // sweep_commands.cpp
// argv[0] is "show".
int sweep_show_command(int argc, char** argv);  // sweep_commands.cpp
int sweep_rm_command(int argc, char** argv);    // sweep_commands.cpp
// `runner report SWEEP`: whether `reference` names a sweep and no run, and its report (sweep_commands.cpp).
bool is_sweep_reference(index::Database& db, const std::string& reference);
void write_sweep_report(index::Database& db, const std::string& reference, const std::string& output);

// `runner show RUN --json`: the run's row, attempts, inputs, latest metrics, checkpoints and artifacts, with its
// status and durations as of `now` (runs_commands.cpp); also the dashboard's run page.
nlohmann::json run_json(index::Database& db, const index::RunRecord& run, double now);
// A run's values of metric `key` over `x`: the steps, or (the dashboard's time axes) the time each was logged or the
// seconds since the run started; sorted by x.
report::SeriesPoints metric_points(index::Database& db, const index::RunRecord& record, const std::string& key,
                                   report::XAxis x);
// What `runner report` and `runner serve` show of a run: its row, the series of `keys` (none: every key it
// logged) over `x` (metric_points) and its image files (under `home`), with the status and duration as of `now`
// (index_commands.cpp).
report::ReportRun load_report_run(index::Database& db, const std::string& home, const index::RunRecord& record,
                                  const std::optional<std::vector<std::string>>& keys, double now,
                                  report::XAxis x = report::XAxis::step);

// The runs among `runs` that `where` matches (`runner runs --where`, the dashboard's runs filter); a key of
// `where` that is no config key or metric of any of them is a UsageError (runs_commands.cpp).
std::vector<index::RunRecord> runs_where(index::Database& db, std::vector<index::RunRecord> runs, const RunWhere& where,
                                         double now);
// What `runner report SWEEP` and `runner serve` show of a sweep: its summary, trials in the table's order with
// their curves (over curves_x: metric_points), rungs, parameter importances and the best trial's command
// (sweep_commands.cpp).
report::SweepReport load_sweep_report(index::Database& db, const std::string& reference,
                                      report::XAxis curves_x = report::XAxis::step);

// The usage text of all index commands, for `runner --help`.
const char* index_commands_usage();

}  // namespace runner::cli
