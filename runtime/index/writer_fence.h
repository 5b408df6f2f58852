// Fencing of a process's writes to the index: a run's process writes only while the run's latest attempt is the one
// it started or resumed, and a sweep trial's process only while its trial is the claim it was started for. Each resume
// of a run makes a new attempt (runs.attempts) and each claim or takeover of a trial a new generation
// (trials.generation): fencing tokens that the process checks in each write transaction, so a process that was silent
// past the staleness limit or the sweep's takeover_after (stopped, cut off, paused) and then wakes writes nothing over
// the process that took its run or trial over.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/index/database.h"

namespace runner::index {

// The claim of a trial that a process runs: RUNNER_SWEEP, RUNNER_TRIAL and RUNNER_TRIAL_GENERATION.
struct TrialFence {
  int64_t sweep = 0;
  int64_t trial = 0;
  int64_t generation = 0;
};

// This process's trial claim (core::launch_context); none outside a sweep trial, or for a trial started by hand.
std::optional<TrialFence> this_process_trial();

// Why the trial claim no longer holds, in the caller's write transaction (whose trial row it locks shared until the
// commit, so no claim changes it meanwhile): "trial N of sweep S was taken over by host H (generation G, this process
// has F); this process stops without writing". None while the trial's generation is the fence's.
std::optional<std::string> trial_taken_over(Database& db, const TrialFence& fence);

// Who took the trial over, for messages: "by host H" of the worker running it now, else of its run's latest attempt
// not made by process `lost_pid` of this host (the trial may have ended since), else "by another worker".
std::string taken_over_by(Database& db, int64_t sweep, int64_t trial, int64_t lost_pid);

// The attempt of a run that a process writes as: the start (1) or the resume that made it.
struct RunFence {
  int64_t run = 0;
  std::string name;  // for messages: the run may be gone from the index
  int64_t attempt = 1;
};

// Why the run's writer is no longer this attempt, in the caller's write transaction (whose run row it locks until the
// commit, so no resume makes a new attempt meanwhile): "run NAME was resumed by host H (attempt 3, this process has
// attempt 2); this process stops without writing", or that the run is no longer in the index. None while the run's
// latest attempt is the fence's.
std::optional<std::string> run_resumed_elsewhere(Database& db, const RunFence& fence);

// While it lives, this process writes run `fence.run` of the index `db` is connected to as attempt `fence.attempt`:
// every write transaction of this process on that index (any connection, any thread) first checks that the attempt is
// still the run's latest. A run::RunContext holds one from its start or resume until its end is recorded.
class HeldAttempt {
 public:
  HeldAttempt(const Database& db, RunFence fence);
  ~HeldAttempt();
  HeldAttempt(const HeldAttempt&) = delete;
  HeldAttempt& operator=(const HeldAttempt&) = delete;

 private:
  std::string index_;  // Database::path() of the index
  int64_t run_ = 0;
  int64_t attempt_ = 0;
};

// Installs this process's fence on `db` (open_index_for_writing does, for every connection): each write transaction
// first checks the trial claim (this_process_trial) and the attempts held on db's index (HeldAttempt). A claim or an
// attempt that no longer holds ends the process at once, with the message on stderr and in the run's log and exit
// status core::kExitTakenOver: its open transaction is never committed, and no thread of it (the metric writer, a
// checkpoint save, the run's end) writes anything more.
void fence_this_process(Database& db);

// Runs the connection's write check without writing (before a checkpoint's or an image's files are written into the
// run folder, and before they are moved into place).
void check_write_access(Database& db);

}  // namespace runner::index
