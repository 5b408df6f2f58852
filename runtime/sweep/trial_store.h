// Sweeps and their trials in the index: creating a sweep, claiming the next trial in a transaction (so that
// several workers never run one trial twice), heartbeats, trial ends and ASHA rung results. A trial is the
// series of runs' attempts of one parameter point: the run it started, continued after each pause.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"
#include "runtime/sweep/sweep_spec.h"

namespace runner::sweep {

// Trial statuses: running (a worker runs it), paused (ASHA: stopped at a rung with a checkpoint, waiting to
// be promoted), stopped (the sweep was stopped, its worker died, or a signal killed it and it is retried:
// continued first when the sweep goes on), finished, pruned (ended at a rung by ASHA), failed.
struct TrialRecord {
  std::int64_t trial = 0;  // 1, 2, ... in the order trials were started
  nlohmann::json params = nlohmann::json::object();
  std::optional<std::int64_t> run;
  std::string status;
  int rung = 0;                  // the last rung reached (rungs count from 1; 0: none yet)
  std::optional<double> metric;  // the latest objective value: the final one once finished
  std::int64_t step = 0;
  std::optional<std::string> worker;  // "host:pid" of the worker running it
  std::optional<std::string> error;
  int segments = 0;  // times a worker started or continued it
  int retries = 0;   // times it was continued after a signal or a full disk ended it (this round: see out_of_space)
  double created_at = 0;
  std::optional<double> ended_at;
  std::int64_t generation = 0;  // raised by each claim and takeover (index/writer_fence.h)
  // Its latest segment ended because a write failed for want of disk space (its run's exit status 75). Failed so,
  // it is continued by the next worker that starts (continue_out_of_space_trials), its retries from 0 again.
  bool out_of_space = false;
};

struct SweepRecord {
  std::int64_t sweep = 0;
  std::string name;
  std::string status;  // running, stopped, finished, failed
  SweepSpec spec;
  double created_at = 0;
  std::optional<double> ended_at;
  std::optional<std::string> error;
};

// The sweep named spec.name: created, or the stored one when its definition is the same. Another
// definition under that name is a SweepError that says what differs.
SweepRecord open_sweep(index::Database& db, const SweepSpec& spec);
// The stored sweep named spec.name, none when there is none, the same SweepError for another definition.
std::optional<SweepRecord> same_definition(index::Database& db, const SweepSpec& spec);
// By name or number; an IndexError naming the known sweeps when none matches.
SweepRecord load_sweep(index::Database& db, const std::string& reference);
std::vector<SweepRecord> list_sweeps(index::Database& db);
// Sweep number -> name, without reading their definitions.
std::map<std::int64_t, std::string> sweep_names(index::Database& db);
std::vector<TrialRecord> list_trials(index::Database& db, std::int64_t sweep);
void set_sweep_status(index::Database& db, std::int64_t sweep, const std::string& status,
                      const std::optional<std::string>& error = std::nullopt);

// This worker: "host:pid".
std::string worker_name();

// Locks the sweep's row until the caller's transaction ends (FOR UPDATE on PostgreSQL): claims of the sweep, its end
// and a worker's end decide on all of its trials, so they take it in turn, while other sweeps' claims and the runs'
// writes go on beside them.
void lock_sweep(index::Database& db, std::int64_t sweep);

// A trial a worker is to run now. trial.generation is the claim's: its process gets it as RUNNER_TRIAL_GENERATION.
struct Claim {
  TrialRecord trial;
  std::optional<std::int64_t> resume_run;  // continue this run from its checkpoint; none: a new run
  std::optional<std::int64_t> pause_step;  // ASHA: stop at the first objective value at or after this step
  std::string reason;                      // "new", "continued", "promoted past rung N"
};

// In one transaction: trials of dead workers (worker_gone: their process on this host ended, or no heartbeat for
// the sweep's takeover_after) become stopped, under a new generation (so their processes, should they resume, write
// nothing more: index/writer_fence.h); then the first of: a stopped trial (whose run is not still running:
// its process on this host, or on another a heartbeat within takeover_after; a run judged gone is marked
// interrupted), a paused trial that ASHA promotes (highest rung first), a new trial (parameters from
// the sweep's sampler), and once no trial runs and every trial has started, ASHA's last promotion: the best
// result of the highest rung with results when that trial waits there (a rung with fewer results than
// `reduction` promotes nobody), else, while no trial has finished, the best paused trial of the highest rung;
// it runs to the end without pausing. None when the failure limit is reached or nothing can start now.
// Before that, a stopped trial whose run ended on its own (finished, or paused at its rung) while no worker
// watched it has that end recorded, as end_trial records an exit status 0, rather than being run again; those
// trials, as recorded, are put in `ended_unwatched` when given. The claimed trial gets the next generation.
std::optional<Claim> claim_trial(index::Database& db, const SweepRecord& sweep, const std::string& worker,
                                 std::vector<TrialRecord>* ended_unwatched = nullptr);

// The run the trial's processes recorded (RUNNER_SWEEP / RUNNER_TRIAL), newest first.
std::optional<std::int64_t> trial_run(index::Database& db, std::int64_t sweep, std::int64_t trial);

// The workers of a sweep (the sweep_workers table): a worker adds itself when it starts (dropping the rows
// of workers that are gone) with its host, pid and Slurm job ("" outside Slurm), its heartbeat is refreshed with
// its trials', and it removes itself at its end. A worker is gone when its process on this host has ended, or
// when it sent no heartbeat for the sweep's takeover_after seconds (SweepSpec::takeover_after).
void add_worker(index::Database& db, const SweepRecord& sweep, const std::string& worker, const std::string& slurm_job);
void remove_worker(index::Database& db, std::int64_t sweep, const std::string& worker);

struct WorkerRecord {
  std::string worker;  // "host:pid"
  std::string host;
  std::int64_t pid = 0;
  std::optional<std::string> slurm_job;  // "JOB_TASK" for a task of a job array
  double started_at = 0;
  double heartbeat_at = 0;
  bool alive = false;  // its process on this host, else a heartbeat within the sweep's takeover_after
};
// The sweep's workers by host, then pid.
std::vector<WorkerRecord> list_workers(index::Database& db, const SweepRecord& sweep);

// A trial a worker runs: its number and the generation of the worker's claim.
struct HeldTrial {
  std::int64_t trial = 0;
  std::int64_t generation = 0;
};
// Refreshes this worker's heartbeat and its running trials': heartbeat, run, step and latest objective value.
// Returns the trials that are no longer this worker's: taken over (a new generation) while it was silent.
std::vector<std::int64_t> heartbeat_trials(index::Database& db, const SweepRecord& sweep, const std::string& worker,
                                           const std::vector<HeldTrial>& trials);

// Whether a worker holds the sweep: one of its workers (or of its running trials' workers) has its process on
// this host, or on another host a heartbeat within the sweep's takeover_after. `last_seen`: the newest heartbeat of its
// workers and trials, or else the end of its last trial or its creation.
struct WorkerPresence {
  bool alive = false;
  double last_seen = 0;
};
WorkerPresence worker_presence(index::Database& db, const SweepRecord& sweep);

// How a trial's process ended, as the worker saw it.
struct TrialEnd {
  bool exited_ok = false;         // exit status 0
  bool stopped_by_sweep = false;  // the worker sent it a stop signal
  int killed_by = 0;              // the signal that killed it (or, under --nproc, one of its ranks); 0: none
  bool storage_full = false;      // it failed after a write failed for want of space (core::kExitStorageFull)
  std::optional<std::int64_t> pause_step;
  std::string failure;  // how it ended and its last lines, for a failed trial
};
// Records the end from the trial's run in the index: finished (its objective's final value), paused at a
// rung (the value at the first step >= pause_step), stopped, or failed. A trial killed by a signal the
// worker did not send, or failed for want of disk space, is stopped, to be continued from its checkpoint, while it
// has retries left (spec.retries); then failed (out_of_space records the full disk). Returns the trial as recorded;
// none when the trial is no longer the claim of `generation` (taken over by another worker: nothing is recorded). A
// trial that is no longer running under that generation (its end already recorded, by this call's transaction whose
// answer was lost) is returned unchanged.
std::optional<TrialRecord> end_trial(index::Database& db, const SweepRecord& sweep, std::int64_t trial,
                                     const TrialEnd& end, std::int64_t generation);

// The failed trials whose latest segment failed for want of disk space, when the sweep's other failed trials stay
// under max_failures (else none: continuing them could not keep the sweep from failing).
std::vector<TrialRecord> continuable_out_of_space(const SweepSpec& spec, const std::vector<TrialRecord>& trials);
// As a worker starts (the same `runner sweep FILE` again, or --join): the continuable_out_of_space trials become
// stopped, with their retries at 0 and their failure as `error`, so that claim_trial continues them from their last
// checkpoint first (space may have been freed meanwhile). Returns them as recorded.
std::vector<TrialRecord> continue_out_of_space_trials(index::Database& db, const SweepRecord& sweep);

// Whether every trial has ended (paused ones included) and no more can start: then the paused trials become
// pruned and the sweep finished (true returned). Also true when the failure limit was reached (sweep failed).
bool finish_if_done(index::Database& db, const SweepRecord& sweep);

struct SweepCounts {
  std::int64_t running = 0, queued = 0, paused = 0, stopped = 0, finished = 0, pruned = 0, failed = 0;
  std::optional<std::int64_t> best_trial;
  std::optional<double> best_value;
};
SweepCounts count_trials(const SweepRecord& sweep, const std::vector<TrialRecord>& trials);

// A rung result of a trial: rung k (counting from 1), the step it was measured at, the value.
struct RungRow {
  std::int64_t trial = 0;
  int rung = 0;
  std::int64_t step = 0;
  double value = 0;
};
std::vector<RungRow> rung_results(index::Database& db, std::int64_t sweep);

}  // namespace runner::sweep
