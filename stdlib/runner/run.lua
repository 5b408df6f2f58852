-- runner.start: the run context of a script (index row, run directory, seeds, device, metrics, images,
-- summary, checkpoints, restore) and runner.query over the index (natives in bindings/run_binding.cpp and
-- bindings/query_binding.cpp; the run itself is runtime/run).
local native = runner._run
local query_native = runner._query
runner._run, runner._query = nil, nil


local Run = {}

-- run.step lives in the run (runtime/run/run_context.h): a trainer attached by run:restore advances it.
function Run.__index(self, key)
  if key == "step" then return rawget(self, "native"):step() end
  return Run[key]
end

function Run.__newindex(self, key, value)
  if key == "step" then
    if type(value) ~= "number" or value ~= math.floor(value) then error("run.step must be an integer, got " .. tostring(value), 2) end
    self.native:set_step(value)
  else
    rawset(self, key, value)
  end
end

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
  for key, value in pairs(require("runner.config").values(cfg)) do plain[key] = value end
  return plain
end

--- runner.start([cfg [, StartOptions]]) -> Run (the keys: ---@class StartOptions in stdlib/meta/run.lua; the
--- options are checked and the start policy applied by runtime/run/run_start).
function runner.start(cfg, options)
  if runner._load_only then return runner._load_only.start(cfg) end
  if runner._config_wanted() then  -- runner --print-config of a script without config { ... }
    runner._report_config({}, {})
    os.exit(0)
  end
  if type(cfg) ~= "table" and cfg ~= nil then error("runner.start expects the config table (or nothing)", 2) end
  cfg = cfg or runner.config or {}
  local script = arg and arg[0] or nil
  local versions = runner.versions()
  local device = torch.device(options and options.device or declared(cfg, "device") or "auto")
  local native_run = native.start(options, {
    script = script,
    script_text = script and read_file(script) or nil,
    name = declared(cfg, "name"),
    seed = declared(cfg, "seed"),
    device = tostring(device),
    config = plain_config(cfg),
    versions = { runner = versions.runner, libtorch = versions.libtorch, luajit = versions.luajit,
                 sqlite = versions.sqlite, cuda = versions.cuda_runtime ~= "" and versions.cuda_runtime or nil,
                 gpus = #versions.cuda_devices > 0 and versions.cuda_devices or nil },
  })
  local info = native_run:info()
  torch.manual_seed(info.seed + runner.dist.rank)  -- each rank its own stream (dropout masks)
  math.randomseed(info.seed + runner.dist.rank)
  local run = setmetatable({
    native = native_run, id = info.id, name = info.name, dir = info.dir, seed = info.seed,
    device = device, config = cfg,
    fork = info.fork, resumed = info.resumed,
  }, Run)
  runner.run = run
  if run.resumed then
    runner.log.info("run %s (%s) resumed: %s", run.name, run.id, run.dir)
    io.write(string.format("resuming run %s (start a new run with `runner --fresh ...`)\n", run.name))
  else
    runner.log.info("run %s (%s) started: %s", run.name, run.id, run.dir)
  end
  return run
end

--- run:log(values [, step]): records each name = number or one-element tensor at `step` (default run.step); a
--- tensor of more elements is a histogram.
--- Tensors are read by the writer thread, so logging a GPU loss does not wait for the GPU.
function Run:log(values, step)
  if type(values) ~= "table" then error("run:log expects a table of name = value", 2) end
  self.native:log(values, step)
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
  local native = self.native
  local previous
  return function()
    local step = native:step()
    -- A loop body that took no step of the attached trainer still moves on.
    if previous and step < previous then
      native:set_step(previous)
      step = previous
    end
    if step >= total then return nil end
    -- An attached trainer advances run.step when it steps: until then run.step is the step of the state a
    -- checkpoint (a stop before the trainer's step, run:checkpoint) holds.
    if not rawget(self, "_attached") then native:set_step(step + 1) end
    previous = step + 1
    return step + 1
  end
end

--- run:images(name, images [N, C, H, W] [, GridOptions]) -> path
--- Writes a PNG grid as images/<name>-<step>.png in the run directory and records it as an artifact.
function Run:images(name, images, options)
  return self.native:save_images(name, images, options)
end

--- run:set_summary{name = value, ...}: final numbers (or strings) shown by `runner runs` and `runner show`.
function Run:set_summary(values)
  self.native:merge_summary(values)
end

--- run:tag(tag, ...): names for finding the run again (`runner runs --where "tag = 'baseline'"`).
function Run:tag(...)
  self.native:tag(...)
end

--- run:note(text): a line about the run for people, shown by `runner runs`, `runner show` and the dashboard.
function Run:note(text)
  self.native:note(text)
end

--- run:flush(): returns once every value logged so far is in the index.
function Run:flush()
  self.native:flush()
end

--- run:finish([status = "finished" [, error]]): ends the run now (otherwise the end of the script does).
function Run:finish(status, message)
  self.native:finish(status or "finished", message)
  rawset(self, "_attached", nil)
  if runner.run == self then runner.run = nil end
end

-- After every step of the attached trainer, every checkpoint save and every restore, math.random restarts from
-- (seed, step): a run resumed from any checkpoint (also one that a stop signal saved between two run:checkpoint
-- calls) draws what an uninterrupted one draws.
--- run:restore(RestoreOptions) -> step (the keys and defaults: ---@class RestoreOptions in stdlib/meta/run.lua).
--- Attaches what checkpoints hold and continues from the newest good checkpoint of this run (or of the run it
--- forks), skipping damaged ones with a warning; 0 when there is none.
function Run:restore(options)
  if type(options) ~= "table" then error("run:restore expects {trainer = ..., loader = ...}", 2) end
  local trainer, loader, state = options.trainer, options.loader, options.state
  if type(trainer) ~= "table" or trainer.native == nil then error("run:restore: 'trainer' (a runner.trainer) is required", 2) end
  if state ~= nil and type(state) ~= "table" then error("run:restore: 'state' must be a table of name = object", 2) end
  local collect = nil
  if state then
    collect = function()
      local states = {}
      for name, object in pairs(state) do states[name] = object:state() end
      return states
    end
  end
  -- From here on, after each step of this trainer the run reseeds math.random (bindings/run_binding.cpp).
  local step, saved = self.native:restore(options, trainer.native, loader, collect)
  rawset(self, "_attached", { trainer = trainer, loader = loader, state = state })
  if saved then
    for name, object in pairs(state or {}) do
      if saved[name] ~= nil then object:load_state(saved[name]) end
    end
  end
  self.native:reseed_lua_random(step)
  return step
end

--- run:stop(): the run stops before its next step as on a stop signal: a checkpoint, status interrupted (a later
--- start continues it), exit status 0. Every rank of a data-parallel job stops at the same step.
function Run:stop()
  self.native:request_stop()
end

-- A script's own safe point for runner attach outside train:step (a loop that waits between steps): answers what a
-- client sent, as the end of train:step does, with train, batch and out as given (each may be nil).
function Run:_serve_attached(trainer, batch, out)
  self.native:serve_attach(trainer, batch, out)
end

--- run:checkpoint([CheckpointOptions]) -> stall seconds. Saves the trainer, loader and state given
--- to run:restore at run.step; the files are written by a background thread.
function Run:checkpoint(options)
  local stall = self.native:checkpoint(options)
  self.native:reseed_lua_random(self.step)
  return stall
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
  return query_native(sql, ...)
end

--- runner.home(): the directory of the index and the run directories (RUNNER_HOME, default ./runs).
runner.home = native.home
runner._record_evaluation = native.record_evaluation  -- runner sample's scores of a checkpoint (stdlib/commands)

-- The error that ends a run's script at runner.trainer when runner.load_run rebuilds its model.
local rebuilt = setmetatable({}, { __tostring = function() return "the model is rebuilt" end })

-- Runs the run's copy of its script with its config until runner.trainer, and returns what the trainer was
-- given and the diffusion whose objective it was. Nothing of the script is written: runner.start gives a
-- stand-in for the run, and the script's globals go into a table of their own.
local function rebuild(info, device)
  local chunk, problem = loadfile(info.script)
  if not chunk then error(string.format("runner.load_run: run %s's script cannot be read: %s", info.name, problem), 3) end
  local captured
  local loading = { config = info.config, diffusion_of = setmetatable({}, { __mode = "k" }) }
  function loading.start(cfg)
    local stand_in = { id = info.id, name = info.name, dir = info.dir, config = cfg or runner.config,
                       device = torch.device(device), resumed = true }
    stand_in.seed = declared(stand_in.config or {}, "seed")
    return setmetatable(stand_in, { __index = function(_, key)
      if key == "step" then return info.step end
      error(string.format("run.%s is not there while runner.load_run rebuilds run %s's model with its script",
        tostring(key), info.name), 2)
    end })
  end
  function loading.trainer(options)
    captured = options
    error(rebuilt, 0)
  end
  local saved = { load_only = runner._load_only, config = runner.config, run = runner.run }
  runner._load_only, runner.config = loading, nil
  setfenv(chunk, setmetatable({}, { __index = _G }))
  local ok, err = xpcall(chunk, debug.traceback)
  runner._load_only, runner.config, runner.run = saved.load_only, saved.config, saved.run
  if captured == nil then
    if not ok and err ~= rebuilt then
      error(string.format("runner.load_run: rebuilding run %s's model with its script failed: %s", info.name,
        tostring(err)), 3)
    end
    error(string.format("runner.load_run: run %s's script (%s) builds no runner.trainer, so its model cannot be "
      .. "told: build it and load %s/ema.safetensors (or model.safetensors) into it", info.name, info.script,
      info.checkpoint), 3)
  end
  return captured, captured.objective and loading.diffusion_of[captured.objective]
end

--- runner.load_run(RUN [, LoadRunOptions]) -> LoadedRun: a run's model with the weights of a checkpoint, its config
--- and its objective, read-only (---@class LoadRunOptions and LoadedRun in stdlib/meta/run.lua).
function runner.load_run(reference, options)
  if type(reference) ~= "string" then error("runner.load_run: RUN must be a run's id, name or 'last'", 2) end
  options = options or {}
  if type(options) ~= "table" then error("runner.load_run: options must be a table", 2) end
  for key in pairs(options) do
    if key ~= "checkpoint" and key ~= "ema" and key ~= "device" then
      error(string.format("runner.load_run: unknown option '%s' (checkpoint, ema, device)", tostring(key)), 2)
    end
  end
  local info = native.open_run(reference, options.checkpoint)
  local trained, objective = rebuild(info, options.device or "auto")
  local model = trained.ema_model or trained.model
  if not nn.is_module(model) then
    error(string.format("runner.load_run: run %s's script gives runner.trainer no model", info.name), 2)
  end
  local ema = options.ema ~= false
  local weights = native.checkpoint_file(info.checkpoint, ema and "ema.safetensors" or "model.safetensors")
  model:load_state_dict(weights)
  model:eval()
  local config = {}
  for key, value in pairs(info.config) do config[key] = value end
  return {
    run = { id = info.id, name = info.name, dir = info.dir, status = info.status },
    config = config, step = info.step, checkpoint = info.checkpoint, ema = ema,
    model = model, objective = objective,
  }
end

return Run
