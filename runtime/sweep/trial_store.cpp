// The sweeps, trials and trial_rungs tables: sweep creation, transactional claims, trial ends.
#include "runtime/sweep/trial_store.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runtime/index/run_store.h"
#include "runtime/sweep/asha.h"
#include "runtime/sweep/samplers.h"

namespace runner::sweep {
namespace {

using index::Database;
using index::Statement;
using nlohmann::json;

constexpr const char* kTrialColumns =
    "trial, params, run, status, rung, metric, step, worker, error, segments, created_at, ended_at";

TrialRecord read_trial(Statement& row) {
  TrialRecord trial;
  trial.trial = row.integer(0);
  trial.params = json::parse(row.text(1));
  trial.run = row.optional_integer(2);
  trial.status = row.text(3);
  trial.rung = static_cast<int>(row.integer(4));
  trial.metric = row.optional_real(5);
  trial.step = row.integer(6);
  trial.worker = row.optional_text(7);
  trial.error = row.optional_text(8);
  trial.segments = static_cast<int>(row.integer(9));
  trial.created_at = row.optional_real(10).value_or(0);
  trial.ended_at = row.optional_real(11);
  return trial;
}

SweepRecord read_sweep(Statement& row) {
  SweepRecord sweep;
  sweep.sweep = row.integer(0);
  sweep.name = row.text(1);
  sweep.status = row.text(2);
  sweep.spec = parse_sweep(json::parse(row.text(3)));
  sweep.created_at = row.real(4);
  sweep.ended_at = row.optional_real(5);
  sweep.error = row.optional_text(6);
  return sweep;
}

constexpr const char* kSweepSelect = "SELECT sweep, name, status, spec, created_at, ended_at, error FROM sweeps";

// Whether the worker "host:pid" is gone: its process on this host has ended, or its heartbeat is stale.
bool worker_gone(const std::optional<std::string>& worker, const std::optional<double>& heartbeat, double now) {
  if (!worker) return true;
  const auto colon = worker->rfind(':');
  if (colon != std::string::npos && worker->substr(0, colon) == index::host_name()) {
    const pid_t pid = static_cast<pid_t>(std::stoll(worker->substr(colon + 1)));
    if (::kill(pid, 0) != 0 && errno == ESRCH) return true;
  }
  return !heartbeat || now - *heartbeat > index::kStaleAfterSeconds;
}

bool run_still_running(Database& db, std::int64_t run) {
  const index::RunRecord record = index::load_run(db, run);
  return index::effective_status(record, index::now_seconds()) == "running";
}

std::optional<std::int64_t> pause_for(const SweepSpec& spec, int rung) {
  if (!spec.asha) return std::nullopt;
  const std::vector<std::int64_t> steps = rung_steps(*spec.asha);
  if (rung < static_cast<int>(steps.size())) return steps[static_cast<size_t>(rung)];
  return std::nullopt;
}

std::vector<RungResult> results_at(Database& db, std::int64_t sweep, int rung) {
  Statement select = db.prepare("SELECT trial, value FROM trial_rungs WHERE sweep = ? AND rung = ?");
  select.bind(1, sweep).bind(2, rung);
  std::vector<RungResult> results;
  while (select.step()) results.push_back({select.integer(0), select.optional_real(1).value_or(NAN)});
  return results;
}

void mark_running(Database& db, std::int64_t sweep, std::int64_t trial, const std::string& worker) {
  Statement update = db.prepare(
      "UPDATE trials SET status = 'running', worker = ?, heartbeat_at = ?, segments = segments + 1, error = NULL, "
      "ended_at = NULL WHERE sweep = ? AND trial = ?");
  update.bind(1, worker).bind(2, index::now_seconds()).bind(3, sweep).bind(4, trial);
  update.run();
}

int failed_count(const std::vector<TrialRecord>& trials) {
  return static_cast<int>(std::count_if(trials.begin(), trials.end(), [](const TrialRecord& t) { return t.status == "failed"; }));
}

std::string describe_difference(const json& stored, const json& wanted) {
  std::vector<std::string> keys;
  const json& a = stored.at("fields");
  const json& b = wanted.at("fields");
  for (const auto& [key, value] : b.items())
    if (!a.contains(key) || a[key] != value) keys.push_back(key);
  for (const auto& [key, value] : a.items())
    if (!b.contains(key)) keys.push_back(key);
  return fmt::format("{}", fmt::join(keys, ", "));
}

}  // namespace

std::string worker_name() { return fmt::format("{}:{}", index::host_name(), static_cast<long long>(::getpid())); }

SweepRecord open_sweep(Database& db, const SweepSpec& spec) {
  const json wanted = sweep_json(spec);
  return index::with_transaction(db, [&] {
    Statement select = db.prepare(std::string(kSweepSelect) + " WHERE name = ?");
    select.bind(1, spec.name);
    if (select.step()) {
      SweepRecord stored = read_sweep(select);
      const json stored_json = sweep_json(stored.spec);
      if (stored_json.at("fields") != wanted.at("fields"))
        throw SweepError(fmt::format("{}: a sweep named '{}' exists with another definition ({} differ): give this one "
                                     "another name = \"...\", or continue that one with runner sweep --join {}",
                                     spec.where, spec.name, describe_difference(stored_json, wanted), spec.name));
      return stored;
    }
    Statement insert = db.prepare("INSERT INTO sweeps (name, script, spec, status, created_at) VALUES (?, ?, ?, 'running', ?)");
    insert.bind(1, spec.name).bind(2, spec.script).bind(3, wanted.dump()).bind(4, index::now_seconds());
    insert.run();
    Statement again = db.prepare(std::string(kSweepSelect) + " WHERE sweep = ?");
    again.bind(1, db.last_insert_rowid());
    again.step();
    return read_sweep(again);
  });
}

SweepRecord load_sweep(Database& db, const std::string& reference) {
  Statement select = db.prepare(std::string(kSweepSelect) + " WHERE name = ? OR CAST(sweep AS TEXT) = ? ORDER BY name = ? DESC");
  select.bind(1, reference).bind(2, reference).bind(3, reference);
  if (select.step()) return read_sweep(select);
  std::vector<std::string> names;
  for (const SweepRecord& sweep : list_sweeps(db)) names.push_back(sweep.name);
  throw index::IndexError(names.empty() ? fmt::format("no sweep matches '{}': the index has no sweeps", reference)
                                        : fmt::format("no sweep matches '{}' (sweeps: {})", reference, fmt::join(names, ", ")));
}

std::vector<SweepRecord> list_sweeps(Database& db) {
  Statement select = db.prepare(std::string(kSweepSelect) + " ORDER BY created_at DESC");
  std::vector<SweepRecord> sweeps;
  while (select.step()) sweeps.push_back(read_sweep(select));
  return sweeps;
}

std::vector<TrialRecord> list_trials(Database& db, std::int64_t sweep) {
  Statement select = db.prepare(fmt::format("SELECT {} FROM trials WHERE sweep = ? ORDER BY trial", kTrialColumns));
  select.bind(1, sweep);
  std::vector<TrialRecord> trials;
  while (select.step()) trials.push_back(read_trial(select));
  return trials;
}

void set_sweep_status(Database& db, std::int64_t sweep, const std::string& status, const std::optional<std::string>& error) {
  Statement update = db.prepare("UPDATE sweeps SET status = ?, error = ?, ended_at = ? WHERE sweep = ?");
  update.bind(1, status).bind(2, error);
  if (status == "running") update.bind_null(3);
  else update.bind(3, index::now_seconds());
  update.bind(4, sweep);
  update.run();
}

std::optional<Claim> claim_trial(Database& db, const SweepRecord& sweep, const std::string& worker) {
  const SweepSpec& spec = sweep.spec;
  return index::with_transaction(db, [&]() -> std::optional<Claim> {
    const double now = index::now_seconds();
    {
      Statement running = db.prepare("SELECT trial, worker, heartbeat_at FROM trials WHERE sweep = ? AND status = 'running'");
      running.bind(1, sweep.sweep);
      std::vector<std::int64_t> orphans;
      while (running.step())
        if (running.optional_text(1) != worker && worker_gone(running.optional_text(1), running.optional_real(2), now))
          orphans.push_back(running.integer(0));
      for (std::int64_t trial : orphans) {
        Statement stop = db.prepare("UPDATE trials SET status = 'stopped', worker = NULL WHERE sweep = ? AND trial = ?");
        stop.bind(1, sweep.sweep).bind(2, trial);
        stop.run();
      }
    }
    std::vector<TrialRecord> trials = list_trials(db, sweep.sweep);
    if (failed_count(trials) >= spec.max_failures) return std::nullopt;

    auto claim = [&](TrialRecord trial, std::optional<std::int64_t> run, std::string reason) {
      mark_running(db, sweep.sweep, trial.trial, worker);
      if (run) trial.step = index::load_run(db, *run).step;
      trial.status = "running";
      trial.worker = worker;
      ++trial.segments;
      return Claim{trial, run, pause_for(spec, trial.rung), std::move(reason)};
    };

    for (const TrialRecord& trial : trials) {
      if (trial.status != "stopped") continue;
      const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial.trial);
      if (run && run_still_running(db, *run)) continue;  // its process is still saving; later
      return claim(trial, run, "continued");
    }

    if (spec.asha) {
      for (int rung = static_cast<int>(rung_steps(*spec.asha).size()); rung >= 1; --rung) {
        const std::vector<RungResult> results = results_at(db, sweep.sweep, rung - 1);
        for (const TrialRecord& trial : trials) {
          if (trial.status != "paused" || trial.rung != rung) continue;
          if (!promotable(results, trial.trial, spec.asha->reduction, spec.minimize)) continue;
          const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial.trial);
          if (run && run_still_running(db, *run)) continue;
          return claim(trial, run, fmt::format("promoted past rung {}", rung));
        }
      }
    }

    if (static_cast<std::int64_t>(trials.size()) >= spec.trials) return std::nullopt;
    std::vector<Observation> history;
    for (const TrialRecord& trial : trials)
      if (trial.metric && std::isfinite(*trial.metric) && trial.status != "running" && trial.status != "failed")
        history.push_back({trial.params, *trial.metric});
    TrialRecord trial;
    trial.trial = static_cast<std::int64_t>(trials.size()) + 1;
    trial.params = suggest(spec, trial.trial - 1, history);
    trial.created_at = now;
    Statement insert = db.prepare(
        "INSERT INTO trials (sweep, trial, params, status, created_at) VALUES (?, ?, ?, 'running', ?)");
    insert.bind(1, sweep.sweep).bind(2, trial.trial).bind(3, trial.params.dump()).bind(4, now);
    insert.run();
    return claim(trial, std::nullopt, "new");
  });
}

std::optional<std::int64_t> trial_run(Database& db, std::int64_t sweep, std::int64_t trial) {
  Statement select = db.prepare("SELECT run FROM runs WHERE sweep = ? AND trial = ? ORDER BY started_at DESC, run DESC LIMIT 1");
  select.bind(1, sweep).bind(2, trial);
  if (select.step()) return select.integer(0);
  return std::nullopt;
}

void heartbeat_trials(Database& db, const SweepRecord& sweep, const std::vector<std::int64_t>& trials) {
  if (trials.empty()) return;
  index::with_transaction(db, [&] {
    for (std::int64_t trial : trials) {
      const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial);
      std::int64_t step = 0;
      std::optional<double> metric;
      if (run) {
        step = index::load_run(db, *run).step;
        metric = index::latest_metric(db, *run, sweep.spec.metric);
      }
      Statement update = db.prepare(
          "UPDATE trials SET heartbeat_at = ?, run = coalesce(?, run), step = max(step, ?), metric = coalesce(?, metric) "
          "WHERE sweep = ? AND trial = ? AND status = 'running'");
      update.bind(1, index::now_seconds()).bind(2, run).bind(3, step).bind(4, metric).bind(5, sweep.sweep).bind(6, trial);
      update.run();
    }
  });
}

TrialRecord end_trial(Database& db, const SweepRecord& sweep, std::int64_t trial, const TrialEnd& end) {
  const SweepSpec& spec = sweep.spec;
  return index::with_transaction(db, [&] {
    const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial);
    std::optional<index::RunRecord> record;
    if (run) record = index::load_run(db, *run);
    std::string status = "failed";
    std::optional<std::string> error;
    std::optional<double> metric;
    std::optional<RungRow> rung_row;
    const std::int64_t step = record ? record->step : 0;
    if (record) metric = index::latest_metric(db, *run, spec.metric);

    if (end.exited_ok && record && record->status == "finished") {
      status = "finished";
      if (!metric)
        status = "failed", error = fmt::format("the trial finished without logging '{}' (run:log {{ {} = value }})",
                                               spec.metric, spec.metric);
    } else if (end.exited_ok && record && record->status == "interrupted" && end.pause_step) {
      for (const index::MetricPoint& point : index::metric_series(db, *run, spec.metric)) {
        if (point.step < *end.pause_step) continue;
        rung_row = RungRow{trial, 0, point.step, point.value};
        break;
      }
      if (rung_row) status = "paused", metric = rung_row->value;
      else if (end.stopped_by_sweep) status = "stopped";
      else status = "failed", error = fmt::format("the trial stopped at step {} before its rung at step {}", step, *end.pause_step);
    } else if (end.stopped_by_sweep && (end.exited_ok || !record || record->status != "failed")) {
      status = "stopped";
    } else {
      error = end.failure.empty() ? std::string("the trial failed") : end.failure;
    }

    Statement current = db.prepare(fmt::format("SELECT {} FROM trials WHERE sweep = ? AND trial = ?", kTrialColumns));
    current.bind(1, sweep.sweep).bind(2, trial);
    current.step();
    TrialRecord updated = read_trial(current);
    current.reset();
    if (rung_row) {
      rung_row->rung = updated.rung;
      Statement insert = db.prepare("INSERT OR REPLACE INTO trial_rungs (sweep, trial, rung, step, value) VALUES (?, ?, ?, ?, ?)");
      insert.bind(1, sweep.sweep).bind(2, trial).bind(3, rung_row->rung).bind(4, rung_row->step);
      if (std::isnan(rung_row->value)) insert.bind_null(5);
      else insert.bind(5, rung_row->value);
      insert.run();
      ++updated.rung;
    }
    const bool ended = status == "finished" || status == "failed";
    Statement update = db.prepare(
        "UPDATE trials SET status = ?, run = coalesce(?, run), step = ?, metric = coalesce(?, metric), error = ?, rung = ?, "
        "worker = NULL, ended_at = ? WHERE sweep = ? AND trial = ?");
    update.bind(1, status).bind(2, run).bind(3, step).bind(4, metric).bind(5, error).bind(6, updated.rung);
    if (ended) update.bind(7, index::now_seconds());
    else update.bind_null(7);
    update.bind(8, sweep.sweep).bind(9, trial);
    update.run();
    updated.status = status;
    updated.run = run ? run : updated.run;
    updated.step = step;
    if (metric) updated.metric = metric;
    updated.error = error;
    updated.worker.reset();
    return updated;
  });
}

bool finish_if_done(Database& db, const SweepRecord& sweep) {
  return index::with_transaction(db, [&] {
    const std::vector<TrialRecord> trials = list_trials(db, sweep.sweep);
    if (failed_count(trials) >= sweep.spec.max_failures) {
      if (std::none_of(trials.begin(), trials.end(), [](const TrialRecord& t) { return t.status == "running"; })) {
        Statement update = db.prepare("UPDATE sweeps SET status = 'failed', ended_at = ?, error = ? WHERE sweep = ?");
        update.bind(1, index::now_seconds())
            .bind(2, fmt::format("{} trials failed (max_failures = {})", failed_count(trials), sweep.spec.max_failures))
            .bind(3, sweep.sweep);
        update.run();
      }
      return true;
    }
    if (static_cast<std::int64_t>(trials.size()) < sweep.spec.trials) return false;
    for (const TrialRecord& trial : trials)
      if (trial.status == "running" || trial.status == "stopped") return false;
    Statement prune = db.prepare("UPDATE trials SET status = 'pruned', ended_at = ? WHERE sweep = ? AND status = 'paused'");
    prune.bind(1, index::now_seconds()).bind(2, sweep.sweep);
    prune.run();
    Statement update = db.prepare("UPDATE sweeps SET status = 'finished', ended_at = ?, error = NULL WHERE sweep = ?");
    update.bind(1, index::now_seconds()).bind(2, sweep.sweep);
    update.run();
    return true;
  });
}

SweepCounts count_trials(const SweepRecord& sweep, const std::vector<TrialRecord>& trials) {
  SweepCounts counts;
  counts.queued = static_cast<int>(std::max<std::int64_t>(0, sweep.spec.trials - static_cast<std::int64_t>(trials.size())));
  for (const TrialRecord& trial : trials) {
    if (trial.status == "running") ++counts.running;
    else if (trial.status == "paused") ++counts.paused;
    else if (trial.status == "stopped") ++counts.stopped;
    else if (trial.status == "finished") ++counts.finished;
    else if (trial.status == "pruned") ++counts.pruned;
    else if (trial.status == "failed") ++counts.failed;
    if (trial.status != "finished" || !trial.metric || std::isnan(*trial.metric)) continue;
    if (!counts.best_value || (sweep.spec.minimize ? *trial.metric < *counts.best_value : *trial.metric > *counts.best_value)) {
      counts.best_value = trial.metric;
      counts.best_trial = trial.trial;
    }
  }
  return counts;
}

std::vector<RungRow> rung_results(Database& db, std::int64_t sweep) {
  Statement select = db.prepare("SELECT trial, rung, step, value FROM trial_rungs WHERE sweep = ? ORDER BY rung, trial");
  select.bind(1, sweep);
  std::vector<RungRow> rows;
  while (select.step())
    rows.push_back({select.integer(0), static_cast<int>(select.integer(1)), select.integer(2), select.optional_real(3).value_or(NAN)});
  return rows;
}

}  // namespace runner::sweep
