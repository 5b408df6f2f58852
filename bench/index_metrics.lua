-- Benchmark (runner side of bench/index_metrics.py): metric rows per second into the run index (SQLite in
-- $RUNNER_HOME, or the PostgreSQL database RUNNER_INDEX names) and the cost of one `run:log` call as the training
-- loop sees it.
-- Starts a run (in $RUNNER_HOME, which must be set: the driver gives each measurement a fresh temporary one),
-- then for step = 1..steps builds a table of `keys` values, as a training loop would ({loss = ..., lr = ...,
-- grad_norm = ..., ...}), and calls run:log(values, step). Each call is timed on its own (runner.clock() before
-- and after: one clock reading, about 0.06 us, is in each figure; its cost is measured and reported), or with
-- sample_every=N > 1 about one in N at random gaps (the others run without clock calls). Then run:flush().
-- The timed calls give the per-call mean and percentiles, the sum of their durations the time the loop spent
-- in run:log ("log_s_estimate", exact when every call is timed); the rest of the loop built the values.
-- work_us=N spins N microseconds per step before building the values, standing for the training step's
-- compute: the producer then runs at a training loop's pace instead of flat out.
--   sustained rows/s = steps x keys / (end of the flush - start of the first log)
-- Value of key i (1-based) at a step: i + step * 1e-6 (the driver checks the sum), a Lua number, or with
-- mode=tensor a one-element CPU tensor, torch.tensor(value) (float32), made while building the table.
-- Prints one line: RESULT {"rows_per_s": ..., "log_us": {...}, ...}
--   RUNNER_HOME=$(mktemp -d) build/runner bench/index_metrics.lua steps=100000 keys=10
--   RUNNER_HOME=$(mktemp -d) build/runner bench/index_metrics.lua mode=tensor steps=20000
local cfg = config {
  steps = 100000,        -- log calls (one per training step)
  keys = 10,             -- values per call
  mode = "number",       -- number or tensor (one-element CPU tensors, torch.tensor(x))
  sample_every = 1,      -- time every call (1), or about every Nth, at random gaps of mean N
  flush_interval = 1.0,  -- the writer's timer, seconds (runner.start's flush_interval)
  work_us = 0,           -- busy-wait this long per step before logging (the training step's compute); 0: none
}
if cfg.mode ~= "number" and cfg.mode ~= "tensor" then runner.usage_error("mode must be number or tensor") end
if cfg.steps < 1 or cfg.keys < 1 or cfg.sample_every < 1 or cfg.flush_interval <= 0 or cfg.work_us < 0 then
  runner.usage_error("steps, keys and sample_every must be >= 1, flush_interval > 0, work_us >= 0")
end
if not os.getenv("RUNNER_HOME") or os.getenv("RUNNER_HOME") == "" then
  runner.usage_error("set RUNNER_HOME to a scratch directory: this writes steps x keys rows into its index")
end

-- Names a training loop logs, then numbered ones.
local common = { "loss", "lr", "grad_norm", "loss_ema", "param_norm", "update_ratio", "step_time",
                 "images_per_s", "data_wait", "gpu_memory" }
local names = {}
for i = 1, cfg.keys do names[i] = common[i] or ("metric_" .. i) end

local clock = runner.clock
-- What one clock reading costs: the timed calls include about one of them.
local clock_overhead
do
  local n = 20000
  local t0 = clock()
  for _ = 1, n do clock() end
  clock_overhead = (clock() - t0) / n
end

local run = runner.start(cfg, { seed = 0, device = "cpu", flush_interval = cfg.flush_interval })
local steps, keys, stride, tensors = cfg.steps, cfg.keys, cfg.sample_every, cfg.mode == "tensor"
-- With sample_every > 1 the gaps between timed calls are random (uniform in 1 .. 2N - 1, mean N), so the timed
-- calls do not fall in step with anything periodic (the writer is woken every 50,000 rows).
math.randomseed(1)
local function gap() return stride == 1 and 1 or math.random(1, 2 * stride - 1) end
local samples, sample_steps, count, timed_s = {}, {}, 0, 0
local next_sample = gap()
collectgarbage("collect")

local work_s = cfg.work_us * 1e-6
local start = clock()
for step = 1, steps do
  if work_s > 0 then
    local until_s = clock() + work_s
    while clock() < until_s do end
  end
  local values = {}
  if tensors then
    for i = 1, keys do values[names[i]] = torch.tensor(i + step * 1e-6) end
  else
    for i = 1, keys do values[names[i]] = i + step * 1e-6 end
  end
  if step == next_sample then
    local t0 = clock()
    run:log(values, step)
    local elapsed = clock() - t0
    count = count + 1
    samples[count] = elapsed
    sample_steps[count] = step
    timed_s = timed_s + elapsed
    next_sample = step + gap()
  else
    run:log(values, step)
  end
end
local logged = clock()
run:flush()
local flushed = clock()

-- The five slowest calls, with their steps.
local slowest = {}
for i = 1, count do
  if #slowest < 5 or samples[i] > samples[slowest[#slowest]] then
    local position = #slowest + 1
    while position > 1 and samples[slowest[position - 1]] < samples[i] do position = position - 1 end
    table.insert(slowest, position, i)
    if #slowest > 5 then slowest[6] = nil end
  end
end
local slowest_parts = {}
for j, i in ipairs(slowest) do
  slowest_parts[j] = string.format('{"step": %d, "us": %.3f}', sample_steps[i], 1e6 * samples[i])
end

table.sort(samples)
local function percentile(p)  -- nearest rank
  if count == 0 then return 0 end
  local rank = math.max(1, math.min(count, math.ceil(p / 100 * count)))
  return samples[rank]
end
local rows = steps * keys
local seconds = flushed - start
local mean = count > 0 and timed_s / count or 0

print(string.format(
  'RESULT {"rows_per_s": %.1f, "rows": %d, "steps": %d, "keys": %d, "mode": "%s", "seconds": %.6f, ' ..
  '"log_loop_s": %.6f, "flush_wait_s": %.6f, "log_loop_rows_per_s": %.1f, "log_s_estimate": %.6f, ' ..
  '"log_us": {"mean": %.4f, "p50": %.4f, "p90": %.4f, "p99": %.4f, "p999": %.4f, "max": %.3f, "samples": %d}, ' ..
  '"slowest": [%s], "log_us_per_row_mean": %.5f, "sample_every": %d, "clock_overhead_us": %.4f, ' ..
  '"flush_interval_s": %g, "work_us": %g, "run_id": "%s", "run_name": "%s", "home": "%s"}',
  rows / seconds, rows, steps, keys, cfg.mode, seconds, logged - start, flushed - logged, rows / (logged - start),
  mean * steps, 1e6 * mean, 1e6 * percentile(50), 1e6 * percentile(90), 1e6 * percentile(99),
  1e6 * percentile(99.9), 1e6 * percentile(100), count, table.concat(slowest_parts, ", "), 1e6 * mean / keys,
  stride, 1e6 * clock_overhead, cfg.flush_interval, cfg.work_us, run.id, run.name, runner.home()))
