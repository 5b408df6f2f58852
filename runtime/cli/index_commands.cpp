// The index commands' dispatch and usage, and `runner query`, `runner report`, `runner rm`, `runner gc`, `runner tag`,
// `runner note`.
#include "runtime/cli/index_commands.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/ckpt/checkpoint_directory.h"
#include "runtime/cli/command_support.h"
#include "runtime/index/index_database.h"
#include "runtime/index/read_query.h"
#include "runtime/index/run_removal.h"
#include "runtime/index/run_store.h"
#include "runtime/cli/run_groups.h"
#include "runtime/report/html_report.h"
#include "runtime/report/run_loading.h"
#include "runtime/core/byte_size_text.h"
#include "runtime/core/terminal_text.h"
#include "runtime/core/local_time_text.h"
#include "runtime/core/utf8_text.h"

namespace runner::cli {
namespace {

constexpr const char* kUsage =
    R"(index commands (the index is RUNNER_HOME/index.db; RUNNER_HOME defaults to ./runs; with
RUNNER_INDEX=postgresql://USER@HOST:PORT/DB, or --index URL given to any of these commands, it is that PostgreSQL
database, and RUNNER_HOME holds the run folders only):
  runner runs [--status S] [--name GLOB] [--since 2d|2026-11-20] [--sweep SWEEP] [--where EXPR]
              [--sort KEY [--desc]] [--limit N] [--metrics a,b] [--columns a,b] [--group | --group-by a,b]
              [--csv|--json]
                                      table of runs, newest first (KEY: a column, a metric, started, duration,
                                      step, name) with their tags and notes; --columns: config keys and metrics
                                      (config.KEY or metric.KEY where a name is both); --sweep shows the swept
                                      parameters; --where "lr < 1e-3 and tag = 'baseline'":
                                      comparisons (< <= > >= = !=) of config keys, metrics (summary or latest
                                      value), tag, status and name with numbers or 'texts', joined by and, or,
                                      not and parentheses; --group-by lr,objective: one row per distinct value
                                      with the count of runs and each metric's mean ± standard deviation
                                      (--group: by every config key but seed, the runs of several seeds)
  runner show RUN [--json] [--sweep]  config, versions, summary, latest metrics, checkpoints, artifacts
  runner compare RUN RUN... [--all] [--csv|--json] [--group | --group-by KEYS]
                                      config differences and metrics side by side; --group(-by): a column
                                      per group of runs, as runs --group, each value's mean ± std
  runner query "SQL" [--csv|--json] [--timeout S] [--limit N]
                                      read-only SQL over the index (schema: docs/index-schema.md); stops
                                      after 30 s (--timeout 0: never); a table shows 1000 rows (--limit 0: all)
  runner report RUN... [-o report.html] [--metrics a,b] [--x step|time|relative] [--group | --group-by KEYS]
                                      one self-contained HTML file: curves (over the step, the wall-clock
                                      time or the time since each run started), config, latest sample grids;
                                      --group(-by): a mean line and min..max band per group, as runs --group
  runner report SWEEP [-o sweep.html] [--x step|time|relative]
                                      the sweep's objective against each parameter, every trial's curve
                                      (pruned ones dashed), the trials and the best one's command line
  runner tag RUN TAG... [-d|--remove]
                                      tag a run (letters, digits, '_', '-', '.'); -d removes the tags
  runner note RUN TEXT                set the run's note, a text for people ("" removes it)
  runner rm RUN... [--force]          delete runs with their files (--force: also running ones); a sweep:
                                      runner sweep rm SWEEP
  runner gc [--dry-run] [--orphans]   finish interrupted deletions, mark dead runs interrupted, delete
                                      checkpoints no longer kept or needed (pruned sweep trials' checkpoints,
                                      all but the latest of a paused trial) and say the disk space freed
                                      (--orphans: run folders the index lost)
  runner consolidate RUN [--step N] [-o DIR]
                                      a checkpoint saved by sharded data parallel (optimizer state and EMA split
                                      over the ranks' files) written whole into DIR (default RUNNAME-step-N, which
                                      must not exist), one tensor in memory at a time: model.safetensors,
                                      ema.safetensors, optimizer.safetensors, trainer.safetensors; the newest
                                      checkpoint unless --step
  runner serve [--port N] [--host ADDR] [--no-token]
                                      a web dashboard of the index at http://127.0.0.1:8765/?token=... (--port 0:
                                      any free port): runs, curves, samples, compare, sweeps; live, read-only.
                                      Requests need the token in the URL it prints; --no-token (loopback only)
                                      lets every user of this machine read it without one
  runner sweeps [--csv|--json]        table of sweeps: status, trials done, the best value and trial
  runner sweep show SWEEP [--csv|--json]
                                      the trials sorted by the objective, with their parameters, status,
                                      step and rung; the best one marked and its command line
  runner sweep rm SWEEP... [--force]  delete sweeps with their trials' runs and files (--force: also while a
                                      worker or trial runs)
RUN is an id, a unique id prefix, a name, or 'last': the newest run not started by a sweep (with --sweep,
the newest run of all, sweep trials included). SWEEP is a sweep's name or number.
)";

void print(const std::string& text) { std::fwrite(text.data(), 1, text.size(), stdout); }

std::vector<std::string> split_keys(const std::string& text) {
  std::vector<std::string> keys;
  size_t start = 0;
  while (start <= text.size()) {
    const size_t comma = text.find(',', start);
    std::string key = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    if (!key.empty()) keys.push_back(key);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return keys;
}

}  // namespace

const char* index_commands_usage() { return kUsage; }

bool is_index_command(const std::string& name) {
  return name == "runs" || name == "show" || name == "compare" || name == "query" || name == "report" || name == "rm" ||
         name == "gc" || name == "sweeps" || name == "tag" || name == "note" || name == "consolidate";
}

// In a table for reading, the index's time columns (named *_at, seconds since 1970) as local dates; CSV and JSON
// keep the numbers.
void show_times_as_dates(index::QueryResult& result) {
  for (std::size_t c = 0; c < result.columns.size(); ++c) {
    const std::string& name = result.columns[c];
    if (name.size() < 3 || name.compare(name.size() - 3, 3, "_at") != 0) continue;
    for (auto& row : result.rows) {
      double seconds = 0;
      if (const auto* real = std::get_if<double>(&row[c]))
        seconds = *real;
      else if (const auto* integer = std::get_if<int64_t>(&row[c]))
        seconds = static_cast<double>(*integer);
      else
        continue;
      if (std::isfinite(seconds) && seconds > 0) row[c] = core::local_time_text(seconds);
    }
  }
}

int query_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {"--timeout", "--limit"}, {"--csv", "--json"});
  if (arguments.positional.size() != 1) throw UsageError("expected one SQL statement in quotes");
  const TableFormat format = table_format(arguments);
  index::QueryLimits limits;
  limits.timeout_seconds = 30;
  limits.max_rows = format == TableFormat::aligned ? 1000 : 0;  // a table is for reading; CSV and JSON for tools
  if (auto timeout = arguments.value("--timeout"))
    limits.timeout_seconds = static_cast<double>(parse_count("--timeout", *timeout));
  if (auto limit = arguments.value("--limit")) limits.max_rows = parse_count("--limit", *limit);
  index::Database db = index::open_index_for_reading(command_index());
  index::QueryResult result = index::run_read_query(db, arguments.positional[0], {}, limits);
  if (format == TableFormat::aligned) show_times_as_dates(result);
  print(format_table({result.columns, result.rows}, format));
  if (result.truncated)
    std::fprintf(stderr, "runner query: showing the first %lld rows (--limit N shows more, --limit 0 all)\n",
                 static_cast<long long>(limits.max_rows));
  return 0;
}

int report_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(
      argc, argv, {"-o", "--output", "--metrics", "--title", "--x", "--group-by"}, {"--sweep", "--group"});
  if (arguments.positional.empty()) throw UsageError("expected one or more RUNs");
  const std::string x = arguments.value("--x").value_or("step");
  const std::optional<report::XAxis> x_axis = report::x_axis_named(x);
  if (!x_axis) throw UsageError(fmt::format("--x: expected step, time or relative, got '{}'", x));
  const std::string output = arguments.value("-o").value_or(arguments.value("--output").value_or("report.html"));
  const index::IndexLocation where = command_index();
  const std::string& home = where.home;
  index::Database db = index::open_index_for_reading(where);
  if (arguments.positional.size() == 1 && is_sweep_reference(db, arguments.positional[0])) {
    write_sweep_report(db, arguments.positional[0],
                       arguments.value("-o").value_or(arguments.value("--output").value_or("sweep.html")), *x_axis);
    return 0;
  }
  const double now = index::now_seconds();
  std::vector<report::ReportRun> runs;
  std::vector<index::RunRecord> records;
  std::optional<std::vector<std::string>> chosen;
  if (auto metrics = arguments.value("--metrics")) chosen = split_keys(*metrics);
  for (const auto& reference : arguments.positional) {
    records.push_back(index::resolve_run(db, reference, last_among(arguments)));
    runs.push_back(report::load_report_run(db, home, records.back(), chosen, now, *x_axis));
  }
  report::ReportOptions options;
  if (arguments.has("--group") || arguments.value("--group-by")) {
    std::vector<const index::RunRecord*> shown;
    for (const index::RunRecord& record : records) shown.push_back(&record);
    const std::optional<std::vector<std::string>> group_by =
        arguments.value("--group-by") ? std::optional(split_keys(*arguments.value("--group-by"))) : std::nullopt;
    const RunGrouping grouping =
        group_runs_by(shown, std::vector<std::vector<std::optional<double>>>(shown.size()), group_by);
    for (const RunGroup& group : grouping.groups) {
      report::CurveGroup curves{group_label(group, grouping.keys), {}};
      for (const index::RunRecord* member : group.runs)
        curves.runs.push_back(static_cast<std::size_t>(member - records.data()));
      options.groups.push_back(std::move(curves));
    }
  }
  options.title = arguments.value("--title").value_or(
      runs.size() == 1 ? "runner report: " + runs[0].name : fmt::format("runner report: {} runs", runs.size()));
  options.generated_at = core::local_time_text(now);
  options.x_axis = *x_axis;
  report::write_html_report(output, runs, options);
  print(fmt::format("wrote {} ({} run{})\n", output, runs.size(), runs.size() == 1 ? "" : "s"));
  return 0;
}

int rm_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--force", "--sweep"});
  if (arguments.positional.empty()) throw UsageError("expected one or more RUNs to delete");
  const index::IndexLocation where = command_index();
  const std::string& home = where.home;
  index::Database db = index::open_index_for_writing(where);
  const double now = index::now_seconds();
  // Every reference is resolved before anything is deleted, so a typo deletes nothing.
  std::vector<index::RunRecord> runs;
  for (const auto& reference : arguments.positional) {
    if (is_sweep_reference(db, reference))
      throw UsageError(fmt::format("'{}' is a sweep, not a run: `runner sweep rm {}` deletes it with its trials' runs",
                                   reference, reference));
    index::RunRecord run = index::resolve_run(db, reference, last_among(arguments));
    if (index::effective_status(run, now) == "running" && !arguments.has("--force"))
      throw index::IndexError(fmt::format("run {} ({}) is still running (pid {} on {}); stop it first or use --force",
                                          run.name, run.id, run.pid, run.host));
    bool duplicate = false;
    for (const auto& seen : runs) duplicate = duplicate || seen.run == run.run;
    if (!duplicate) runs.push_back(std::move(run));
  }
  for (const auto& run : runs) {
    const index::RemovedRun removed = index::remove_run(db, home, run);
    print(fmt::format("removed {} ({}): {}, {}, {}, {}\n", removed.name, removed.id,
                      count_text(removed.metrics, "metric value"), count_text(removed.checkpoints, "checkpoint"),
                      count_text(removed.artifacts, "artifact"), core::byte_size_text(removed.bytes)));
  }
  return 0;
}

int tag_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"-d", "--remove", "--sweep"});
  if (arguments.positional.size() < 2) throw UsageError("expected a RUN and one or more TAGs");
  const std::vector<std::string> tags(arguments.positional.begin() + 1, arguments.positional.end());
  for (const std::string& tag : tags) {
    try {
      index::check_name(tag, "tag");
    } catch (const index::IndexError& error) {
      throw UsageError(error.what());
    }
  }
  index::Database db = index::open_index_for_writing(command_index());
  const index::RunRecord run = index::resolve_run(db, arguments.positional[0], last_among(arguments));
  if (arguments.has("-d") || arguments.has("--remove"))
    index::remove_run_tags(db, run.run, tags);
  else
    index::add_run_tags(db, run.run, tags);
  const std::vector<std::string> now_tagged = index::load_run(db, run.run).tags;
  print(fmt::format("{} ({}): {}\n", core::terminal_text(run.name), run.id,
                    now_tagged.empty() ? "no tags" : "tags " + fmt::format("{}", fmt::join(now_tagged, ", "))));
  return 0;
}

int note_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--sweep"});
  if (arguments.positional.size() != 2)
    throw UsageError("expected a RUN and the note's TEXT in quotes (\"\" removes the note)");
  const std::string& text = arguments.positional[1];
  try {
    core::require_utf8(text, "the note");
  } catch (const std::invalid_argument& error) {
    throw UsageError(error.what());
  }
  index::Database db = index::open_index_for_writing(command_index());
  const index::RunRecord run = index::resolve_run(db, arguments.positional[0], last_among(arguments));
  index::set_run_note(db, run.run, text);
  print(
      fmt::format("{} ({}): {}\n", core::terminal_text(run.name), run.id, text.empty() ? "note removed" : "note set"));
  return 0;
}

int gc_command(int argc, char** argv) {
  const ParsedArguments arguments = parse_arguments(argc, argv, {}, {"--dry-run", "--orphans"});
  if (!arguments.positional.empty()) throw UsageError("unexpected argument '" + arguments.positional[0] + "'");
  const bool dry_run = arguments.has("--dry-run");
  const index::IndexLocation where = command_index();
  const std::string& home = where.home;
  index::Database db = index::open_index_for_writing(where);
  const index::GarbageReport report = index::collect_garbage(db, home, dry_run, arguments.has("--orphans"));
  const std::string verb = dry_run ? "would " : "";
  for (const auto& entry : report.finished_removals)
    print(fmt::format("{}finish deleting {}/.trash/{}\n", verb, home, entry));
  for (const auto& name : report.interrupted_runs)
    print(fmt::format("{}mark {} interrupted (its process is gone)\n", verb, name));
  for (const auto& path : report.dropped_checkpoints)
    print(fmt::format("{}delete checkpoint {}/{} (no longer kept)\n", verb, home, path));
  for (const auto& entry : report.orphan_directories) {
    if (arguments.has("--orphans"))
      print(fmt::format("{}delete {}/{} (a run directory not in the index)\n", verb, home, entry));
    else
      print(fmt::format("note: {}/{} looks like a run directory but is not in the index (--orphans deletes it)\n", home,
                        entry));
  }
  // Checkpoint writes of processes that are gone; a running run's writer may still be at work.
  uint64_t stale_bytes = 0;
  for (const index::RunRecord& run : index::list_runs(db, {})) {
    if (index::effective_status(run, index::now_seconds()) == "running") continue;
    const ckpt::StaleWrites stale = ckpt::clean_stale_writes(home + "/" + run.dir, dry_run);
    stale_bytes += stale.bytes;
    for (const auto& path : stale.removed)
      print(fmt::format("{}delete {}/{}/{} (a checkpoint write that never finished)\n", verb, home, run.dir, path));
    for (const auto& path : stale.recovered)
      print(
          fmt::format("{}move {}/{}/{} back into place (its replacement never finished)\n", verb, home, run.dir, path));
  }
  for (const auto& name : report.missing_directories)
    print(fmt::format("note: run {} has no directory under {} (its rows are kept; `runner rm {}` deletes them)\n", name,
                      home, name));
  print(fmt::format("{}{} freed\n", dry_run ? "would have " : "",
                    core::byte_size_text(report.bytes_freed + stale_bytes)));
  return 0;
}

int run_reporting_errors(const std::string& name, int (*command)(int, char**), int argc, char** argv) {
  try {
    return command(argc, argv);
  } catch (const HelpRequested&) {
    print(kUsage);
    return 0;
  } catch (const UsageError& error) {
    return print_usage_error(name, error.what());
  } catch (const std::exception& error) {
    std::fprintf(stderr, "runner %s: %s\n", name.c_str(), core::terminal_text(error.what()).c_str());
    return 1;
  }
}

int run_index_command(int argc, char** argv) {
  const std::string name = argv[0];
  return run_reporting_errors(
      name,
      [](int argc, char** argv) {
        const std::string name = argv[0];
        if (name == "runs") return runs_command(argc, argv);
        if (name == "show") return show_command(argc, argv);
        if (name == "compare") return compare_command(argc, argv);
        if (name == "query") return query_command(argc, argv);
        if (name == "report") return report_command(argc, argv);
        if (name == "rm") return rm_command(argc, argv);
        if (name == "gc") return gc_command(argc, argv);
        if (name == "sweeps") return sweeps_command(argc, argv);
        if (name == "tag") return tag_command(argc, argv);
        if (name == "note") return note_command(argc, argv);
        if (name == "consolidate") return consolidate_command(argc, argv);
        if (name == "sweep" && argc >= 2 && std::strcmp(argv[1], "show") == 0)
          return sweep_show_command(argc - 1, argv + 1);
        if (name == "sweep" && argc >= 2 && std::strcmp(argv[1], "rm") == 0)
          return sweep_rm_command(argc - 1, argv + 1);
        throw UsageError("unknown command '" + name + "'");
      },
      argc, argv);
}

}  // namespace runner::cli
