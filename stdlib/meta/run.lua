---@meta
-- Runs and the index: runner.start, the Run object (metrics, images, checkpoints, restore), runner.load_run,
-- runner.query, runner.home (stdlib/runner/run.lua; the run itself is runtime/run).

--- Starts the run of this script and records it in the index (RUNNER_HOME/index.db, RUNNER_HOME defaulting
--- to ./runs): a row with the script path and its sha256, the resolved config, the git revision of the
--- script's repository (and whether it was modified), host, pid, device, seed and versions; a directory
--- RUNNER_HOME/<name>/ with script.lua (a copy), config.json and log.txt (log messages and printed output
--- from now on). Seeds torch (CPU and CUDA) and math.random from `seed`, then the config's `seed`, else a
--- fresh one (recorded); rank r of a data-parallel job seeds them from seed + r (its dropout masks differ from
--- the other ranks'; the weights all start from rank 0's). The device is options.device, else the config's
--- `device`, else "auto".
--- The name is options.name, else the config's `name`, else "<script>-<n>"; a name that exists is an error.
--- `parent` (an id, id prefix, name or 'last') links the run to the run it continues from.
--- `resume`: true (the default: continue the latest run of this script with the same config that has a
--- checkpoint when it was interrupted or failed; after a finished one, start a new run), false (always a new
--- run), or a run reference (continue that run, finished or not); `runner --resume RUN` and `runner --fresh` on
--- the command line win over it. A resumed run keeps its seed unless one is given. Each start and resume is an
--- attempt of the run, recorded with its config, world size, hosts and steps (the index's `attempts` table).
--- `fork` (a run reference) starts a new run, with that run as parent, from its newest good checkpoint
--- (run:restore loads it); fork 'last' is the newest run that has a checkpoint.
--- The run ends when the script ends: `finished` on success, `failed` with the error text on an error or a
--- nonzero os.exit, `interrupted` on Ctrl-C, SIGTERM or SIGHUP (exit status 130, 143, 129). A process killed
--- outright shows as interrupted once its heartbeat stops (immediately on the same host). Metrics logged
--- before the end are flushed to the index whenever the process lives to end the run (not after SIGKILL or a
--- crash, where what was flushed before stays). A usage error (runner.usage_error) before the first step, with
--- nothing recorded, leaves no run: a new run is deleted, a resumed one stays as it was; check arguments
--- before runner.start and a mistake starts no run at all.
---@param cfg? table the config from config{} (default runner.config, or {})
---@param options? StartOptions
---@return Run
function runner.start(cfg, options) end

---@class StartOptions
---@field name? string                 default: the config's name, else "<script>-<n>"
---@field seed? integer                default: the config's seed, else the resumed run's, else a fresh one
---@field device? string               default: the config's device, else "auto"
---@field parent? string               a run reference
---@field fork? string                 a run reference ('last': the newest run with a checkpoint): start from its newest
---                                    good checkpoint
---@field resume? boolean|string       default true (see above)
---@field flush_interval? number       seconds between metric commits (default 1)
---@field heartbeat? number            seconds between heartbeats (default 5)
---@field system_metrics? number|false seconds between samples of the system metrics (default 10; false or 0: none):
---                                    sys/cpu_percent and sys/host_cpu_percent (100 = one core; the host's: all cores),
---                                    sys/rss_mib, sys/peak_rss_mib, sys/host_memory_used_mib and
---                                    sys/host_memory_available_mib, sys/steps_per_second; with a loader given to
---                                    run:restore sys/loader_queue_depth, sys/data_wait_percent,
---                                    sys/samples_per_second; on CUDA the allocator's sys/cuda_allocated_mib,
---                                    sys/cuda_reserved_mib, sys/cuda_peak_allocated_mib and, from the driver (NVML),
---                                    sys/gpu_percent, sys/gpu_memory_used_mib, sys/gpu_power_watts,
---                                    sys/gpu_temperature_celsius. Logged by rank 0 at run.step, the first one interval
---                                    after the start (a shorter run has none).

---@class Run
---@field id string       # 8 characters of [0-9a-z]; what `runner show` takes (or a unique prefix of it)
---@field name string
---@field dir string      # the run directory, RUNNER_HOME/<name>
---@field step integer    # the step metrics and images are recorded at; set it, or use run:steps()
---@field seed integer
---@field device string   # "cpu", "cuda:0", ...
---@field config table
local Run = {}

--- Records each name = value at `step` (default run.step). Values are numbers or one-element tensors; a
--- tensor is read by the background writer, so logging a CUDA loss does not wait for the GPU. The call only
--- queues: rows reach the index in one transaction per flush (every flush_interval seconds, default 1, or
--- every 50,000 values). Logging a name again at the same step replaces the value.
--- A tensor of more than one element (`run:log { weights = model.fc.weight }`) is a histogram, as TensorBoard's:
--- 64 equal bins over the range of its finite values (NaN and infinities counted apart), counted on its device
--- and written to the index (the histograms table) before the call returns; the dashboard's run page draws it.
---@param values table<string, number|Tensor>
---@param step? integer
function Run:log(values, step) end

--- True when run.step is a positive multiple of n.
---@param n integer
---@return boolean
function Run:every(n) end

--- `for step in run:steps(total) do ... end`: steps run.step + 1 .. total, keeping run.step current. With a
--- trainer attached by run:restore, run.step advances when the trainer steps (so a checkpoint saved before the
--- trainer's step, by a stop signal or run:checkpoint, is labelled with the step its state holds); a body
--- that takes no trainer step still moves on to the next step.
---@param total integer
function Run:steps(total) end

--- Writes a PNG grid (as runner.save_grid) to images/<name>-<step, 7 digits>.png in the run directory and
--- records it as an image artifact; returns the path. `runner report` shows the latest grid of each name.
---@param name string letters, digits, '_', '-', '.'
---@param images Tensor [N, 1 or 3, H, W]
---@param options? GridOptions
---@return string
function Run:images(name, images, options) end

--- Merges final numbers (or strings) into the run's summary, shown by `runner runs` and used by --sort.
---@param values table<string, number|string|boolean|Tensor>
function Run:set_summary(values) end

--- Tags the run: names to find it by (`runner runs --where "tag = 'baseline'"`), shown by `runner runs`, `runner
--- show`, the report and the dashboard. Each is 1 to 100 letters, digits, '_', '-' and '.' (as run names); a tag the
--- run has already is kept once. `runner tag RUN TAG...` does the same from the shell (-d removes).
--- Example: `run:tag("baseline", "cifar")`
---@param tag string
---@param ... string
function Run:tag(tag, ...) end

--- Sets the run's note, a text for people shown beside its tags (`runner note RUN TEXT` from the shell); an empty
--- text removes it.
---@param text string
function Run:note(text) end

--- Returns once every value logged so far is committed to the index.
function Run:flush() end

--- Ends the run now with `status` (finished, failed or interrupted; default finished) and an error text.
---@param status? string
---@param error? string
function Run:finish(status, error) end

---Attaches what a checkpoint holds to the run and continues from the newest good checkpoint of this run (or,
---for runner.start{fork = RUN}, of that run): weights, EMA, optimizer moments, loss scale, LR schedule, step,
---every RNG stream (CPU and each CUDA device), the loader's position and each state object's state().
---Checkpoints whose files do not match their recorded sha256 are reported and skipped, and leftovers of
---a save that died half-way are deleted. From now on the first SIGINT/SIGTERM/SIGUSR1/SIGHUP lets the
---step and the rest of the loop body run; at the next train:step or loader batch the run saves a
---checkpoint, is marked interrupted and exits 0 (130 for SIGINT). Before the first step nothing is saved.
---@param options RestoreOptions
---@return integer step the step restored (0 when starting from scratch)
function Run:restore(options) end

---Saves a checkpoint of step run.step as checkpoints/step-NNNNNNN/ (model.safetensors, ema.safetensors,
---optimizer.safetensors, trainer.safetensors, manifest.json; with a sharded trainer each rank's rows of the optimizer
---state and EMAs in shard-R-of-N.safetensors instead, so every rank must call it: `runner consolidate` writes them
---whole): the tensors are copied (the stall, returned
---and logged as time/checkpoint_stall_ms) and written, verified, indexed and rotated by a background thread.
---A failed save raises at the next step (on_error = "stop") or is logged (on_error = "continue"); the
---previous checkpoint is intact either way. A step saved already is not saved again (stall 0; with wait,
---its save is waited for) unless a metric value is given.
---@param options? CheckpointOptions
---@return number stall_seconds
function Run:checkpoint(options) end

---Stops the run before its next step as a stop signal does (SIGTERM): a checkpoint, status interrupted (a later
---start of the script continues it), exit status 0. Every rank of a data-parallel job stops at the same step.
---Needs run:restore. From `runner attach`, "stop after this step".
function Run:stop() end

---@class RestoreOptions
---@field trainer Trainer              required
---@field loader? Loader               its position is saved and restored
---@field state? table<string, {state: fun(self): table, load_state: fun(self, s: table)}> named objects saved with each
---                            checkpoint
---@field keep_last? integer           keep the newest K checkpoints (default 3)
---@field keep_best? integer           and the best N by `metric` (default 0)
---@field metric? string               what keep_best ranks by (run:checkpoint's value)
---@field mode? "min"|"max"            whether lower or higher metric values are better (default min)
---@field on_error? "stop"|"continue"  a failed save: raise at the next step (default) or log and go on

---@class CheckpointOptions
---@field metric? string               the metric this checkpoint is ranked by (default: run:restore's)
---@field value? number                its value
---@field wait? boolean                return once the files are written, verified and indexed (default false)

--- How many metric values the writer has committed so far.
---@return integer
function Run:native_rows() end

--- A read-only SQL query over the index (schema: docs/index-schema.md). `?` parameters take the extra
--- arguments (numbers, strings, booleans, nil). Returns the rows, each a table keyed by column name (NULL
--- values are absent), and the column names. A statement that would write is refused.
---
--- Example: `runner.query("SELECT name, json_extract(summary, '$.swd') AS swd FROM runs WHERE status = ?", "finished")`
---@param sql string
---@return table[] rows
---@return string[] columns
function runner.query(sql, ...) end

---@class LoadRunOptions
---@field checkpoint? integer  the step of the checkpoint to load (default: the newest one whose files verify)
---@field ema? boolean         the EMA's weights (default true; false: the trained weights, model.safetensors)
---@field device? string       where the model is built (default "auto": the GPU when there is one)

---@class LoadedRun
---@field run {id: string, name: string, dir: string, status: string}
---@field config table          the run's config, as it ran
---@field step integer          the checkpoint's step
---@field checkpoint string     the checkpoint's directory
---@field ema boolean           whether model holds the EMA's weights
---@field model Module          in eval mode: the trainer's ema_model (else its model) with the checkpoint's weights
---@field objective? Diffusion  the runner.diffusion (DDPM or flow) whose objective the trainer was given

--- A run's model as the run built it, with the weights of one of its checkpoints, its config and its objective, to
--- sample or evaluate (`loaded.objective:sample(loaded.model, {...})`). Read-only: no run, attempt or file is
--- written. The model is rebuilt by the run's own script (the copy in its folder) run with its config up to
--- `runner.trainer`, which ends it there: runner.start gives a stand-in (its id, name, dir, config and device;
--- nothing else), the script's globals stay apart from the caller's, and what the script reads before it builds
--- the model (data for its shape, say) must still be there, or load_run fails naming the script's error. A
--- sharded checkpoint's EMA is read from the ranks' files. RUN: an id, a unique id prefix, a name or "last" (the
--- newest run, sweep trials included). Errors name the run and what is missing (no checkpoint, no checkpoint of
--- that step, damaged files).
---@param run string
---@param options? LoadRunOptions
---@return LoadedRun
function runner.load_run(run, options) end

--- The directory of the index and run directories: RUNNER_HOME, or ./runs.
---@return string
function runner.home() end

--- The run runner.start opened in this process, until it finishes.
---@type Run|nil
runner.run = nil
