---@meta
-- runner.sweep: hyperparameter sweeps. A sweep file returns runner.sweep { ... } and runs with
-- `runner sweep FILE.lua`: each trial is the experiment script run as a child process with key=value
-- overrides (so every trial can be run by hand), recorded as a normal run linked to the sweep and its trial
-- number. `runner sweep --join NAME` adds a worker to a sweep from another shell of the same host (or, with the
-- index on PostgreSQL, from another host); Ctrl-C or SIGTERM stops the running trials with a checkpoint, and the
-- same command continues the sweep.
--
--     return runner.sweep {
--       script = "experiments/quickstart.lua",
--       parameters = { lr = runner.sweep.log_uniform(1e-4, 1e-2), batch = { 32, 64, 128 } },
--       fixed = { steps = 600 },
--       method = "random", trials = 24, metric = "swd", mode = "min",
--       prune = { "asha", min_steps = 100, reduction = 3 },
--       slots = "auto",
--     }

---@class SweepSpace
---@field kind "uniform"|"log_uniform"|"int"|"choice"

---@class SweepPrune
---@field [1] "asha"             asynchronous successive halving
---@field min_steps integer      the first rung: the first value of `metric` logged at or after this step
---@field reduction? integer     rungs at min_steps * reduction^k; a trial goes past a rung only while it is in the best
---                              1/reduction of the trials that reached it (default 3). Once nothing else is left, the
---                              best trial of the highest rung with results runs to the end, so a rung too small to
---                              promote (warned of when the file is checked) still gives a finished best trial
---@field max_steps? integer     the trials' full length (default: fixed.steps, else the script's `steps` default)

---@class SweepDefinition
---@field script string          the experiment script: relative to the working directory, else to the sweep file
---@field parameters table<string, any[]|SweepSpace>  config keys of the script -> a list of values or a space
---@field fixed? table<string, any>  config keys given the same value in every trial
---@field method? "grid"|"random"|"tpe"  grid: every combination of the lists and int ranges (the last parameter by name
---                                      varies fastest); random: seeded uniform draws; tpe: Optuna's tree-structured
---                                      Parzen estimator after 10 random trials (default "random")
---@field trials? integer        how many trials (required for random and tpe; grid: default and maximum the grid's
---                              size)
---@field metric string          a key the script logs with run:log; a trial's result is its last logged value
---@field mode? "min"|"max"      default "min"
---@field seed? integer          the samplers' seed (default 0): the same seed gives the same trials
---@field prune? SweepPrune|false
---@field slots? "auto"|integer  trials at once: auto is one per visible GPU (gpus_per_trial each), else 1 on the CPU;
---                              CPU slots share the cores the worker may use (its CPU affinity, at most a Slurm
---                              allocation's SLURM_CPUS_ON_NODE; threads = cores / slots), and more processes than
---                              cores are refused
---@field gpus_per_trial? integer  GPUs per trial; more than 1 runs each trial data parallel (runner --nproc N)
---@field max_failures? integer  failed trials that stop the sweep (default trials / 2 + 1)
---@field retries? integer       times a trial killed by a signal (the OOM killer's SIGKILL) or stopped by a full disk
---                              is continued from its last checkpoint before it counts as failed (default 1); one
---                              failed for want of disk space gets a fresh round from the next worker that starts
---@field takeover_after? integer  seconds without a heartbeat from a worker on another host (and from its trial's run)
---                              before another worker takes its trials over and continues them from their checkpoints
---                              (default 60; 10 to 604800). A worker on the same host is taken over as soon as its
---                              process is gone. Longer rides out a slow network or a busy index server; shorter
---                              continues the trials of a lost host sooner
---@field name? string           the sweep's name in the index and the folder of its trials' output: letters, digits,
---                              '_', '-' and '.', as run names (default: the sweep file's name without .lua)

--- Declares a sweep; a sweep file returns it. The fields are checked when `runner sweep` reads the file,
--- parameters and fixed keys against the script's config { ... } (names and value types), whole numbers
--- against their ranges, text as UTF-8; errors name the sweep file's line. `--dry-run` checks the same.
---@param definition SweepDefinition
---@return table
function runner.sweep(definition) end

--- A number drawn uniformly from [low, high].
---@param low number
---@param high number
---@return SweepSpace
function runner.sweep.uniform(low, high) end

--- A number whose logarithm is uniform: 0 < low < high (learning rates, weight decays).
---@param low number
---@param high number
---@return SweepSpace
function runner.sweep.log_uniform(low, high) end

--- A whole number from low to high (both included) in steps of `step` (default 1), or log-uniform with
--- log = true (step 1). A grid takes every value.
---@param low integer
---@param high integer
---@param options? SweepIntOptions
---@return SweepSpace
function runner.sweep.int(low, high, options) end

---@class SweepIntOptions
---@field step? integer  the spacing of the values (default 1)
---@field log? boolean   log-uniform draws (step 1; default false)

--- One of the values (a plain list in `parameters` means the same).
---@param values any[]
---@return SweepSpace
function runner.sweep.choice(values) end
