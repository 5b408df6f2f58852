-- runner.trainer: the training step in C++ (autocast, accumulation, loss scaling, clipping, the non-finite
-- guard, optimizer, LR schedule, EMA) with a progress display; run:checkpoint / run:restore for crash-proof
-- resumable runs with graceful stops on SIGINT/SIGTERM/SIGUSR1; runner.early_stopping and
-- runner.find_batch_size. Natives in bindings/train_binding.cpp and bindings/runs_binding.cpp.
local native = runner._train
runner._train = nil

local check_options = require("runner.options").check

local Trainer = {}
local Run = require("runner.run")

local function named(iterate)
  local list = {}
  for name, tensor in iterate do list[#list + 1] = { name, tensor } end
  return list
end

local function tensors_of(module, kind)
  local list = {}
  for _, pair in ipairs(named(kind == "buffers" and module:named_buffers() or module:named_parameters())) do
    list[#list + 1] = pair[2]
  end
  return list
end

local optimizer_keys = { kind = true, lr = true, weight_decay = true, betas = true, eps = true, momentum = true,
                         dampening = true, nesterov = true, groups = true }

-- {"adamw", lr = ...} or {kind = "adamw", ...}: the optimizer's kind and its parameter groups over `model`.
local function optimizer_groups(spec, model)
  if type(spec) == "string" then spec = { spec } end
  if type(spec) ~= "table" then error("runner.trainer: 'optimizer' must be a table such as {\"adamw\", lr = 1e-4}", 3) end
  local kind = spec.kind or spec[1] or "adamw"
  local given = {}
  for k, v in pairs(spec) do if k ~= 1 then given[k] = v end end
  check_options(given, "optimizer", optimizer_keys, 3)
  if type(spec.lr) ~= "number" then error("runner.trainer: the optimizer needs a learning rate (optimizer = {\"" .. kind .. "\", lr = ...})", 3) end
  local defaults = {}
  for k, v in pairs(given) do if k ~= "kind" and k ~= "groups" then defaults[k] = v end end
  local function trainable(value)
    if nn.is_module(value) then
      local list = {}
      for _, p in ipairs(value:parameters()) do if p.requires_grad then list[#list + 1] = p end end
      return list
    end
    return value
  end
  local groups = {}
  if spec.groups then
    for i, group in ipairs(spec.groups) do
      local g = {}
      for k, v in pairs(defaults) do g[k] = v end
      for k, v in pairs(group) do g[k] = v end
      if g.params == nil then error(string.format("runner.trainer: optimizer group %d has no params", i), 3) end
      g.params = trainable(g.params)
      groups[i] = g
    end
  else
    local g = {}
    for k, v in pairs(defaults) do g[k] = v end
    g.params = trainable(model)
    groups[1] = g
  end
  return string.lower(kind), groups
end

local function ema_list(ema)
  if ema == nil or ema == false then return {} end
  if type(ema) == "number" then return { { decay = ema } } end
  if type(ema) == "table" and ema.decay ~= nil then return { ema } end
  if type(ema) == "table" then
    local list = {}
    for i, e in ipairs(ema) do list[i] = type(e) == "number" and { decay = e } or e end
    return list
  end
  error("runner.trainer: 'ema' must be a decay, a table {decay = ..., warmup = ...} or a list of them", 3)
end

--- runner.trainer{model, optimizer, schedule, warmup, ema, ema_model, amp, accumulate, clip, on_nonfinite,
--- steps, batch, progress, tf32, deterministic, scaler} -> Trainer (see stdlib/meta/train.lua)
function runner.trainer(options)
  options = check_options(options, "runner.trainer", {
    model = true, optimizer = true, schedule = true, warmup = true, ema = true, ema_model = true, amp = true,
    accumulate = true, clip = true, on_nonfinite = true, steps = true, batch = true, progress = true, tf32 = true,
    deterministic = true, scaler = true,
  })
  local model = options.model
  if not nn.is_module(model) then error("runner.trainer: 'model' must be a module", 2) end
  local kind, groups = optimizer_groups(options.optimizer or error("runner.trainer: 'optimizer' is required, e.g. {\"adamw\", lr = 1e-4}", 2), model)
  local parameters = named(model:named_parameters())
  if #parameters == 0 then error("runner.trainer: the model has no parameters", 2) end
  local device = parameters[1][2].device

  local schedule = options.schedule
  if type(schedule) == "string" then schedule = { kind = schedule } end
  schedule = schedule or { kind = "constant" }
  local copy = {}
  for k, v in pairs(schedule) do copy[k] = v end
  schedule = copy
  if options.warmup ~= nil then schedule.warmup_steps = options.warmup end
  if (schedule.kind == "cosine" or schedule.kind == "linear") and schedule.total_steps == nil then
    if type(options.steps) ~= "number" then
      error("runner.trainer: a " .. schedule.kind .. " schedule needs schedule.total_steps or the trainer's 'steps'", 2)
    end
    schedule.total_steps = math.max(1, options.steps - (schedule.warmup_steps or 0))
  end

  if options.deterministic then native.set_deterministic(true) end
  local tf32 = options.tf32
  if tf32 == nil then tf32 = device:match("^cuda") ~= nil and not options.deterministic end
  native.set_tf32(tf32)

  local emas = ema_list(options.ema)
  local ema_models = options.ema_model
  if nn.is_module(ema_models) then ema_models = { ema_models } end
  ema_models = ema_models or {}

  local trainer = setmetatable({
    native = native.new {
      parameters = parameters, buffers = named(model:named_buffers()), optimizer = kind, groups = groups,
      schedule = schedule, emas = emas, amp = options.amp, accumulate = options.accumulate, clip = options.clip,
      on_nonfinite = options.on_nonfinite, device = device, scaler = options.scaler,
    },
    model = model, device = device, accumulate = options.accumulate or 1, step_count = 0, ema_models = ema_models,
    ema_synced = {}, total_steps = options.steps, batch = options.batch, last_return = nil,
  }, Trainer)
  if options.progress ~= false and type(options.steps) == "number" then
    trainer.progress = native.progress { total = options.steps, batch = options.batch }
  end
  return trainer
end

function Trainer.__index(self, key)
  if key == "ema" then return self:ema_model(1) end
  return Trainer[key]
end

function Trainer:__tostring()
  return string.format("Trainer(step %d, %s, %s)", self.step_count, self.native:precision(), self.native:describe_schedule())
end

-- The micro-batches of a loader batch: every tensor whose first dimension is the batch size is split into
-- `count` equal parts; other fields are shared.
local function split_batch(batch, count)
  if count == 1 then return { batch } end
  local size
  if torch.is_tensor(batch) then size = batch.shape[1] else size = batch.data and batch.data.shape[1] end
  if size == nil then error("train:step: cannot split a batch without a 'data' tensor into micro-batches", 3) end
  if size % count ~= 0 then
    error(string.format("train:step: a batch of %d does not split into %d equal micro-batches (accumulate)", size, count), 3)
  end
  local part = size / count
  local micro = {}
  for i = 1, count do
    if torch.is_tensor(batch) then
      micro[i] = batch:narrow(1, (i - 1) * part + 1, part)
    else
      local m = {}
      for k, v in pairs(batch) do
        if torch.is_tensor(v) and v:dim() > 0 and v.shape[1] == size then m[k] = v:narrow(1, (i - 1) * part + 1, part)
        else m[k] = v end
      end
      micro[i] = m
    end
  end
  return micro
end

local function batch_inputs(batch)
  if batch == nil then return nil end
  if torch.is_tensor(batch) then return { data = batch } end
  local inputs = {}
  for k, v in pairs(batch) do if torch.is_tensor(v) then inputs[k] = v end end
  return inputs
end

--- train:step([batch,] loss_fn) -> {loss, grad_norm, lr, loss_scale, skipped, step, timing}
--- With a batch, loss_fn(micro_batch) is called for each of `accumulate` equal slices of it; without one,
--- loss_fn(i, n) for i = 1..n. Values are device tensors: reading one waits for the device.
function Trainer:step(batch, loss_fn)
  if loss_fn == nil then batch, loss_fn = nil, batch end
  if type(loss_fn) ~= "function" then error("train:step expects ([batch,] loss_function)", 2) end
  local call = loss_fn
  if batch ~= nil then
    local micro = split_batch(batch, self.accumulate)
    call = function(i) return loss_fn(micro[i]) end
  end
  local started = runner.clock()
  local out = self.native:step(call, batch_inputs(batch))
  local timing = self.native:timing()
  timing.data = self.last_return and (started - self.last_return) or 0
  out.timing = timing
  self.step_count = out.step
  local run = runner.run
  if run and run._attached and run._attached.trainer == self then
    run.step = out.step
    run.native:set_step(out.step)
    run:_drain_checkpoint_reports(false)
  end
  if self.progress then
    self.progress:update(out.step, { { "loss", out.loss } }, out.lr, native.device_memory(self.device))
  end
  local signal = native.stop_signal()
  if signal ~= 0 and run and run._attached and run._attached.trainer == self then run:_stop(signal) end
  self.last_return = runner.clock()
  return out
end

--- train:ema_model([i = 1]) -> the i-th EMA model (ema_model option) holding the current average.
function Trainer:ema_model(i)
  i = i or 1
  local model = self.ema_models[i]
  if model == nil then
    error(string.format("train.ema: pass ema_model = <another instance of the model> to runner.trainer to get EMA model %d", i), 2)
  end
  if self.ema_synced[i] ~= self.step_count then
    self.native:copy_ema(i, tensors_of(model, "parameters"), tensors_of(model, "buffers"))
    self.ema_synced[i] = self.step_count
  end
  return model
end

--- train:lr([group = 1]) -> the learning rate of the next step
function Trainer:lr(group) return self.native:lr(group) end

--- train:observe(metric): feeds a validation metric to a plateau schedule.
function Trainer:observe(metric) self.native:observe(metric) end

--- train:precision() -> "fp32", "bf16" or "fp16"
function Trainer:precision() return self.native:precision() end

--- train:finish_progress(): prints the final progress line (runs by itself at the last step).
function Trainer:finish_progress()
  if self.progress then self.progress:update(self.step_count, {}, self:lr(), native.device_memory(self.device), true) end
end

-- Checkpoints ------------------------------------------------------------------------------------------

-- After every checkpoint save and every restore, math.random restarts from (seed, step): a resumed run
-- draws what an uninterrupted one draws.
local function reseed_lua_random(run, step)
  math.randomseed(((run.seed or 0) * 1000003 + step * 7919) % 2147483647)
end

local function megabytes(bytes) return string.format("%.1f MB", bytes / 1e6) end

function Run:_drain_checkpoint_reports(wait)
  local attached = self._attached
  for _, report in ipairs(self.native:checkpoint_reports(wait)) do
    if report.error then
      local message = string.format("checkpoint %s could not be saved: %s", report.path, report.error)
      if attached and attached.on_error == "continue" then
        runner.log.error("%s (the run continues; the previous checkpoint is intact)", message)
      else
        error(message .. " (the previous checkpoint is intact)", 0)
      end
    else
      runner.log.info("checkpoint %s saved: %s in %.2f s (stall %.1f ms)", report.path, megabytes(report.bytes),
        report.seconds, (self._stalls and self._stalls[report.step] or 0) * 1000)
      for _, dropped in ipairs(report.dropped) do runner.log.info("checkpoint %s deleted (rotation)", dropped) end
    end
  end
end

local function extra_state(attached)
  local extra = { state = {} }
  if attached.loader then extra.loader = attached.loader:state() end
  for name, object in pairs(attached.state or {}) do extra.state[name] = object:state() end
  return extra
end

--- run:checkpoint([{metric, value, wait = false}]) -> stall seconds. Saves the trainer, loader and state given
--- to run:restore at run.step; the files are written by a background thread.
function Run:checkpoint(options)
  options = check_options(options, "run:checkpoint", { metric = true, value = true, wait = true })
  local attached = self._attached
  if not attached then
    error("run:checkpoint: call run:restore{trainer = ..., loader = ...} first: it tells the run what a checkpoint holds", 2)
  end
  self:_drain_checkpoint_reports(false)
  local stall = self.native:checkpoint(attached.trainer.native, self.step, extra_state(attached), {
    metric = options.metric or attached.metric, value = options.value, keep_last = attached.keep_last,
    keep_best = attached.keep_best, mode = attached.mode,
  })
  self._stalls = self._stalls or {}
  self._stalls[self.step] = stall
  self:log { checkpoint_stall_ms = stall * 1000 }
  reseed_lua_random(self, self.step)
  if options.wait then self:_drain_checkpoint_reports(true) end
  return stall
end

--- run:restore{trainer, loader, state, keep_last = 3, keep_best = 0, metric, mode = "min", on_error = "stop"}
--- -> step. Attaches what checkpoints hold and continues from the newest good checkpoint of this run (or of
--- the run it forks), skipping damaged ones with a warning; 0 when there is none.
function Run:restore(options)
  options = check_options(options, "run:restore", {
    trainer = true, loader = true, state = true, keep_last = true, keep_best = true, metric = true, mode = true,
    on_error = true,
  })
  if getmetatable(options.trainer) ~= Trainer then error("run:restore: 'trainer' (a runner.trainer) is required", 2) end
  local on_error = options.on_error or "stop"
  if on_error ~= "stop" and on_error ~= "continue" then
    error("run:restore: on_error must be 'stop' or 'continue', got '" .. tostring(on_error) .. "'", 2)
  end
  self._attached = {
    trainer = options.trainer, loader = options.loader, state = options.state, keep_last = options.keep_last or 3,
    keep_best = options.keep_best or 0, metric = options.metric, mode = options.mode or "min", on_error = on_error,
  }
  native.graceful(true)
  local choice, rejected = self.native:choose_checkpoint()
  for _, message in ipairs(rejected) do runner.log.warn("checkpoint skipped, it is damaged: %s", message) end
  if choice == nil and self.fork then
    choice, rejected = self.native:choose_checkpoint(self.fork)
    for _, message in ipairs(rejected) do runner.log.warn("checkpoint of %s skipped, it is damaged: %s", self.fork, message) end
    if choice == nil then error("run:restore: run " .. self.fork .. " has no good checkpoint to fork from", 2) end
  end
  if choice == nil then
    reseed_lua_random(self, 0)
    return 0
  end
  local extra = options.trainer.native:restore(choice.dir)
  if options.loader and extra.loader then options.loader:restore(extra.loader) end
  for name, object in pairs(options.state or {}) do
    if extra.state and extra.state[name] ~= nil then object:load_state(extra.state[name]) end
  end
  options.trainer.step_count = choice.step
  options.trainer.ema_synced = {}
  self.step = choice.step
  self.native:set_step(choice.step)
  reseed_lua_random(self, choice.step)
  runner.log.info("restored %s: continuing at step %d", choice.dir, choice.step)
  return choice.step
end

-- A stop signal arrived during a step: checkpoint, mark the run interrupted, exit (0 for SIGTERM/SIGUSR1/
-- SIGHUP, 130 for SIGINT).
function Run:_stop(signal)
  local names = { [2] = "SIGINT", [1] = "SIGHUP", [15] = "SIGTERM", [10] = "SIGUSR1" }
  local name = names[signal] or ("signal " .. signal)
  io.stderr:write(string.format("%s: saving a checkpoint at step %d before stopping\n", name, self.step))
  self:checkpoint { wait = true }
  self:finish("interrupted", string.format("stopped by %s at step %d after saving a checkpoint", name, self.step))
  os.exit(signal == 2 and 130 or 0)
end

local finish_run = Run.finish
function Run:finish(status, message)
  if self._attached then
    native.graceful(false)
    local ok, problem = pcall(self._drain_checkpoint_reports, self, true)
    if not ok then runner.log.error("%s", tostring(problem)) end
  end
  return finish_run(self, status, message)
end

-- Early stopping ---------------------------------------------------------------------------------------

local EarlyStopping = {}
EarlyStopping.__index = EarlyStopping

--- runner.early_stopping{patience = 10, mode = "min", min_delta = 0} -> stopper; stopper:observe(value) is
--- true once `patience` observations in a row failed to beat the best by min_delta.
function runner.early_stopping(options)
  options = check_options(options, "runner.early_stopping", { patience = true, mode = true, min_delta = true })
  local mode = options.mode or "min"
  if mode ~= "min" and mode ~= "max" then error("runner.early_stopping: mode must be 'min' or 'max'", 2) end
  local patience = options.patience or 10
  if type(patience) ~= "number" or patience < 0 or patience ~= math.floor(patience) then
    error("runner.early_stopping: patience must be a whole number, 0 or more", 2)
  end
  return setmetatable({ patience = patience, mode = mode, min_delta = options.min_delta or 0, best = nil, bad = 0,
                        stopped = false }, EarlyStopping)
end

function EarlyStopping:observe(value)
  if torch.is_tensor(value) then value = value:item() end
  local better = value == value and (self.best == nil or
    (self.mode == "min" and value < self.best - self.min_delta) or (self.mode == "max" and value > self.best + self.min_delta))
  if better then
    self.best, self.bad = value, 0
  else
    self.bad = self.bad + 1
  end
  self.stopped = self.bad > self.patience
  return self.stopped
end

function EarlyStopping:state() return { best = self.best, bad = self.bad, stopped = self.stopped } end
function EarlyStopping:load_state(state) self.best, self.bad, self.stopped = state.best, state.bad or 0, state.stopped or false end

-- Batch size --------------------------------------------------------------------------------------------

--- runner.find_batch_size{try = function(batch_size) ... end, device, start = 1, max = 65536} -> the largest
--- batch size for which try (a forward and backward pass) runs without running out of device memory.
function runner.find_batch_size(options)
  options = check_options(options, "runner.find_batch_size", { try = true, device = true, start = true, max = true })
  if type(options.try) ~= "function" then error("runner.find_batch_size: 'try' (a function of the batch size) is required", 2) end
  local device = tostring(options.device or (runner.run and runner.run.device) or torch.device("auto"))
  if not device:match("^cuda") then
    print("find_batch_size: applies to CUDA devices only (on " .. device .. " memory does not bound the batch: a larger "
      .. "batch only swaps); nothing was tried")
    return nil
  end
  local function fits(size)
    local ok, err = pcall(options.try, size)
    torch.cuda.synchronize()
    native.empty_device_cache()
    if ok then return true end
    if tostring(err):lower():find("out of memory", 1, true) then return false end
    error(err, 0)
  end
  local good, bad = 0, nil
  local size = options.start or 1
  local max = options.max or 65536
  while size <= max do
    if fits(size) then good = size; size = size * 2 else bad = size; break end
  end
  if bad == nil then bad = max + 1 end
  while bad - good > 1 do
    local mid = math.floor((good + bad) / 2)
    if fits(mid) then good = mid else bad = mid end
  end
  print(string.format("find_batch_size: %d fits on %s (%d does not)", good, device, bad))
  return good
end

return Trainer
