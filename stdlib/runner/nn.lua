-- Module trees: Lua-defined modules (nn.Module classes) over built-in ones, parameters, train/eval,
-- device moves, parameter counts and state dicts in safetensors files. Extends the global `nn`.
local native_methods = nn._native_methods
local is_native = nn._is_native
nn._native_methods, nn._is_native = nil, nil

local parameter_marks = setmetatable({}, { __mode = "k" })

--- nn.Parameter(t): a leaf tensor that requires grad, registered as a parameter when assigned to a module field.
function nn.Parameter(tensor)
  if not torch.is_tensor(tensor) then error("nn.Parameter expects a Tensor", 2) end
  local parameter = tensor:detach():requires_grad_(true)
  parameter_marks[parameter] = true
  return parameter
end

local Module = {}  -- methods shared by every Lua-defined module
local module_classes = setmetatable({}, { __mode = "k" })

local function is_lua_module(value)
  local meta = getmetatable(value)
  return type(value) == "table" and meta ~= nil and module_classes[meta] ~= nil
end

function nn.is_module(value)
  return is_native(value) or is_lua_module(value)
end

-- Collects (name, tensor) pairs of `kind` ("parameters" or "buffers") in registration order: a module's
-- own first, then its children's, as PyTorch orders them.
local function collect(module, kind, prefix, names, tensors)
  if is_native(module) then
    local own_names, own_tensors = module:_named_tensors(kind)
    for i, name in ipairs(own_names) do
      names[#names + 1] = prefix .. name
      tensors[#tensors + 1] = own_tensors[i]
    end
    return
  end
  local registry = rawget(module, kind == "parameters" and "_parameters" or "_buffers")
  for _, name in ipairs(registry.order) do
    names[#names + 1] = prefix .. name
    tensors[#tensors + 1] = registry.values[name]
  end
  local children = rawget(module, "_modules")
  for _, name in ipairs(children.order) do
    collect(children.values[name], kind, prefix .. name .. ".", names, tensors)
  end
end

local function pairs_iterator(names, values)
  local i = 0
  return function()
    i = i + 1
    if names[i] ~= nil then return names[i], values[i] end
  end
end

-- Methods available on every module, built-in or Lua-defined.
local common = {}

--- m:named_parameters() -> iterator over (name, tensor)
function common:named_parameters()
  local names, tensors = {}, {}
  collect(self, "parameters", "", names, tensors)
  return pairs_iterator(names, tensors)
end

--- m:parameters() -> list of parameter tensors
function common:parameters()
  local names, tensors = {}, {}
  collect(self, "parameters", "", names, tensors)
  return tensors
end

--- m:named_buffers() -> iterator over (name, tensor)
function common:named_buffers()
  local names, tensors = {}, {}
  collect(self, "buffers", "", names, tensors)
  return pairs_iterator(names, tensors)
end

--- m:num_parameters() -> total number of parameter elements
function common:num_parameters()
  local total = 0
  for _, p in ipairs(self:parameters()) do total = total + p:numel() end
  return total
end

--- m:state_dict() -> { name = tensor } of parameters and buffers (detached)
function common:state_dict()
  local names, tensors = {}, {}
  collect(self, "parameters", "", names, tensors)
  collect(self, "buffers", "", names, tensors)
  local state = {}
  for i, name in ipairs(names) do state[name] = tensors[i]:detach() end
  return state
end

local native_load_state, load_options = nn._load_state, nn._load_options
nn._load_state, nn._load_options = nil, nil

-- Copies `state` into the module's tensors (runner::nn::load_state: every problem in one error, nothing
-- changed unless all fit).
local function load_state(self, state, options)
  local names, tensors = {}, {}
  collect(self, "parameters", "", names, tensors)
  collect(self, "buffers", "", names, tensors)
  if type(state) ~= "table" then error("load_state_dict: expected a table of name = Tensor, got " .. type(state), 3) end
  native_load_state(names, tensors, state, options)
end

--- m:load_state_dict(state [, LoadStateOptions]): copies values into the module's tensors in place.
function common:load_state_dict(state, options)
  load_state(self, state, options)
  return self
end

--- m:save(path [, metadata]): the state dict as a safetensors file (written atomically).
function common:save(path, metadata)
  torch.save(self:state_dict(), path, metadata)
end

-- The entries of a file that holds several tables (a training checkpoint: model, ema, opt, ...), sorted.
local function table_entries(value)
  local entries = {}
  for key, entry in pairs(value) do
    if torch.is_tensor(entry) then return nil end
    if type(entry) == "table" then entries[#entries + 1] = tostring(key) end
  end
  table.sort(entries)
  return #entries > 0 and entries or nil
end

--- m:load(path [, ModuleLoadOptions]) -> metadata of the file. A safetensors file, or a torch.save
--- .pt/.pth file of a state dict; `key` picks one entry of a file that holds several (e.g. "ema").
function common:load(path, options)
  local state_options, key = load_options(options)
  local state, metadata = torch.load(path)
  if key ~= nil then
    local chosen = state[key]
    if type(chosen) ~= "table" then
      error(string.format("load: %s has no entry '%s' (entries: %s)", path, key,
        table.concat(table_entries(state) or {}, ", ")), 2)
    end
    state = chosen
  else
    local entries = table_entries(state)
    if entries then
      error(string.format("load: %s holds several entries (%s): choose one with { key = \"%s\" }", path,
        table.concat(entries, ", "), entries[1]), 2)
    end
  end
  load_state(self, state, state_options)
  return metadata
end

--- m:train([mode = true]) / m:eval(): sets training mode recursively.
function common:train(mode)
  if mode == nil then mode = true end
  if is_native(self) then
    self:_set_training(mode)
  else
    rawset(self, "training", mode)
    for _, name in ipairs(rawget(self, "_modules").order) do
      rawget(self, "_modules").values[name]:train(mode)
    end
  end
  return self
end

function common:eval()
  return self:train(false)
end

function common:is_training()
  if is_native(self) then return self:_is_training() end
  return rawget(self, "training")
end

--- m:to(device_or_dtype, ...): moves parameters and buffers in place (parameters keep their identity,
--- so optimizers built before the move stay valid).
function common:to(...)
  if is_native(self) then return self:_to(...) end
  for _, kind in ipairs({ "_parameters", "_buffers" }) do
    local registry = rawget(self, kind)
    for _, name in ipairs(registry.order) do
      local t = registry.values[name]
      t:set_data(t:to(...))
    end
  end
  for _, name in ipairs(rawget(self, "_modules").order) do
    rawget(self, "_modules").values[name]:to(...)
  end
  return self
end

-- m:_set_matmul_precision("fp8" | "autocast") -> how many Linear layers of the tree that may run in FP8 were set
-- (runner.trainer's amp = "fp8": the built-in models' layers of runtime/nn/linear.h).
function common:_set_matmul_precision(precision)
  if is_native(self) then return self:_set_matmul_precision_native(precision) end
  local count = 0
  for _, name in ipairs(rawget(self, "_modules").order) do
    count = count + rawget(self, "_modules").values[name]:_set_matmul_precision(precision)
  end
  return count
end

--- m:children() -> iterator over (name, child module)
function common:children()
  if is_native(self) then return function() end end
  local children = rawget(self, "_modules")
  local values = {}
  for i, name in ipairs(children.order) do values[i] = children.values[name] end
  return pairs_iterator(children.order, values)
end

for name, method in pairs(common) do
  native_methods[name] = method
  Module[name] = method
end

--- nn.ema_update(ema_model, model, decay): the trainer's EMA rule (one foreach lerp): ema <- decay * ema +
--- (1 - decay) * model for parameters that require grad, copies of the others and of the buffers.
local native_ema_update = nn._ema_update
nn._ema_update = nil
function nn.ema_update(ema_model, model, decay)
  if type(decay) ~= "number" or decay < 0 or decay > 1 then error("nn.ema_update: decay must be in [0, 1]", 2) end
  local function buffers(module)
    local list = {}
    for _, b in module:named_buffers() do list[#list + 1] = b end
    return list
  end
  native_ema_update(ema_model:parameters(), model:parameters(), buffers(ema_model), buffers(model), decay)
end

-- Lua-defined modules --------------------------------------------------------------------------------

local function new_registry()
  return { order = {}, values = {} }
end

local function register(registry, name, value)
  if registry.values[name] == nil then registry.order[#registry.order + 1] = name end
  registry.values[name] = value
end

local function unregister(registry, name)
  if registry.values[name] == nil then return end
  registry.values[name] = nil
  for i, n in ipairs(registry.order) do
    if n == name then table.remove(registry.order, i) break end
  end
end

--- self:register_buffer(name, tensor): a tensor saved in the state dict and moved by :to(), not trained.
function Module:register_buffer(name, tensor)
  if not torch.is_tensor(tensor) then error("register_buffer expects a Tensor", 2) end
  register(rawget(self, "_buffers"), name, tensor)
end

local function type_name(module)
  if is_native(module) then return module:type_name() end
  return getmetatable(module).__name
end

local function describe(module, indent)
  if is_native(module) then return tostring(module) end
  local children = rawget(module, "_modules")
  local extra = module.extra_repr and module:extra_repr() or ""
  if #children.order == 0 then return type_name(module) .. "(" .. extra .. ")" end
  local lines = { type_name(module) .. "(" .. extra }
  for _, name in ipairs(children.order) do
    lines[#lines + 1] = indent .. "  (" .. name .. "): " .. describe(children.values[name], indent .. "  ")
  end
  lines[#lines + 1] = indent .. ")"
  return table.concat(lines, "\n")
end

--- nn.Module(name [, parent]) -> a new module class. Define `function Class:init(...)` to build
--- children and parameters, and `function Class:forward(...)`; call `Class(...)` to make an instance.
function nn.Module(name, parent)
  if type(name) ~= "string" then error("nn.Module expects a class name", 2) end
  local class = setmetatable({}, { __index = parent or Module })
  local instance_meta = { __name = name, __class = class }
  module_classes[instance_meta] = true

  instance_meta.__index = function(self, key)
    local registries = { "_modules", "_parameters", "_buffers" }
    for _, registry in ipairs(registries) do
      local value = rawget(self, registry).values[key]
      if value ~= nil then return value end
    end
    if type(key) == "number" then
      local sequence = rawget(self, "_sequence")
      return sequence and sequence[key]
    end
    return class[key]
  end

  instance_meta.__newindex = function(self, key, value)
    local modules, parameters = rawget(self, "_modules"), rawget(self, "_parameters")
    local buffers = rawget(self, "_buffers")
    if nn.is_module(value) then
      unregister(parameters, key)
      register(modules, key, value)
    elseif torch.is_tensor(value) and parameter_marks[value] then
      unregister(modules, key)
      register(parameters, key, value)
    elseif buffers.values[key] ~= nil and torch.is_tensor(value) then
      register(buffers, key, value)
    elseif modules.values[key] ~= nil or parameters.values[key] ~= nil then
      if value ~= nil then
        error(string.format("%s.%s holds a %s; assign a module or nn.Parameter, or nil to remove it", name,
          tostring(key), modules.values[key] and "module" or "parameter"), 2)
      end
      unregister(modules, key)
      unregister(parameters, key)
    else
      rawset(self, key, value)
    end
  end

  instance_meta.__call = function(self, ...)
    return self:forward(...)
  end

  instance_meta.__tostring = function(self)
    return describe(self, "")
  end

  setmetatable(class, {
    __index = parent or Module,
    __call = function(_, ...)
      local self = setmetatable({
        _modules = new_registry(), _parameters = new_registry(), _buffers = new_registry(), training = true,
      }, instance_meta)
      if class.init then class.init(self, ...) end
      return self
    end,
  })
  class.__name = name
  return class
end

function Module:forward()
  error(type_name(self) .. " has no forward method", 2)
end

-- Sequential ------------------------------------------------------------------------------------------

--- nn.Sequential(m1, m2, ...): applies its children in order. Children are named "0", "1", ... as in
--- PyTorch (so state dicts match); seq[1] is the first child.
nn.Sequential = nn.Module("Sequential")

function nn.Sequential:init(...)
  rawset(self, "_sequence", {})
  for i = 1, select("#", ...) do self:add((select(i, ...))) end
end

--- seq:add(module): appends a child.
function nn.Sequential:add(module)
  if not nn.is_module(module) then error("Sequential:add expects a module", 2) end
  local sequence = rawget(self, "_sequence")
  sequence[#sequence + 1] = module
  self[tostring(#sequence - 1)] = module
  return self
end

function nn.Sequential:len()
  return #rawget(self, "_sequence")
end

function nn.Sequential:forward(x)
  for _, module in ipairs(rawget(self, "_sequence")) do x = module(x) end
  return x
end

return nn
