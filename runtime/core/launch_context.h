// What this process is, parsed once from the command line and the environment: the resume policy, the log
// level, the steps to profile, its place in a distributed job (torchrun / Slurm variables) and in a sweep, the
// index's location, the collective timeout, the REPL's history file; nothing else reads these facts from the
// environment or writes them into it. Read by the run start policy, the loader's sharding defaults, device "auto", the
// trainer (through the binding) and the REPL; it lives in core because those sit below run/.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace runner::core {

enum class ResumePolicy {
  script,  // what the script's runner.start asks for (by default: continue a matching ended run)
  fresh,   // --fresh: always a new run
  run,     // --resume RUN: continue that run
};

// A sweep trial's next ASHA rung: stop (with a checkpoint) once `metric` is logged at or after `step`.
struct SweepPause {
  std::string metric;
  std::int64_t step = 0;
};

struct LaunchContext {
  ResumePolicy resume = ResumePolicy::script;
  std::string resume_run;  // with ResumePolicy::run: an id, id prefix, name or "last"
  std::string log_level = "info";
  std::string profile;                // --profile A:B (checked): the steps runner.trainer profiles unless its own
                                      // `profile` option says otherwise; "" for none
  int rank = 0;                       // RANK (or SLURM_PROCID)
  int world_size = 1;                 // WORLD_SIZE (or SLURM_NTASKS)
  int local_rank = 0;                 // LOCAL_RANK (or SLURM_LOCALID): the GPU of this process on its node
  int local_world_size = 1;           // LOCAL_WORLD_SIZE (or SLURM_NTASKS_PER_NODE)
  std::string master_addr;            // MASTER_ADDR, else the first host of SLURM_JOB_NODELIST: the rendezvous host
  int master_port = 0;                // MASTER_PORT, else 20000 + SLURM_JOB_ID % 20000
  std::optional<std::int64_t> sweep;  // RUNNER_SWEEP: the sweep this process runs a trial of
  std::optional<std::int64_t> trial;  // RUNNER_TRIAL
  std::optional<std::int64_t> trial_generation;  // RUNNER_TRIAL_GENERATION: the claim of the trial this process runs
                                                 // (index/writer_fence.h: its writes stop once the trial is taken over)
  std::optional<SweepPause> sweep_pause;         // RUNNER_SWEEP_PAUSE=metric@step
  int cores = 0;                // RUNNER_CORES: the CPU cores this process may use (0: all of the host's)
  int slurm_cpus = 0;           // SLURM_CPUS_ON_NODE: the CPUs of this node in the Slurm allocation (0: none)
  std::string failure_file;     // RUNNER_FAILURE_FILE: where this rank reports its failure (runner --nproc)
  bool rank_variables = false;  // RANK or WORLD_SIZE is set (to anything): a launcher started this process
  std::string repl_history;     // RUNNER_HISTORY, else $HOME/.runner_history, else "" (no history kept)
  bool agent_store = false;     // TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent serves the store at
                                // MASTER_PORT, so every rank joins it as a client (as torch.distributed does)
  std::optional<std::vector<std::string>> given_gpus;  // the GPUs this process was given: CUDA_VISIBLE_DEVICES
                                                       // (Slurm sets it for a GPU allocation), else Slurm's
                                                       // SLURM_JOB_GPUS, else the first SLURM_GPUS_ON_NODE;
                                                       // none: every GPU of the host
  std::string slurm_job;      // the Slurm job this process runs in: "JOB_TASK" in a job array (SLURM_ARRAY_JOB_ID,
                              // SLURM_ARRAY_TASK_ID), else SLURM_JOB_ID; "" outside Slurm
  std::string home = "runs";  // RUNNER_HOME (trailing '/' removed), else ./runs: the run folders and, unless
                              // index_url, the index (index/index_database.h: IndexLocation)
  std::string
      index_url;  // RUNNER_INDEX or --index: the index when it is not RUNNER_HOME's SQLite file ("" for that one)
  double dist_timeout_seconds = 300;  // RUNNER_DIST_TIMEOUT: the rendezvous's and every collective's timeout
  // Spans of seconds read where they apply (core/environment_seconds.h), by variable name, as given:
  // RUNNER_ATTACH_IDLE_TIMEOUT and the RUNNER_INDEX_{CONNECT,IDLE,STATEMENT}_TIMEOUT and RUNNER_INDEX_WAIT ones.
  std::map<std::string, std::string> seconds_settings;
  std::string host_leases;  // RUNNER_HOST_LEASES: the folder of this host's sweep slot leases ("" for the default)

  bool distributed() const { return world_size > 1; }
};

// A launch variable that is not a number or out of range; the message names the variable and its value.
struct LaunchError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The first host of a Slurm node list: "gpu[003-006,9],cpu1" -> "gpu003".
std::string first_slurm_host(const std::string& nodelist);

// The launch fields that come from the environment (everything but resume, log level and profile), from `env`
// (name -> value). torchrun's variables win over Slurm's. Throws LaunchError.
LaunchContext launch_context_from_environment(const std::map<std::string, std::string>& env);
// The same from this process's environment.
LaunchContext launch_context_from_environment();

// The CPU cores this process may use, and what says so.
struct UsableCores {
  int count = 1;
  std::string source;  // "RUNNER_CORES", "SLURM_CPUS_ON_NODE", "its CPU affinity" or "" (every core of the host)
};
// RUNNER_CORES when set; else the CPUs of the process's affinity mask (sched_getaffinity: a cgroup's cpuset, taskset,
// Slurm's binding), at most SLURM_CPUS_ON_NODE under Slurm; else the host's cores. At least 1.
UsableCores usable_cores(const LaunchContext& context);

// The process's context: set once by the program's entry point (before anything reads it); a default
// context (single process, resume as the script says) until then.
const LaunchContext& launch_context();
void set_launch_context(const LaunchContext& context);

}  // namespace runner::core
