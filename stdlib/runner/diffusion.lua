-- runner.diffusion: noise schedules, the training loss and DDPM/DDIM sampling with classifier-free guidance, and flow
-- matching beside it (natives in bindings/diffusion_binding.cpp and flow_binding.cpp; the math is defined in
-- docs/models-and-diffusion.md).
local native = runner._diffusion
runner._diffusion = nil
local methods = native.methods
local flow_methods = native.flow_methods

local diffusion = {}

local function model_info(model)
  if nn.is_module(model) and model.info then
    local ok, info = pcall(model.info, model)
    if ok then return info end
  end
  return nil
end

--- runner.diffusion.gaussian(DiffusionOptions) -> Diffusion (the keys and defaults: ---@class DiffusionOptions in
--- stdlib/meta/diffusion.lua). `seed` (default: the seed given to torch.manual_seed) keys the training streams of
--- timesteps, noise and label dropout.
function diffusion.gaussian(options)
  return native.new(options, torch.initial_seed())
end
diffusion.ddpm = diffusion.gaussian

--- runner.diffusion.flow(FlowOptions) -> Flow: SiT's flow matching (---@class FlowOptions in
--- stdlib/meta/diffusion.lua). Its loss, objective, state and sample work as the Gaussian diffusion's.
function diffusion.flow(options)
  return native.new_flow(options, torch.initial_seed())
end

--- d:loss(model, batch [, DiffusionLossOptions]) -> loss, details
--- batch: a loader batch ({data, label, index, epoch}) or an image tensor [B, C, H, W]. Labels come from
--- batch.label when the model is class-conditional (or options.labels); with label dropout (default: the
--- model's class_dropout) a label becomes the null label. details = {t, mse, vb}.
function methods:loss(model, batch, options)
  local x0, labels, epoch, index
  if torch.is_tensor(batch) then
    x0 = batch
  elseif type(batch) == "table" and torch.is_tensor(batch.data) then
    x0, epoch, index = batch.data, batch.epoch, batch.index
    labels = batch.label
  else
    error("loss: batch must be a tensor or a loader batch {data = ..., label = ..., index = ..., epoch = ...}", 2)
  end
  local loss, t, mse, vb = self:_loss(model, x0, labels, epoch, index, options, model_info(model))
  return loss, { t = t, mse = mse, vb = vb }
end

--- d:objective(model [, ObjectiveOptions]) -> Objective: d:loss(model, batch) as the trainer's objective, for
--- runner.trainer { objective = ... } and train:step(batch). The model is a built-in UNet or DiT; the step runs
--- in C++ without calling Lua. label_dropout defaults to the model's class_dropout.
function methods:objective(model, options)
  local objective = self:_objective(model, options)
  if runner._load_only then runner._load_only.diffusion_of[objective] = self end  -- runner.load_run's objective
  return objective
end

--- d:state() -> {stream_counter, stream_generator}: what a checkpoint keeps of the diffusion
--- (run:restore{state = {ddpm = d}}): the running key counter and the version of the generator of the draws.
function methods:state()
  return { stream_counter = self:stream_counter(), stream_generator = native.stream_generator }
end
--- d:load_state(state): continues the training streams where state() left them; warns when the state's draws
--- came from another generator version (a state without one is version 1).
function methods:load_state(state)
  local made_by = state.stream_generator or 1
  if made_by ~= native.stream_generator then
    runner.log.warn("diffusion: the checkpoint's training draws (timesteps, noise, label dropout) came from "
      .. "generator version %d and this runner draws with version %d, so the resumed run does not draw what the "
      .. "original run would have", made_by, native.stream_generator)
  end
  self:stream_counter(state.stream_counter)
end

local function labels_tensor(labels, n, device)
  if labels == nil then return nil end
  if torch.is_tensor(labels) then return labels:to(device) end
  if type(labels) == "number" then return torch.full({ n }, labels, { dtype = "int64", device = device }) end
  if type(labels) == "table" then return torch.tensor(labels, { dtype = "int64", device = device }) end
  error("sample: labels must be a tensor, a list of class ids or one class id", 3)
end

--- d:sample(model, SampleOptions) -> samples [n, C, H, W] float32 (and the trajectory [steps + 1, ...] with
--- trajectory = true; the keys and defaults: ---@class SampleOptions in stdlib/meta/diffusion.lua). The model runs in eval mode and without gradients.
function methods:sample(model, options)
  options = options or {}
  if type(options) ~= "table" then error("sample: expected an options table, got " .. type(options), 2) end
  local info = model_info(model)
  local seed = options.seed or self:_info().seed
  local x_T = options.x_T
  if x_T == nil then
    local shape = options.shape
    if shape ~= nil then
      if type(shape) ~= "table" or #shape ~= 3 then
        error("sample: shape must be {C, H, W}, the shape of one sample", 2)
      end
      for i = 1, 3 do
        if type(shape[i]) ~= "number" or shape[i] < 1 or shape[i] % 1 ~= 0 then
          error("sample: shape must be {C, H, W} of whole numbers >= 1, got " .. tostring(shape[i]) .. " at " .. i, 2)
        end
      end
    elseif info == nil then
      error("sample: a model that is not a built-in UNet or DiT needs shape = {C, H, W} (one sample's shape; the "
        .. "start noise is drawn from the seed) or x_T (the start noise)", 2)
    end
    local n = options.n
    if n ~= nil and (type(n) ~= "number" or n < 1 or n % 1 ~= 0) then
      error("sample: n must be a whole number of samples >= 1, got " .. tostring(n), 2)
    end
    if n == nil then
      local labels = options.labels
      n = torch.is_tensor(labels) and labels.shape[1] or (type(labels) == "table" and #labels) or 16
    end
    local device = options.device
    if device == nil then
      -- A Lua callable that is not a module samples on the CPU unless told otherwise.
      local parameters = nn.is_module(model) and model:parameters() or {}
      device = #parameters > 0 and parameters[1].device or "cpu"
    end
    x_T = native.initial_noise(shape and { n, shape[1], shape[2], shape[3] }
      or { n, info.in_channels, info.image, info.image }, seed, device)
  end
  local n = x_T.shape[1]
  if options.x_T ~= nil and options.n ~= nil and options.n ~= n then
    error(string.format("sample: n = %s but x_T holds %d samples (give n or x_T, or both alike)", tostring(options.n),
      n), 2)
  end
  local guidance = type(options.guidance) == "number" and options.guidance or nil
  local problem = info and native.labels_problem(info, options.labels ~= nil, guidance, "sample")
  if problem then error(problem, 2) end
  local labels = labels_tensor(options.labels, n, x_T.device)
  local was_training = nn.is_module(model) and model:is_training()
  if was_training then model:eval() end
  local ok, x, trajectory = pcall(self._sample, self, model, x_T, labels, options, seed, info and info.null_label)
  if was_training then model:train() end
  if not ok then error(x, 0) end
  return x, trajectory
end

function methods:info()
  return self:_info()
end

--- flow:likelihood(model, x, FlowLikelihoodOptions) -> logp [B], z: SiT's ODE log-likelihood of data x (---@class
--- FlowLikelihoodOptions in stdlib/meta/diffusion.lua). The model runs in eval mode.
function flow_methods:likelihood(model, x, options)
  options = options or {}
  if type(options) ~= "table" then error("likelihood: expected an options table, got " .. type(options), 2) end
  if not torch.is_tensor(x) then error("likelihood: x must be a tensor [B, C, ...] of data", 2) end
  local info = model_info(model)
  local problem = info and native.labels_problem(info, options.labels ~= nil, nil, "likelihood")
  if problem then error(problem, 2) end
  local labels = labels_tensor(options.labels, x.shape[1], x.device)
  local was_training = nn.is_module(model) and model:is_training()
  if was_training then model:eval() end
  local ok, logp, z = pcall(self._likelihood, self, model, x, labels, options, options.seed or self:_info().seed)
  if was_training then model:train() end
  if not ok then error(logp, 0) end
  return logp, z
end

-- The flow shares the Lua side of loss, objective, state and sample: its natives take the same arguments.
for _, name in ipairs({ "loss", "objective", "state", "load_state", "sample", "info" }) do
  flow_methods[name] = methods[name]
end

diffusion.sampling_timesteps = native.sampling_timesteps

return diffusion
