// Fencing of sweep trials: a trial's process writes to the index only while the trial is still the claim it was
// started for. Every claim or takeover of a trial gives it a new generation (trials.generation); the process checks
// its own in each write transaction, so a process that was silent past the sweep's takeover_after (stopped, cut off,
// paused) and then resumes writes nothing over the worker that took its trial over.
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

// This process's fence (core::launch_context); none outside a sweep trial, or for a trial started by hand.
std::optional<TrialFence> this_process_fence();

// Why the fence no longer holds, in the caller's write transaction (whose trial row it locks shared until the commit,
// so no claim changes it meanwhile): "trial N of sweep S was taken over by host H (generation G); this process stops
// without writing". None while the trial's generation is the fence's.
std::optional<std::string> trial_taken_over(Database& db, const TrialFence& fence);

// Who took the trial over, for messages: "by host H" of the worker running it now, else of its run's latest attempt
// not made by process `lost_pid` of this host (the trial may have ended since), else "by another worker".
std::string taken_over_by(Database& db, int64_t sweep, int64_t trial, int64_t lost_pid);

// In a trial's process: every write transaction of `db` first checks this_process_fence(). A trial taken over ends the
// process at once, with the message on stderr and in the run's log and exit status core::kExitTrialTakenOver: its
// open transaction is never committed, and no thread of it (the metric writer, a checkpoint save, the run's end) writes
// anything more. Nothing outside a sweep trial.
void fence_this_process(Database& db);

// Runs the connection's write check without writing (before a checkpoint's files are moved into the run folder).
void check_write_access(Database& db);

}  // namespace runner::index
