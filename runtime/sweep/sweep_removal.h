// Deleting a sweep: its trials' runs (each as `runner rm` deletes a run), its rows and its output folder.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/index/database.h"
#include "runtime/sweep/trial_store.h"

namespace runner::sweep {

struct RemovedSweep {
  std::int64_t runs = 0;
  std::int64_t trials = 0;
  std::int64_t checkpoints = 0;
  std::uint64_t bytes = 0;  // disk space freed
};

// Refuses (IndexError naming the worker or run) while a worker or a trial's run is alive, unless `force`. The
// runs go first, each through the trash (a crash leaves whole runs, and the same command finishes the job),
// then the sweep's rows (trials, rungs, workers), then RUNNER_HOME/sweeps/NAME.
RemovedSweep remove_sweep(index::Database& db, const std::string& home, const SweepRecord& sweep, bool force);

}  // namespace runner::sweep
