-- runner.start: the run context of a script (index row, run directory, seeds, device, metrics, images,
-- summary) and runner.query over the index (natives in bindings/runs_binding.cpp).
local native = runner._index
runner._index = nil

local check_options = require("runner.options").check

local Run = {}
Run.__index = Run

local function read_file(path)
  local file = io.open(path, "rb")
  if not file then return nil end
  local text = file:read("*a")
  file:close()
  return text
end

local function declared(cfg, key)
  local ok, value = pcall(function() return cfg[key] end)
  if ok then return value end
  return nil
end

local function plain_config(cfg)
  local plain = {}
  for key, value in pairs(cfg) do plain[key] = value end
  return plain
end

local function fresh_seed()
  return (os.time() * 1000003 + math.floor(runner.clock() * 1e6)) % 2147483647
end

local raw_print = print
local function logging_print(...)
  raw_print(...)
  local parts = {}
  for i = 1, select("#", ...) do parts[i] = tostring((select(i, ...))) end
  native.log_text(table.concat(parts, "\t"))
end

--- runner.start([cfg [, {name, seed, device, parent, fork, resume, flush_interval}]]) -> Run
--- resume: true (default: continue the latest ended run of this script with the same config that has a
--- checkpoint), false (always a new run), or a run reference (continue that run). `runner --resume RUN|last`
--- and `runner --fresh` on the command line override it. fork: start a new run from another run's latest
--- good checkpoint (run:restore loads it), with that run as parent.
function runner.start(cfg, options)
  if type(cfg) ~= "table" and cfg ~= nil then error("runner.start expects the config table (or nothing)", 2) end
  options = check_options(options, "runner.start", { name = true, seed = true, device = true, parent = true,
                                                     fork = true, resume = true, flush_interval = true })
  local resume = options.resume
  if resume == nil then resume = true end
  if runner.command_line_resume ~= nil then resume = runner.command_line_resume end
  if options.fork ~= nil then
    if type(options.fork) ~= "string" then error("runner.start: fork must be a run reference (id, name or last)", 2) end
    resume = false
  end
  if resume ~= true and resume ~= false and type(resume) ~= "string" then
    error("runner.start: resume must be true, false or a run reference, got " .. tostring(resume), 2)
  end
  cfg = cfg or runner.config or {}
  local seed = options.seed or declared(cfg, "seed") or fresh_seed()
  if type(seed) ~= "number" or seed < 0 or seed ~= math.floor(seed) then
    error("runner.start: seed must be a non-negative integer, got " .. tostring(seed), 2)
  end
  local device = torch.device(options.device or declared(cfg, "device") or "auto")
  local script = arg and arg[0] or nil
  local versions = runner.versions()
  local native_run = native.start {
    script = script,
    script_text = script and read_file(script) or nil,
    name = options.name or declared(cfg, "name"),
    config = plain_config(cfg),
    device = device,
    seed = seed,
    parent = options.parent or options.fork,
    resume = resume ~= false and resume or nil,
    versions = { runner = versions.runner, libtorch = versions.libtorch, luajit = versions.luajit,
                 sqlite = versions.sqlite, cuda = versions.cuda_runtime ~= "" and versions.cuda_runtime or nil,
                 gpus = #versions.cuda_devices > 0 and versions.cuda_devices or nil },
    flush_interval = options.flush_interval,
  }
  local info = native_run:info()
  -- A resumed run keeps the seed it started with unless one is given (run:restore restores the generators).
  if info.resumed and info.seed and options.seed == nil and declared(cfg, "seed") == nil then seed = info.seed end
  torch.manual_seed(seed)
  math.randomseed(seed)
  local run = setmetatable({
    native = native_run, id = info.id, name = info.name, dir = info.dir, seed = seed, device = device,
    config = cfg, step = 0, fork = options.fork, resumed = info.resumed,
  }, Run)
  print = logging_print
  runner.run = run
  if run.resumed then
    runner.log.info("run %s (%s) resumed: %s", run.name, run.id, run.dir)
    raw_print(string.format("resuming run %s (start a new run with `runner --fresh ...`)", run.name))
  else
    runner.log.info("run %s (%s) started: %s", run.name, run.id, run.dir)
  end
  return run
end

--- run:log(values [, step]): records each name = number or one-element tensor at `step` (default run.step).
--- Tensors are read by the writer thread, so logging a GPU loss does not wait for the GPU.
function Run:log(values, step)
  if type(values) ~= "table" then error("run:log expects a table of name = value", 2) end
  self.native:log(values, step or self.step)
end

--- run:every(n): true when run.step is a positive multiple of n.
function Run:every(n)
  if type(n) ~= "number" or n < 1 or n ~= math.floor(n) then
    error("run:every expects a positive integer, got " .. tostring(n), 2)
  end
  return self.step > 0 and self.step % n == 0
end

--- for step in run:steps(total) do ... end: steps run.step + 1 .. total, keeping run.step current.
function Run:steps(total)
  if type(total) ~= "number" or total ~= math.floor(total) then
    error("run:steps expects an integer number of steps, got " .. tostring(total), 2)
  end
  return function()
    if self.step >= total then return nil end
    self.step = self.step + 1
    self.native:set_step(self.step)
    return self.step
  end
end

--- run:images(name, images [N, C, H, W] [, {columns, padding, range, pad_value}]) -> path
--- Writes a PNG grid as images/<name>-<step>.png in the run directory and records it as an artifact.
function Run:images(name, images, options)
  return self.native:save_images(name, self.step, images, options)
end

--- run:set_summary{name = value, ...}: final numbers (or strings) shown by `runner runs` and `runner show`.
function Run:set_summary(values)
  self.native:merge_summary(values)
end

--- run:flush(): returns once every value logged so far is in the index.
function Run:flush()
  self.native:flush()
end

--- run:finish([status = "finished" [, error]]): ends the run now (otherwise the end of the script does).
function Run:finish(status, message)
  self.native:finish(status or "finished", message)
  if print == logging_print then print = raw_print end
  if runner.run == self then runner.run = nil end
end

--- run:native_rows(): how many metric values the writer has committed so far.
function Run:native_rows()
  return self.native:rows_written()
end

function Run:__tostring()
  return string.format("Run(%s, %s, step %d)", self.name, self.id, self.step)
end

--- runner.query(sql, ...) -> rows, columns: a read-only query over the index; rows are tables keyed by column
--- name (NULL values are absent), `?` parameters take the extra arguments.
function runner.query(sql, ...)
  if type(sql) ~= "string" then error("runner.query expects an SQL string", 2) end
  return native.query(sql, ...)
end

--- runner.home(): the directory of the index and the run directories (RUNNER_HOME, default ./runs).
runner.home = native.home

return Run
