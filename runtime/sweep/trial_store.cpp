// The sweeps, trials and trial_rungs tables: sweep creation, transactional claims, trial ends.
#include "runtime/sweep/trial_store.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <map>

#include "runtime/core/json_text.h"
#include "runtime/index/run_records.h"
#include "runtime/index/run_store.h"
#include "runtime/sweep/asha.h"
#include "runtime/sweep/samplers.h"

namespace runner::sweep {
namespace {

using index::Database;
using index::Statement;
using nlohmann::json;

constexpr const char* kTrialColumns =
    "trial, params, run, status, rung, metric, step, worker, error, segments, created_at, ended_at, retries, "
    "generation, out_of_space";

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
  trial.retries = static_cast<int>(row.integer(12));
  trial.generation = row.integer(13);
  trial.out_of_space = row.integer(14) != 0;
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

// The process of the worker "host:pid" when it runs on this host.
std::optional<pid_t> local_pid(const std::string& worker) {
  const auto colon = worker.rfind(':');
  if (colon == std::string::npos || worker.substr(0, colon) != index::host_name()) return std::nullopt;
  return static_cast<pid_t>(std::stoll(worker.substr(colon + 1)));
}

bool process_exists(pid_t pid) { return ::kill(pid, 0) == 0 || errno != ESRCH; }

// Whether the worker "host:pid" is gone: its process on this host has ended, or it sent no heartbeat for the
// sweep's takeover_after seconds.
bool worker_gone(const SweepSpec& spec, const std::optional<std::string>& worker,
                 const std::optional<double>& heartbeat, double now) {
  if (!worker) return true;
  if (const std::optional<pid_t> pid = local_pid(*worker); pid && !process_exists(*pid)) return true;
  return !heartbeat || now - *heartbeat > spec.takeover_after;
}

// Whether the worker is alive for those who show the sweep: its process on this host (even while it cannot
// write its heartbeat, as on a full disk), else a heartbeat within takeover_after.
bool worker_alive(const SweepSpec& spec, const std::string& worker, const std::optional<double>& heartbeat,
                  double now) {
  if (const std::optional<pid_t> pid = local_pid(worker)) return process_exists(*pid);
  return heartbeat && now - *heartbeat <= spec.takeover_after;
}

// Whether a trial's run is still running, so that its trial is not taken yet: on this host while its process
// lives, on another while its heartbeat is within the sweep's takeover_after. A run on another host judged gone
// that way is marked interrupted here (in the claim's transaction), so that a worker can continue it at once.
bool run_still_running(Database& db, const SweepSpec& spec, std::int64_t trial, std::int64_t run) {
  const index::RunRecord record = index::load_run(db, run);
  const double now = index::now_seconds();
  if (record.status != "running") return false;
  if (record.host == index::host_name()) return index::effective_status(record, now) == "running";
  const double silent = now - record.heartbeat_at;
  if (silent <= spec.takeover_after) return true;
  return !index::interrupt_silent_run(
      db, run, record.heartbeat_at,
      fmt::format("no heartbeat from host {} for {:.0f} s (the sweep's takeover_after is {} s): trial {} was taken "
                  "over by another worker",
                  record.host, silent, spec.takeover_after, trial));
}

// The step of the rung after the `reached` ones (rungs count from 1), none after the last.
std::optional<std::int64_t> pause_for(const SweepSpec& spec, int reached) {
  if (!spec.asha) return std::nullopt;
  const std::vector<std::int64_t> steps = rung_steps(*spec.asha);
  if (reached < static_cast<int>(steps.size())) return steps[static_cast<size_t>(reached)];
  return std::nullopt;
}

std::vector<RungResult> results_at(Database& db, std::int64_t sweep, int rung) {
  Statement select = db.prepare("SELECT trial, value FROM trial_rungs WHERE sweep = ? AND rung = ?");
  select.bind(1, sweep).bind(2, rung);
  std::vector<RungResult> results;
  while (select.step()) results.push_back({select.integer(0), select.optional_real(1).value_or(NAN)});
  return results;
}

// Returns the claim's generation.
std::int64_t mark_running(Database& db, std::int64_t sweep, std::int64_t trial, const std::string& worker) {
  Statement update = db.prepare(
      "UPDATE trials SET status = 'running', worker = ?, heartbeat_at = ?, segments = segments + 1, error = NULL, "
      "ended_at = NULL, generation = generation + 1 WHERE sweep = ? AND trial = ? RETURNING generation");
  update.bind(1, worker).bind(2, index::now_seconds()).bind(3, sweep).bind(4, trial);
  update.step();
  const std::int64_t generation = update.integer(0);
  update.reset();
  return generation;
}

std::int64_t failed_count(const std::vector<TrialRecord>& trials) {
  return std::count_if(trials.begin(), trials.end(), [](const TrialRecord& t) { return t.status == "failed"; });
}

// The claim that `worker` made with `key`, as claim_trial returned it (the trials.claim column keeps it).
std::optional<Claim> claim_made(Database& db, const SweepRecord& sweep, const std::string& worker,
                                const std::string& key) {
  Statement select = db.prepare(fmt::format(
      "SELECT {}, claim FROM trials WHERE sweep = ? AND worker = ? AND status = 'running' AND claim IS NOT NULL",
      kTrialColumns));
  select.bind(1, sweep.sweep).bind(2, worker);
  while (select.step()) {
    const json claim = json::parse(select.text(15), nullptr, false);
    if (!claim.is_object() || claim.value("key", "") != key) continue;
    Claim made;
    made.trial = read_trial(select);
    if (claim["resume_run"].is_number_integer()) made.resume_run = claim["resume_run"].get<std::int64_t>();
    if (claim["pause_step"].is_number_integer()) made.pause_step = claim["pause_step"].get<std::int64_t>();
    made.reason = claim.value("reason", "");
    select.reset();
    if (made.resume_run) made.trial.step = index::load_run(db, *made.resume_run).step;
    return made;
  }
  return std::nullopt;
}

// end_trial inside the caller's transaction.
TrialRecord record_end(Database& db, const SweepRecord& sweep, std::int64_t trial, const TrialEnd& end);

// ASHA's last promotion (claim_trial's header says when and which): the paused trial that runs to the end.
struct LastPromotion {
  std::int64_t trial = 0;
  std::string reason;
};

std::optional<LastPromotion> last_promotion(Database& db, const SweepRecord& sweep,
                                            const std::vector<TrialRecord>& trials) {
  if (!sweep.spec.asha || static_cast<std::int64_t>(trials.size()) < sweep.spec.trials) return std::nullopt;
  std::map<std::int64_t, const TrialRecord*> by_number;
  bool any_finished = false;
  for (const TrialRecord& trial : trials) {
    if (trial.status == "running" || trial.status == "stopped") return std::nullopt;
    any_finished = any_finished || trial.status == "finished";
    by_number[trial.trial] = &trial;
  }
  std::map<int, std::vector<RungResult>> by_rung;
  for (const RungRow& row : rung_results(db, sweep.sweep)) by_rung[row.rung].push_back({row.trial, row.value});
  auto waiting_at = [&](const RungResult& result, int rung) {
    const auto found = by_number.find(result.trial);
    return found != by_number.end() && found->second->status == "paused" && found->second->rung == rung;
  };
  for (auto rung = by_rung.rbegin(); rung != by_rung.rend(); ++rung) {
    const std::vector<RungResult> best_first = ranked(rung->second, sweep.spec.minimize);
    if (rung == by_rung.rbegin() && waiting_at(best_first.front(), rung->first))
      return LastPromotion{
          best_first.front().trial,
          fmt::format("the best at rung {}, the last rung with results: runs to the end", rung->first)};
    if (any_finished) return std::nullopt;
    for (const RungResult& result : best_first)
      if (waiting_at(result, rung->first))
        return LastPromotion{result.trial,
                             fmt::format("the best left at rung {}, as none finished: runs to the end", rung->first)};
  }
  return std::nullopt;
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

void lock_sweep(Database& db, std::int64_t sweep) {
  Statement lock = db.prepare(std::string("SELECT sweep FROM sweeps WHERE sweep = ?") + db.lock_rows());
  lock.bind(1, sweep);
  lock.run();
}

std::string worker_name() { return fmt::format("{}:{}", index::host_name(), static_cast<long long>(::getpid())); }

std::optional<SweepRecord> same_definition(Database& db, const SweepSpec& spec) {
  Statement select = db.prepare(std::string(kSweepSelect) + " WHERE name = ?");
  select.bind(1, spec.name);
  if (!select.step()) return std::nullopt;
  SweepRecord stored = read_sweep(select);
  const json wanted = sweep_json(spec);
  const json stored_json = sweep_json(stored.spec);
  if (stored_json.at("fields") != wanted.at("fields"))
    throw SweepError(
        fmt::format("{}: a sweep named '{}' exists with another definition ({} differ): give this one "
                    "another name = \"...\", or continue that one with runner sweep --join {}",
                    spec.where, spec.name, describe_difference(stored_json, wanted), spec.name));
  return stored;
}

SweepRecord open_sweep(Database& db, const SweepSpec& spec) {
  const json wanted = sweep_json(spec);
  // Under the index lock: the name is looked up before the sweep is created, and no other start may create it
  // meanwhile (there is no row to lock yet).
  return index::with_transaction(db, [&] {
    if (std::optional<SweepRecord> stored = same_definition(db, spec)) return *stored;
    Statement insert = db.prepare(
        "INSERT INTO sweeps (name, script, spec, status, created_at) VALUES (?, ?, ?, 'running', ?) "
        "RETURNING sweep");
    insert.bind(1, spec.name).bind(2, spec.script).bind(3, core::json_text(wanted)).bind(4, index::now_seconds());
    insert.step();
    const std::int64_t created = insert.integer(0);
    insert.reset();
    Statement again = db.prepare(std::string(kSweepSelect) + " WHERE sweep = ?");
    again.bind(1, created);
    again.step();
    return read_sweep(again);
  });
}

SweepRecord load_sweep(Database& db, const std::string& reference) {
  Statement select =
      db.prepare(std::string(kSweepSelect) + " WHERE name = ? OR CAST(sweep AS TEXT) = ? ORDER BY name = ? DESC");
  select.bind(1, reference).bind(2, reference).bind(3, reference);
  if (select.step()) return read_sweep(select);
  std::vector<std::string> names;
  for (const SweepRecord& sweep : list_sweeps(db)) names.push_back(sweep.name);
  throw index::IndexError(names.empty()
                              ? fmt::format("no sweep matches '{}': the index has no sweeps", reference)
                              : fmt::format("no sweep matches '{}' (sweeps: {})", reference, fmt::join(names, ", ")));
}

std::vector<SweepRecord> list_sweeps(Database& db) {
  Statement select = db.prepare(std::string(kSweepSelect) + " ORDER BY created_at DESC");
  std::vector<SweepRecord> sweeps;
  while (select.step()) sweeps.push_back(read_sweep(select));
  return sweeps;
}

std::map<std::int64_t, std::string> sweep_names(Database& db) {
  Statement select = db.prepare("SELECT sweep, name FROM sweeps");
  std::map<std::int64_t, std::string> names;
  while (select.step()) names[select.integer(0)] = select.text(1);
  return names;
}

std::vector<TrialRecord> list_trials(Database& db, std::int64_t sweep) {
  Statement select = db.prepare(fmt::format("SELECT {} FROM trials WHERE sweep = ? ORDER BY trial", kTrialColumns));
  select.bind(1, sweep);
  std::vector<TrialRecord> trials;
  while (select.step()) trials.push_back(read_trial(select));
  return trials;
}

void set_sweep_status(Database& db, std::int64_t sweep, const std::string& status,
                      const std::optional<std::string>& error) {
  Statement update = db.prepare("UPDATE sweeps SET status = ?, error = ?, ended_at = ? WHERE sweep = ?");
  update.bind(1, status).bind(2, error);
  if (status == "running")
    update.bind_null(3);
  else
    update.bind(3, index::now_seconds());
  update.bind(4, sweep);
  update.run();
}

namespace {

// Takeover: a running trial whose worker is gone (no heartbeat within the limit) is stopped, its generation moved
// on so that its old process's writes are fenced off; one whose row another transaction holds (its worker's
// heartbeat) is alive: skipped, not waited for (PostgreSQL; SQLite's writers never overlap).
void stop_orphaned_trials(Database& db, const SweepRecord& sweep, const std::string& worker, double now) {
  Statement running =
      db.prepare(std::string("SELECT trial, worker, heartbeat_at FROM trials WHERE sweep = ? AND status = 'running'") +
                 db.lock_rows_skipping_locked());
  running.bind(1, sweep.sweep);
  std::vector<std::int64_t> orphans;
  while (running.step())
    if (running.optional_text(1) != worker &&
        worker_gone(sweep.spec, running.optional_text(1), running.optional_real(2), now))
      orphans.push_back(running.integer(0));
  for (std::int64_t trial : orphans) {
    Statement stop = db.prepare(
        "UPDATE trials SET status = 'stopped', worker = NULL, generation = generation + 1 WHERE sweep = ? AND "
        "trial = ?");
    stop.bind(1, sweep.sweep).bind(2, trial);
    stop.run();
  }
}

// Locks the row of a trial to take (FOR UPDATE SKIP LOCKED on PostgreSQL): false when another session holds it.
bool lockable(Database& db, const SweepRecord& sweep, const TrialRecord& trial) {
  Statement lock = db.prepare(std::string("SELECT trial FROM trials WHERE sweep = ? AND trial = ? AND status = ?") +
                              db.lock_rows_skipping_locked());
  lock.bind(1, sweep.sweep).bind(2, trial.trial).bind(3, trial.status);
  return lock.step();
}

// The trial marked running under `worker` at its next generation, and the claim recorded with the client key of
// this try (claim_made finds it again when the commit's answer was lost).
Claim take(Database& db, const SweepRecord& sweep, const std::string& worker, const std::string& key, TrialRecord trial,
           std::optional<std::int64_t> run, std::string reason, bool to_the_end = false) {
  trial.generation = mark_running(db, sweep.sweep, trial.trial, worker);
  if (run) trial.step = index::load_run(db, *run).step;
  trial.status = "running";
  trial.worker = worker;
  ++trial.segments;
  Claim made{trial, run, to_the_end ? std::nullopt : pause_for(sweep.spec, trial.rung), std::move(reason)};
  Statement record = db.prepare("UPDATE trials SET claim = ? WHERE sweep = ? AND trial = ?");
  record.bind(1, core::json_text(json{{"key", key},
                                      {"reason", made.reason},
                                      {"resume_run", made.resume_run ? json(*made.resume_run) : json()},
                                      {"pause_step", made.pause_step ? json(*made.pause_step) : json()}}));
  record.bind(2, sweep.sweep).bind(3, trial.trial);
  record.run();
  return made;
}

// A stopped trial whose run ended on its own while no worker watched it (its worker was killed as the run ran its
// last step or reached its rung, so the end was never recorded): that end is recorded as the worker would have,
// from the run. Continuing it would run a finished run again, from step 0 when it kept no checkpoint. True when
// one was recorded.
bool record_unwatched_ends(Database& db, const SweepRecord& sweep, const std::vector<TrialRecord>& trials,
                           std::vector<TrialRecord>* ended_unwatched) {
  bool recorded = false;
  for (const TrialRecord& trial : trials) {
    if (trial.status != "stopped") continue;
    const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial.trial);
    if (!run) continue;
    const std::string run_status = index::load_run(db, *run).status;
    if ((run_status != "finished" && run_status != "paused") || !lockable(db, sweep, trial)) continue;
    TrialEnd end;
    end.exited_ok = true;
    end.stopped_by_sweep = true;  // paused short of its rung's value: stays stopped, and is continued below
    end.pause_step = pause_for(sweep.spec, trial.rung);
    const TrialRecord ended = record_end(db, sweep, trial.trial, end);
    if (ended.status == "stopped") continue;
    recorded = true;
    if (ended_unwatched) ended_unwatched->push_back(ended);
  }
  return recorded;
}

// The trial to run next, in order: a stopped one continued (a retry, one that failed for want of space, one handed
// back), a paused one promoted past its rung (ASHA, the highest rung first), the last promotion to the end once
// every trial exists, else a new trial suggested from the finished ones. nullopt: none.
std::optional<Claim> next_claim(Database& db, const SweepRecord& sweep, const std::string& worker,
                                const std::string& key, const std::vector<TrialRecord>& trials, double now) {
  const SweepSpec& spec = sweep.spec;
  for (const TrialRecord& trial : trials) {
    if (trial.status != "stopped") continue;
    const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial.trial);
    if (run && run_still_running(db, spec, trial.trial, *run)) continue;  // its process is still saving; later
    if (!lockable(db, sweep, trial)) continue;
    // Its error says why: a retry (end_trial) or a failure for want of space (continue_out_of_space_trials).
    if (trial.error && trial.retries > 0)
      return take(db, sweep, worker, key, trial, run,
                  fmt::format("retry {} of {}: {}", trial.retries, spec.retries, *trial.error));
    if (trial.error) return take(db, sweep, worker, key, trial, run, "continued: " + *trial.error);
    return take(db, sweep, worker, key, trial, run, "continued");
  }

  if (spec.asha) {
    for (int rung = static_cast<int>(rung_steps(*spec.asha).size()); rung >= 1; --rung) {
      const std::vector<RungResult> results = results_at(db, sweep.sweep, rung);
      for (const TrialRecord& trial : trials) {
        if (trial.status != "paused" || trial.rung != rung) continue;
        if (!promotable(results, trial.trial, spec.asha->reduction, spec.minimize)) continue;
        const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial.trial);
        if ((run && run_still_running(db, spec, trial.trial, *run)) || !lockable(db, sweep, trial)) continue;
        return take(db, sweep, worker, key, trial, run, fmt::format("promoted past rung {}", rung));
      }
    }
  }

  if (static_cast<std::int64_t>(trials.size()) >= spec.trials) {
    const std::optional<LastPromotion> last = last_promotion(db, sweep, trials);
    if (!last) return std::nullopt;
    const TrialRecord& trial =
        *std::find_if(trials.begin(), trials.end(), [&](const TrialRecord& t) { return t.trial == last->trial; });
    const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial.trial);
    if ((run && run_still_running(db, spec, trial.trial, *run)) || !lockable(db, sweep, trial)) return std::nullopt;
    return take(db, sweep, worker, key, trial, run, last->reason, true);
  }
  std::vector<Observation> history;
  for (const TrialRecord& trial : trials)
    if (trial.metric && std::isfinite(*trial.metric) && trial.status != "running" && trial.status != "failed")
      history.push_back({trial.params, *trial.metric});
  TrialRecord trial;
  trial.trial = static_cast<std::int64_t>(trials.size()) + 1;
  trial.params = suggest(spec, trial.trial - 1, history);
  trial.created_at = now;
  Statement insert =
      db.prepare("INSERT INTO trials (sweep, trial, params, status, created_at) VALUES (?, ?, ?, 'running', ?)");
  insert.bind(1, sweep.sweep).bind(2, trial.trial).bind(3, core::json_text(trial.params)).bind(4, now);
  insert.run();
  return take(db, sweep, worker, key, trial, std::nullopt, "new");
}

}  // namespace

std::optional<Claim> claim_trial(Database& db, const SweepRecord& sweep, const std::string& worker,
                                 std::vector<TrialRecord>* ended_unwatched) {
  const std::string key = index::client_key();
  return index::with_transaction(
      db,
      [&]() -> std::optional<Claim> {
        if (ended_unwatched) ended_unwatched->clear();
        lock_sweep(db, sweep.sweep);
        // A retry whose first try committed (its answer lost): the trial that try claimed, not another one.
        if (std::optional<Claim> made = claim_made(db, sweep, worker, key)) return made;
        const double now = index::now_seconds();
        stop_orphaned_trials(db, sweep, worker, now);
        std::vector<TrialRecord> trials = list_trials(db, sweep.sweep);
        if (failed_count(trials) >= sweep.spec.max_failures) return std::nullopt;
        if (record_unwatched_ends(db, sweep, trials, ended_unwatched)) {
          trials = list_trials(db, sweep.sweep);
          if (failed_count(trials) >= sweep.spec.max_failures) return std::nullopt;
        }
        return next_claim(db, sweep, worker, key, trials, now);
      },
      index::TransactionScope::own_rows);
}

std::optional<std::int64_t> trial_run(Database& db, std::int64_t sweep, std::int64_t trial) {
  Statement select =
      db.prepare("SELECT run FROM runs WHERE sweep = ? AND trial = ? ORDER BY started_at DESC, run DESC LIMIT 1");
  select.bind(1, sweep).bind(2, trial);
  if (select.step()) return select.integer(0);
  return std::nullopt;
}

void add_worker(Database& db, const SweepRecord& record, const std::string& worker, const std::string& slurm_job) {
  const std::int64_t sweep = record.sweep;
  index::with_transaction(
      db,
      [&] {
        const double now = index::now_seconds();
        Statement select = db.prepare("SELECT worker, heartbeat_at FROM sweep_workers WHERE sweep = ?");
        select.bind(1, sweep);
        std::vector<std::string> gone;
        while (select.step())
          if (worker_gone(record.spec, select.text(0), select.optional_real(1), now)) gone.push_back(select.text(0));
        select.reset();
        for (const std::string& name : gone) remove_worker(db, sweep, name);
        const auto colon = worker.rfind(':');
        Statement insert = db.prepare(
            "INSERT INTO sweep_workers (sweep, worker, started_at, heartbeat_at, host, pid, slurm_job) "
            "VALUES (?, ?, ?, ?, ?, ?, ?) ON CONFLICT (sweep, worker) DO UPDATE SET started_at = excluded.started_at, "
            "heartbeat_at = excluded.heartbeat_at, host = excluded.host, pid = excluded.pid, slurm_job = "
            "excluded.slurm_job");
        insert.bind(1, sweep).bind(2, worker).bind(3, now).bind(4, now).bind(5, worker.substr(0, colon));
        insert.bind(6, static_cast<std::int64_t>(std::stoll(worker.substr(colon + 1))));
        insert.bind(7, slurm_job.empty() ? std::nullopt : std::optional<std::string>(slurm_job));
        insert.run();
      },
      index::TransactionScope::own_rows);
}

std::vector<WorkerRecord> list_workers(Database& db, const SweepRecord& sweep) {
  const double now = index::now_seconds();
  Statement select = db.prepare(
      "SELECT worker, host, pid, slurm_job, started_at, heartbeat_at FROM sweep_workers WHERE sweep = ? "
      "ORDER BY host, pid, worker");
  select.bind(1, sweep.sweep);
  std::vector<WorkerRecord> workers;
  while (select.step()) {
    WorkerRecord record;
    record.worker = select.text(0);
    const auto colon = record.worker.rfind(':');
    record.host = select.optional_text(1).value_or(record.worker.substr(0, colon));
    record.pid = select.optional_integer(2).value_or(std::atoll(record.worker.c_str() + colon + 1));
    record.slurm_job = select.optional_text(3);
    record.started_at = select.real(4);
    record.heartbeat_at = select.real(5);
    record.alive = worker_alive(sweep.spec, record.worker, record.heartbeat_at, now);
    workers.push_back(std::move(record));
  }
  return workers;
}

void remove_worker(Database& db, std::int64_t sweep, const std::string& worker) {
  Statement remove = db.prepare("DELETE FROM sweep_workers WHERE sweep = ? AND worker = ?");
  remove.bind(1, sweep).bind(2, worker);
  remove.run();
}

WorkerPresence worker_presence(Database& db, const SweepRecord& sweep) {
  const double now = index::now_seconds();
  WorkerPresence presence;
  presence.last_seen = sweep.created_at;
  auto seen = [&](const std::string& worker, const std::optional<double>& heartbeat) {
    presence.alive = presence.alive || worker_alive(sweep.spec, worker, heartbeat, now);
    if (heartbeat) presence.last_seen = std::max(presence.last_seen, *heartbeat);
  };
  Statement workers = db.prepare("SELECT worker, heartbeat_at FROM sweep_workers WHERE sweep = ?");
  workers.bind(1, sweep.sweep);
  while (workers.step()) seen(workers.text(0), workers.optional_real(1));
  Statement trials = db.prepare("SELECT worker, heartbeat_at, ended_at FROM trials WHERE sweep = ?");
  trials.bind(1, sweep.sweep);
  while (trials.step()) {
    if (const std::optional<std::string> worker = trials.optional_text(0)) seen(*worker, trials.optional_real(1));
    for (const int column : {1, 2})  // its heartbeat, its end
      if (const std::optional<double> time = trials.optional_real(column))
        presence.last_seen = std::max(presence.last_seen, *time);
  }
  return presence;
}

std::vector<std::int64_t> heartbeat_trials(Database& db, const SweepRecord& sweep, const std::string& worker,
                                           const std::vector<HeldTrial>& trials) {
  std::vector<std::int64_t> lost;
  index::with_transaction(
      db,
      [&] {
        const double now = index::now_seconds();
        Statement beat = db.prepare(
            "INSERT INTO sweep_workers (sweep, worker, started_at, heartbeat_at) VALUES (?, ?, ?, ?) "
            "ON CONFLICT (sweep, worker) DO UPDATE SET heartbeat_at = excluded.heartbeat_at");
        beat.bind(1, sweep.sweep).bind(2, worker).bind(3, now).bind(4, now);
        beat.run();
        lost.clear();
        for (const auto& [trial, generation] : trials) {
          const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial);
          std::int64_t step = 0;
          std::optional<double> metric;
          if (run) {
            step = index::load_run(db, *run).step;
            metric = index::latest_metric(db, *run, sweep.spec.metric);
          }
          Statement update = db.prepare(
              "UPDATE trials SET heartbeat_at = ?1, run = coalesce(?2, run), step = " + db.greatest("step", "?3") +
              ", metric = coalesce(?4, metric) WHERE sweep = ?5 AND trial = ?6 AND status = 'running' AND "
              "generation = ?7");
          update.bind(1, index::now_seconds())
              .bind(2, run)
              .bind(3, step)
              .bind(4, metric)
              .bind(5, sweep.sweep)
              .bind(6, trial)
              .bind(7, generation);
          update.run();
          if (db.changes() > 0) continue;
          Statement current = db.prepare("SELECT generation FROM trials WHERE sweep = ? AND trial = ?");
          current.bind(1, sweep.sweep).bind(2, trial);
          if (!current.step() || current.integer(0) != generation) lost.push_back(trial);
        }
      },
      index::TransactionScope::own_rows);
  return lost;
}

std::optional<TrialRecord> end_trial(Database& db, const SweepRecord& sweep, std::int64_t trial, const TrialEnd& end,
                                     std::int64_t generation) {
  return index::with_transaction(
      db,
      [&]() -> std::optional<TrialRecord> {
        Statement current = db.prepare(
            fmt::format("SELECT {} FROM trials WHERE sweep = ? AND trial = ?{}", kTrialColumns, db.lock_rows()));
        current.bind(1, sweep.sweep).bind(2, trial);
        if (!current.step()) return std::nullopt;
        const TrialRecord recorded = read_trial(current);
        current.reset();
        if (recorded.generation != generation) return std::nullopt;
        if (recorded.status != "running") return recorded;
        return record_end(db, sweep, trial, end);
      },
      index::TransactionScope::own_rows);
}

namespace {

TrialRecord record_end(Database& db, const SweepRecord& sweep, std::int64_t trial, const TrialEnd& end) {
  const SweepSpec& spec = sweep.spec;
  const std::optional<std::int64_t> run = trial_run(db, sweep.sweep, trial);
  std::optional<index::RunRecord> record;
  if (run) record = index::load_run(db, *run);
  Statement current = db.prepare(fmt::format("SELECT {} FROM trials WHERE sweep = ? AND trial = ?", kTrialColumns));
  current.bind(1, sweep.sweep).bind(2, trial);
  current.step();
  TrialRecord updated = read_trial(current);
  current.reset();

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
  } else if (end.exited_ok && record && record->status == "paused" && end.pause_step) {
    for (const index::MetricPoint& point : index::metric_series(db, *run, spec.metric)) {
      if (point.step < *end.pause_step) continue;
      rung_row = RungRow{trial, updated.rung + 1, point.step, point.value};
      break;
    }
    if (rung_row)
      status = "paused", metric = rung_row->value;
    else if (end.stopped_by_sweep)
      status = "stopped";
    else
      status = "failed",
      error = fmt::format("the trial stopped at step {} before its rung at step {}", step, *end.pause_step);
  } else if (end.stopped_by_sweep && (end.exited_ok || !record || record->status != "failed")) {
    status = "stopped";
  } else if ((end.killed_by != 0 || end.storage_full) && !end.stopped_by_sweep && updated.retries < spec.retries) {
    status = "stopped";  // continued first, from its last checkpoint
    ++updated.retries;
    const char* name = end.killed_by != 0 ? sigabbrev_np(end.killed_by) : nullptr;
    error = end.killed_by != 0
                ? fmt::format("killed by signal {} (SIG{}) at step {}", end.killed_by, name ? name : "?", step)
                : fmt::format("stopped by a full disk at step {} (a write failed for want of space)", step);
  } else {
    error = end.storage_full      ? fmt::format("a write failed for want of disk space at step {}", step)
            : end.failure.empty() ? std::string("the trial failed")
                                  : end.failure;
    if ((end.killed_by != 0 || end.storage_full) && updated.retries > 0)
      *error += fmt::format(" (after {} retr{})", updated.retries, updated.retries == 1 ? "y" : "ies");
  }
  if (rung_row) {
    Statement insert = db.prepare(
        "INSERT INTO trial_rungs (sweep, trial, rung, step, value) VALUES (?, ?, ?, ?, ?) "
        "ON CONFLICT (sweep, trial, rung) DO UPDATE SET step = excluded.step, value = excluded.value");
    insert.bind(1, sweep.sweep).bind(2, trial).bind(3, rung_row->rung).bind(4, rung_row->step);
    if (std::isnan(rung_row->value))
      insert.bind_null(5);
    else
      insert.bind(5, rung_row->value);
    insert.run();
    updated.rung = rung_row->rung;
  }
  const bool ended = status == "finished" || status == "failed";
  Statement update = db.prepare(
      "UPDATE trials SET status = ?, run = coalesce(?, run), step = ?, metric = coalesce(?, metric), error = ?, rung "
      "= ?, "
      "worker = NULL, ended_at = ?, retries = ?, out_of_space = ? WHERE sweep = ? AND trial = ?");
  update.bind(1, status).bind(2, run).bind(3, step).bind(4, metric).bind(5, error).bind(6, updated.rung);
  updated.ended_at = ended ? std::optional<double>(index::now_seconds()) : std::nullopt;
  update.bind(7, updated.ended_at);
  update.bind(8, updated.retries).bind(9, end.storage_full ? 1 : 0).bind(10, sweep.sweep).bind(11, trial);
  update.run();
  updated.out_of_space = end.storage_full;
  updated.status = status;
  updated.run = run ? run : updated.run;
  updated.step = step;
  if (metric) updated.metric = metric;
  updated.error = error;
  updated.worker.reset();
  return updated;
}

}  // namespace

std::vector<TrialRecord> continuable_out_of_space(const SweepSpec& spec, const std::vector<TrialRecord>& trials) {
  std::vector<TrialRecord> continuable;
  for (const TrialRecord& trial : trials)
    if (trial.status == "failed" && trial.out_of_space) continuable.push_back(trial);
  if (failed_count(trials) - std::ssize(continuable) >= spec.max_failures) return {};
  return continuable;
}

std::vector<TrialRecord> continue_out_of_space_trials(Database& db, const SweepRecord& sweep) {
  return index::with_transaction(
      db,
      [&] {
        lock_sweep(db, sweep.sweep);
        std::vector<TrialRecord> continued = continuable_out_of_space(sweep.spec, list_trials(db, sweep.sweep));
        for (TrialRecord& trial : continued) {
          if (!trial.error) trial.error = "a write failed for want of disk space";
          Statement update = db.prepare(
              "UPDATE trials SET status = 'stopped', retries = 0, error = ?, ended_at = NULL WHERE sweep = ? AND "
              "trial = ?");
          update.bind(1, trial.error).bind(2, sweep.sweep).bind(3, trial.trial);
          update.run();
          trial.status = "stopped";
          trial.retries = 0;
          trial.ended_at.reset();
        }
        return continued;
      },
      index::TransactionScope::own_rows);
}

bool finish_if_done(Database& db, const SweepRecord& sweep) {
  return index::with_transaction(
      db,
      [&] {
        lock_sweep(db, sweep.sweep);
        const std::vector<TrialRecord> trials = list_trials(db, sweep.sweep);
        if (failed_count(trials) >= sweep.spec.max_failures) {
          if (std::none_of(trials.begin(), trials.end(), [](const TrialRecord& t) { return t.status == "running"; })) {
            Statement update =
                db.prepare("UPDATE sweeps SET status = 'failed', ended_at = ?, error = ? WHERE sweep = ?");
            update.bind(1, index::now_seconds())
                .bind(2, fmt::format("{} trials failed (max_failures = {})", failed_count(trials),
                                     sweep.spec.max_failures))
                .bind(3, sweep.sweep);
            update.run();
          }
          return true;
        }
        if (static_cast<std::int64_t>(trials.size()) < sweep.spec.trials) return false;
        for (const TrialRecord& trial : trials)
          if (trial.status == "running" || trial.status == "stopped") return false;
        if (last_promotion(db, sweep, trials)) return false;
        Statement prune_runs = db.prepare(
            "UPDATE runs SET status = 'pruned' WHERE status = 'paused' AND run IN "
            "(SELECT run FROM trials WHERE sweep = ? AND status = 'paused')");
        prune_runs.bind(1, sweep.sweep);
        prune_runs.run();
        Statement prune =
            db.prepare("UPDATE trials SET status = 'pruned', ended_at = ? WHERE sweep = ? AND status = 'paused'");
        prune.bind(1, index::now_seconds()).bind(2, sweep.sweep);
        prune.run();
        Statement update =
            db.prepare("UPDATE sweeps SET status = 'finished', ended_at = ?, error = NULL WHERE sweep = ?");
        update.bind(1, index::now_seconds()).bind(2, sweep.sweep);
        update.run();
        return true;
      },
      index::TransactionScope::own_rows);
}

SweepCounts count_trials(const SweepRecord& sweep, const std::vector<TrialRecord>& trials) {
  SweepCounts counts;
  counts.queued = std::max<std::int64_t>(0, sweep.spec.trials - static_cast<std::int64_t>(trials.size()));
  for (const TrialRecord& trial : trials) {
    if (trial.status == "running")
      ++counts.running;
    else if (trial.status == "paused")
      ++counts.paused;
    else if (trial.status == "stopped")
      ++counts.stopped;
    else if (trial.status == "finished")
      ++counts.finished;
    else if (trial.status == "pruned")
      ++counts.pruned;
    else if (trial.status == "failed")
      ++counts.failed;
    if (trial.status != "finished" || !trial.metric || std::isnan(*trial.metric)) continue;
    if (!counts.best_value ||
        (sweep.spec.minimize ? *trial.metric < *counts.best_value : *trial.metric > *counts.best_value)) {
      counts.best_value = trial.metric;
      counts.best_trial = trial.trial;
    }
  }
  return counts;
}

std::vector<RungRow> rung_results(Database& db, std::int64_t sweep) {
  Statement select =
      db.prepare("SELECT trial, rung, step, value FROM trial_rungs WHERE sweep = ? ORDER BY rung, trial");
  select.bind(1, sweep);
  std::vector<RungRow> rows;
  while (select.step())
    rows.push_back({select.integer(0), static_cast<int>(select.integer(1)), select.integer(2),
                    select.optional_real(3).value_or(NAN)});
  return rows;
}

}  // namespace runner::sweep
