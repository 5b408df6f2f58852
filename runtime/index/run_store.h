// Runs in the index: creating, resuming and finishing them and their attempts, finding them again by id, id
// prefix, name or `last`, and their own fields: summaries, tags and notes, heartbeats. What is recorded of a run
// beside (metrics read back, checkpoints, inputs, interventions, histograms, artifacts) is run_records.h. All
// functions take an open index (index_database.h).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "runtime/index/database.h"

namespace runner::index {

// A live run rewrites its heartbeat this often; a `running` row whose heartbeat is older than
// kStaleAfterSeconds (or whose process on this host is gone) is shown as interrupted.
inline constexpr double kHeartbeatSeconds = 5.0;
inline constexpr double kStaleAfterSeconds = 60.0;

// Unix time in seconds with sub-second precision.
double now_seconds();
std::string host_name();

struct NewRun {
  std::string name;  // empty: "<script stem>-<n>" with the first free n
  std::string script;
  std::string script_hash;
  nlohmann::json config = nlohmann::json::object();
  std::optional<std::string> git_revision;
  std::optional<bool> git_dirty;
  std::string device;
  std::optional<int64_t> seed;
  int world_size = 1;
  std::vector<std::string> hosts;  // the ranks' hosts, each once, in rank order; empty: this host
  nlohmann::json versions = nlohmann::json::object();
  std::optional<int64_t> parent;
  std::optional<int64_t> sweep;  // the sweep trial this run is (RUNNER_SWEEP / RUNNER_TRIAL)
  std::optional<int64_t> trial;
};

struct RunRecord {
  int64_t run = 0;  // the integer key other tables refer to
  std::string id;   // what users type: 8 characters of [0-9a-z]
  std::string name;
  std::string status;  // as stored: running, finished, failed, interrupted
  std::string script;
  std::string script_hash;
  nlohmann::json config;
  nlohmann::json summary;
  std::optional<std::string> git_revision;
  std::optional<bool> git_dirty;
  std::string host;
  int64_t pid = 0;
  std::string device;
  std::optional<int64_t> seed;
  int world_size = 1;              // of the latest attempt
  std::vector<std::string> hosts;  // of the latest attempt: the ranks' hosts, each once, in rank order
  nlohmann::json versions;
  std::string dir;  // relative to the index's home directory
  double started_at = 0;
  std::optional<double> ended_at;
  double heartbeat_at = 0;
  int64_t step = 0;
  std::optional<std::string> error;
  std::optional<std::string> parent_id;
  int64_t attempts = 1;                      // the start and each resume
  std::optional<double> attempt_started_at;  // the running attempt's start
  double active_seconds = 0;                 // the ended attempts' time
  std::optional<int64_t> sweep;              // the sweep trial it is
  std::optional<int64_t> trial;
  std::vector<std::string> tags;  // sorted
  std::optional<std::string> note;
};

// A run's statuses: running, finished, failed, interrupted (stopped by a signal, killed, or its process gone),
// paused (a sweep trial stopped with a checkpoint at an ASHA rung, waiting for a promotion) and pruned (a paused
// trial its sweep ended there).
inline constexpr std::string_view kRunStatuses[] = {"running", "finished", "failed", "interrupted", "paused", "pruned"};
bool is_run_status(std::string_view status);

// The status users see: a `running` row whose process is gone (same host) or whose heartbeat is stale is
// `interrupted`.
std::string effective_status(const RunRecord& run, double now);
struct AttemptRecord;
// An attempt's status as users see it: the running attempt of a run whose process is gone is interrupted.
std::string effective_attempt_status(const RunRecord& run, const AttemptRecord& attempt, double now);
// Seconds spent running: the ended attempts' time plus the running attempt's so far (to its last heartbeat
// when its process is gone); the pauses between a stop and its resume do not count.
double duration_seconds(const RunRecord& run, double now);
// Seconds from the first start to the end (or now, or the last heartbeat), pauses included.
double wall_seconds(const RunRecord& run, double now);

// A run name (and a sweep name, which names a folder too) is 1 to 100 letters, digits, '_', '-' and '.', not
// starting with '.' and not 'last'; else an IndexError "<what> name '...' is not allowed ...".
void check_name(const std::string& name, std::string_view what = "run");

// After a run that never was (withdrawn before its first step) is deleted: the number of its automatic name
// (`quickstart-3`) is given to the next run, when it was the last one given.
void release_run_name(Database& db, const std::string& name);

// A random key (24 characters of [0-9a-z]) that a client makes for a write it may retry: stored with what the write
// made, it lets the retry of a transaction whose commit went through (its answer lost) find that instead of doing it
// again.
std::string client_key();

// Inserts a running run for this process, with a fresh id and (when none is given) a generated name that
// is free both in the index and as a directory under `home`, and its first attempt. A given name that exists
// is an IndexError.
RunRecord create_run(Database& db, const NewRun& run, const std::string& home);
// Makes an ended run of the index running again in this process (resuming it) as a new attempt: status, pid,
// host, heartbeat, and the script hash, config, git state, device, versions, world size and hosts of `spec`;
// the error and end time are cleared. The attempts before keep what they ran with. A run that is still
// running elsewhere is an IndexError.
RunRecord reopen_run(Database& db, int64_t run, const NewRun& spec);
// The most recently started run of `script` with exactly this config that is not running and has a kept
// checkpoint: `runner.start` continues it unless it finished.
std::optional<RunRecord> latest_run_with_checkpoint(Database& db, const std::string& script,
                                                    const nlohmann::json& config);

// One attempt of a run: its start or a resume (the table `attempts`).
struct AttemptRecord {
  int64_t attempt = 1;  // 1: the start, then each resume
  std::string status;   // running, finished, failed, interrupted
  nlohmann::json config;
  int world_size = 1;
  std::vector<std::string> hosts;
  std::string host;
  int64_t pid = 0;
  std::string device;
  std::optional<int64_t> seed;
  std::string script_hash;
  std::optional<std::string> git_revision;
  std::optional<bool> git_dirty;
  nlohmann::json versions;
  std::optional<int64_t> start_step;  // the step it started from: 0, or the step of the checkpoint it restored
  std::optional<int64_t> end_step;    // the step it reached (it ran start_step + 1 .. end_step)
  std::optional<double> started_at;   // NULL only for attempts recorded before the index kept them
  std::optional<double> ended_at;
  std::optional<std::string> error;
};
// Oldest first.
std::vector<AttemptRecord> run_attempts(Database& db, int64_t run);
// The running attempt continues from `step` (a checkpoint it restored): its start and end step.
void set_attempt_start(Database& db, int64_t run, int64_t step);
// Takes back the latest attempt of a resumed run: deletes its row and puts the run's row back as the attempt
// before left it (status, error, end, config, world size, hosts, device, versions, script and git state).
// An IndexError when there is no earlier attempt on record. `attempt` is the attempt to take back: nothing changes
// when the run has fewer (it was taken back already).
RunRecord drop_latest_attempt(Database& db, int64_t run, int64_t attempt);
// status: finished, failed or interrupted.
void finish_run(Database& db, int64_t run, const std::string& status, const std::optional<std::string>& error);
// Merges `values` into the summary object.
void merge_summary(Database& db, int64_t run, const nlohmann::json& values);
void record_heartbeat(Database& db, int64_t run, int64_t step, double now);

// Tags name runs to find them again (`baseline`): each follows the run-name rule (check_name), else an IndexError
// "tag name '...' is not allowed ...". Adding a tag the run has changes nothing.
void add_run_tags(Database& db, int64_t run, const std::vector<std::string>& tags);
// Removes the tags; a tag the run does not have is an IndexError naming it and the run's tags, and nothing changes.
void remove_run_tags(Database& db, int64_t run, const std::vector<std::string>& tags);
// A line of text about the run for people; none (or empty text) removes it.
void set_run_note(Database& db, int64_t run, const std::optional<std::string>& note);

RunRecord load_run(Database& db, int64_t run);
// Which runs `last` chooses from: those not started by a sweep (the default), or every run (`last --sweep`).
enum class LastAmong { runs_outside_sweeps, all_runs };
// `reference`: an exact id, an exact name, `last` (the most recently started run) or a unique prefix of
// an id. Throws IndexError "no run matches '...'" or "run prefix '...' is ambiguous: ...".
RunRecord resolve_run(Database& db, const std::string& reference, LastAmong last = LastAmong::runs_outside_sweeps);
// A run to fork from: as resolve_run, except that 'last' is the newest run with a kept checkpoint.
RunRecord resolve_fork_source(Database& db, const std::string& reference);

struct RunFilter {
  std::optional<std::string> status;     // effective status
  std::optional<std::string> name_glob;  // SQLite GLOB on the name
  std::optional<double> started_after;   // unix seconds
  std::optional<int64_t> sweep;          // the trials' runs of this sweep
  std::optional<int64_t> limit;
};
// Newest first.
std::vector<RunRecord> list_runs(Database& db, const RunFilter& filter);
// Ends the `running` rows whose process is gone: with the final status the process wrote into its run
// directory when the index could not take it (index/final_status.h), else as interrupted. Returns how many.
int reap_stale_runs(Database& db, double now, const std::string& home);

// Marks a `running` run whose heartbeat is still `heartbeat_at` interrupted: ended at that heartbeat (its attempt
// too), with `error` unless it has one. In the caller's transaction. False when the row changed meanwhile (a new
// heartbeat, an end).
bool interrupt_silent_run(Database& db, int64_t run, double heartbeat_at, const std::string& error);

}  // namespace runner::index
