-- runner.trainer: the training step in C++ (autocast, accumulation, loss scaling, clipping, the non-finite
-- guard, optimizer, LR schedule, EMA) with a progress display; runner.early_stopping and
-- runner.find_batch_size. Natives in bindings/train_binding.cpp; checkpoints are the run's (run.lua).
local native = runner._train
runner._train = nil

local Trainer = {}

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

local optimizer_kinds = { adamw = "AdamW", adam = "Adam", sgd = "SGD" }

-- An optim object, or the sugar {"adamw", lr = ..., groups = {...}}: optim.AdamW(groups or model, {lr = ...}).
local function optimizer_of(spec, model)
  if type(spec) == "string" then spec = { spec } end
  if type(spec) == "userdata" then return spec end
  if type(spec) ~= "table" then error("runner.trainer: 'optimizer' must be an optim object or a table such as {\"adamw\", lr = 1e-4}", 3) end
  local kind = spec.kind or spec[1] or "adamw"
  local constructor = optimizer_kinds[string.lower(tostring(kind))]
  if constructor == nil then
    error(string.format("runner.trainer: unknown optimizer '%s' (expected adamw, adam or sgd)", tostring(kind)), 3)
  end
  if type(spec.lr) ~= "number" then error("runner.trainer: the optimizer needs a learning rate (optimizer = {\"" .. kind .. "\", lr = ...})", 3) end
  local defaults = {}
  for k, v in pairs(spec) do if k ~= 1 and k ~= "kind" and k ~= "groups" then defaults[k] = v end end
  return optim[constructor](spec.groups or model, defaults)
end

-- The schedule sugar {"cosine", warmup_steps = ...}, like the optimizer's: {kind = "cosine", warmup_steps = ...}.
local function schedule_of(schedule)
  if type(schedule) ~= "table" or type(schedule[1]) ~= "string" then return schedule end
  if schedule.kind ~= nil then error("runner.trainer: schedule names its kind twice (first entry and kind)", 3) end
  local named_form = { kind = schedule[1] }
  for k, v in pairs(schedule) do if k ~= 1 then named_form[k] = v end end
  return named_form
end

-- The steps to profile: the `profile` option ("A:B", "A", {A, B}) or else `runner --profile A:B` (the launch
-- context's); nil when neither asks.
local function profile_range(options)
  local profile = options.profile
  if profile == nil then profile = native.launch_profile() end
  if profile == nil or profile == "" or profile == false then return nil end
  local text = profile
  if type(profile) == "table" then text = tostring(profile[1]) .. ":" .. tostring(profile[2] or profile[1]) end
  local ok, first, last = pcall(native.step_range, tostring(text))
  if not ok then error("runner.trainer: " .. tostring(first):gsub("^[^:]*:%d+: ", ""), 3) end
  if type(options.steps) == "number" and last > options.steps then
    error(string.format("runner.trainer: profile %d:%d ends after the last step (%d)", first, last, options.steps), 3)
  end
  return { first = first, last = last }
end

--- runner.trainer(TrainerOptions) -> Trainer (the keys and defaults: ---@class TrainerOptions in
--- stdlib/meta/train.lua; the options are declared and checked in bindings/train_binding.cpp)
function runner.trainer(options)
  if type(options) ~= "table" then error("runner.trainer expects an options table", 2) end
  if runner._load_only then return runner._load_only.trainer(options) end
  local model = options.model
  if model ~= nil and not nn.is_module(model) then error("runner.trainer: 'model' must be a module", 2) end
  local optimizer = options.optimizer
  if model ~= nil and optimizer ~= nil then optimizer = optimizer_of(optimizer, model) end
  local parameters = model and named(model:named_parameters()) or {}
  local buffers = model and named(model:named_buffers()) or {}
  local native_options = options
  local schedule = schedule_of(options.schedule)
  if schedule ~= options.schedule then
    native_options = {}
    for k, v in pairs(options) do native_options[k] = v end
    native_options.schedule = schedule
  end
  local trainer_native = native.new(native_options, parameters, buffers, optimizer, model)
  -- FP8 is a precision of the model's Linear layers: the built-in blocks' attention and MLP layers multiply in FP8
  -- from here on (the parameters, their names and the state dict stay the same).
  if trainer_native:precision() == "fp8" and model:_set_matmul_precision("fp8") == 0 then
    error("runner.trainer: amp 'fp8' found no layer to run in FP8 in the model (the Linear layers of nn.DiT's blocks "
      .. "are; their sizes must be multiples of 16)", 2)
  end
  local objective = options.objective
  if objective ~= nil and type(objective) ~= "function" and not pcall(trainer_native.set_objective, trainer_native, objective) then
    error("runner.trainer: 'objective' must be an objective (e.g. ddpm:objective(model)) or a loss function, got a "
      .. type(objective), 2)
  end
  local device = parameters[1][2].device
  local ema_models = options.ema_model
  if nn.is_module(ema_models) then ema_models = { ema_models } end
  local trainer = setmetatable({
    native = trainer_native, model = model, optimizer = optimizer, device = device, accumulate = trainer_native:accumulate(),
    ema_models = ema_models or {}, ema_synced = {}, total_steps = options.steps, has_objective = objective ~= nil,
    loss_fn = type(objective) == "function" and objective or nil,
  }, Trainer)
  local profile = profile_range(options)
  if profile then trainer_native:profile(profile.first, profile.last) end
  if options.progress ~= false and type(options.steps) == "number" and runner.dist.is_main then
    trainer_native:show_progress { total = options.steps, batch = options.batch }
  end
  return trainer
end

function Trainer.__index(self, key)
  if key == "ema" then return self:ema_model(1) end
  if key == "step_count" then return rawget(self, "native"):step_count() end
  return Trainer[key]
end

function Trainer:__tostring()
  return string.format("Trainer(step %d, %s, %s)", self.step_count, self.native:precision(), self.native:describe_schedule())
end

-- The micro-batches of a batch (a loader batch or an image tensor): runtime/train/objective.h's split_batch, every
-- tensor whose first dimension is the batch size in `count` equal parts, other fields shared.
local function split_batch(batch, count)
  if count == 1 then return { batch } end
  if not torch.is_tensor(batch) then return native.split_batch(batch, count) end
  local micro = native.split_batch({ data = batch }, count)
  for i, m in ipairs(micro) do micro[i] = m.data end
  return micro
end

local function batch_inputs(batch)
  if batch == nil then return nil end
  if torch.is_tensor(batch) then return { data = batch } end
  local inputs = {}
  for k, v in pairs(batch) do if torch.is_tensor(v) then inputs[k] = v end end
  return inputs
end

--- train:step(batch) -> {loss, grad_norm, lr, loss_scale, skipped, step, timing}: one step of the trainer's
--- objective (runner.trainer { objective = ... }) over a loader batch, split into `accumulate` micro-batches.
--- train:step([batch,] loss_fn): the same with a loss function: loss_fn(micro_batch) for each micro-batch of
--- `batch`; without a batch, loss_fn(i, n) for i = 1..n. Values are device tensors: reading one waits for the device.
function Trainer:step(batch, loss_fn)
  if loss_fn == nil and type(batch) == "function" then batch, loss_fn = nil, batch end
  if loss_fn == nil and batch ~= nil then
    if not self.has_objective then
      error("train:step(batch) needs runner.trainer { objective = ... } (e.g. ddpm:objective(model)); or pass a loss "
        .. "function: train:step(batch, function(micro) ... end)", 2)
    end
    loss_fn = self.loss_fn
  end
  if loss_fn == nil and batch == nil then error("train:step expects (batch), (batch, loss_function) or (loss_function)", 2) end
  if loss_fn ~= nil and type(loss_fn) ~= "function" then error("train:step expects ([batch,] loss_function)", 2) end
  local call = loss_fn
  if batch ~= nil and loss_fn ~= nil then
    local micro = split_batch(batch, self.accumulate)
    call = function(i) return loss_fn(micro[i]) end
  end
  -- The trainer's observers (runtime/run/trainer_observers.cpp, installed by bindings/train_binding.cpp) do the rest
  -- in C++: timing metrics, the profiler, the progress line, and the attached run's step, saves and stop requests.
  if call == nil then
    return self.native:step_batch(torch.is_tensor(batch) and { data = batch } or batch, batch, self)
  end
  return self.native:step(call, batch_inputs(batch), batch or false, self)
end

--- train:ema_model([i = 1]) -> the i-th EMA model (ema_model option) holding the current average.
function Trainer:ema_model(i)
  i = i or 1
  local model = self.ema_models[i]
  if model == nil then
    error(string.format("train.ema: pass ema_model = <another instance of the model> to runner.trainer to get EMA model %d", i), 2)
  end
  local version = self.native:state_version()
  if self.ema_synced[i] ~= version then
    self.native:copy_ema(i, tensors_of(model, "parameters"), tensors_of(model, "buffers"))
    self.ema_synced[i] = version
  end
  return model
end

--- train:lr([group = 1]) -> the learning rate of the next step
function Trainer:lr(group) return self.native:lr(group) end

--- train:set_lr(lr [, group]): the learning rate the schedule scales (warmup, decay) from the next step on, of one
--- parameter group or of every group. A checkpoint does not keep it: a resumed run starts from the script's.
function Trainer:set_lr(lr, group) self.native:set_lr(lr, group) end

--- train:observe(metric): feeds a validation metric to a plateau schedule.
function Trainer:observe(metric) self.native:observe(metric) end

--- train:precision() -> "fp32", "bf16", "fp16" or "fp8"
function Trainer:precision() return self.native:precision() end

--- train:state_bytes() -> {weights, gradients, optimizer, ema, total}: bytes of model state this rank holds
function Trainer:state_bytes() return self.native:state_bytes() end

--- train:model_state() -> {name = tensor}: the trained model's state dict, whole (gathered under shard = "weights")
function Trainer:model_state() return self.native:model_state() end

--- train:graphs() -> {captured, replayed, eager_reason}: what CUDA graph capture (runner.trainer { graph = ... }) has
--- done so far, and why steps run eagerly when they do.
function Trainer:graphs() return self.native:graphs() end

--- train:finish_progress(): prints the final progress line (runs by itself at the last step).
function Trainer:finish_progress()
  self.native:finish_progress()
end

-- Early stopping ---------------------------------------------------------------------------------------

local EarlyStopping = {}
EarlyStopping.__index = EarlyStopping

--- runner.early_stopping(EarlyStoppingOptions) -> stopper; stopper:observe(value) is true once `patience`
--- observations in a row failed to beat the best by min_delta.
--- runner.precision(amp [, device = "auto"]) -> "fp32", "bf16", "fp16" or "fp8": what runner.trainer's amp means on
--- the device, or the error it would raise there (a script checks its amp before runner.start).
function runner.precision(amp, device) return native.precision(amp, device or "auto") end

function runner.early_stopping(options)
  local o = native.early_stopping_options(options)
  return setmetatable({ patience = o.patience, mode = o.mode, min_delta = o.min_delta, best = nil, bad = 0,
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

--- runner.find_batch_size(FindBatchSizeOptions) -> the largest batch size for which try (a forward and backward
--- pass) runs without running out of device memory.
function runner.find_batch_size(options)
  local start, max = native.find_batch_size_options(options)
  if type(options.try) ~= "function" then error("runner.find_batch_size: 'try' must be a function of the batch size", 2) end
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
  local size = start
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
