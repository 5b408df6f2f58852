// A sweep's workers as a Slurm job array (`runner sweep FILE --slurm N`): the job script, one `runner sweep --join`
// per array task on the GPUs Slurm gives it, and its submission with `sbatch --parsable`.
#pragma once

#include <string>
#include <vector>

namespace runner::sweep {

// The most array tasks --slurm N asks for (Slurm's own MaxArraySize defaults to 1001).
constexpr int kMostSlurmWorkers = 10000;

struct SlurmJob {
  std::string sweep;                        // the sweep's name, which each task joins
  std::string sweep_file;                   // absolute path, named in the script's header
  int workers = 1;                          // array tasks 0 .. workers - 1
  std::string runner;                       // absolute path of the runner executable
  std::string home;                         // absolute RUNNER_HOME, on a filesystem the nodes share
  std::string index_url;                    // RUNNER_INDEX; "" for RUNNER_HOME's SQLite index
  std::string working_directory;            // absolute; the tasks start there
  std::vector<std::string> sbatch_options;  // the user's, after "--": #SBATCH lines after runner's own
};

// Where the job script is written and where the tasks' output goes: RUNNER_HOME/sweeps/NAME/slurm-job.sh and
// slurm-%A_%a.log (job and task) beside the trials' logs.
std::string slurm_job_script_path(const SlurmJob& job);

// The job script: #SBATCH lines (the array, the output, --requeue, --signal=B:USR1@120, then the user's options),
// RUNNER_HOME and RUNNER_INDEX, and the worker, which USR1 before the time limit stops with a checkpoint of its
// trials before the task requeues itself. A SweepError for an sbatch option that cannot go on an #SBATCH line.
std::string slurm_job_script(const SlurmJob& job);

// Writes the script (mode 0600: RUNNER_INDEX may hold a password) and submits it with `sbatch --parsable`;
// returns the job id. sbatch's own messages reach stderr; a std::runtime_error when sbatch is missing or fails.
std::string submit_slurm_job(const std::string& script_path, const std::string& script);

}  // namespace runner::sweep
