// A sweep worker: claims trials from the index and runs each as a child `runner SCRIPT key=value ...` in a
// slot (a GPU, or a share of the CPU cores), forwards stop signals to them, records how each ended, and
// prints one line per event with the sweep's counts and best value.
#pragma once

#include <string>

#include "runtime/index/index_database.h"
#include "runtime/sweep/trial_store.h"

namespace runner::sweep {

// Slots of a sweep on this host: one per `gpus_per_trial` visible GPUs, else spec.slots (auto: 1) on the CPU.
// A SweepError at the sweep file's line for more slots than GPUs, or on the CPU more processes than cores.
struct Slot {
  std::string cuda_devices;  // CUDA_VISIBLE_DEVICES for its trial; empty on the CPU
  int threads = 1;           // OMP_NUM_THREADS and RUNNER_CORES for its trial
};
std::vector<Slot> sweep_slots(const SweepSpec& spec);

// Runs trials of `sweep` (index at `index`, whose home is absolute: the trials run in other folders) until none is
// left, the failure limit is reached or a stop signal arrives (then every running trial is stopped with a checkpoint
// and the sweep is marked stopped). Trial output goes to <home>/sweeps/<name>/trial-<N>.log. Returns the exit status: 0
// done (or stopped by SIGTERM / SIGHUP / SIGUSR1), 130 stopped by Ctrl-C, 1 when the failure limit stopped it.
int run_sweep_worker(const index::IndexLocation& index, const SweepRecord& sweep);

// The best finished trial's command line: "runner SCRIPT key=value ...", empty when none finished.
std::string best_trial_command(const SweepRecord& sweep, const std::vector<TrialRecord>& trials);

}  // namespace runner::sweep
