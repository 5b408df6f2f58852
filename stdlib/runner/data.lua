-- runner.data: datasets, transforms and the prefetching loader (natives in bindings/data_binding.cpp).
local native = runner._data
runner._data = nil

local data = {}

local check_options = require("runner.options").check

local function options_of(options, name, known)
  local checked = check_options(options, "data." .. name, known, 3)  -- not a tail call: level 3 is the script
  return checked
end

local function required_path(options, name)
  if type(options.path) ~= "string" or options.path == "" then
    error(string.format("data.%s: option 'path' (a string) is required", name), 3)
  end
  return options.path
end

function data.image_folder(options)
  options = options_of(options, "image_folder", { path = true, labels = true })
  return native.image_folder(required_path(options, "image_folder"), options.labels == true)
end

function data.cifar10(options)
  options = options_of(options, "cifar10", { path = true, split = true })
  return native.cifar10(required_path(options, "cifar10"), options.split or "train")
end

function data.mnist(options)
  options = options_of(options, "mnist", { path = true, split = true })
  return native.mnist(required_path(options, "mnist"), options.split or "train")
end

function data.npy(options)
  options = options_of(options, "npy", { path = true, labels = true, classes = true })
  return native.npy(required_path(options, "npy"), options.labels, options.classes)
end

function data.latents(options)
  options = options_of(options, "latents", { path = true, scale = true })
  if options.scale ~= nil and (type(options.scale) ~= "number" or options.scale <= 0) then
    error("latents: scale must be a positive number", 2)
  end
  return native.latents(required_path(options, "latents"), options.scale)
end

function data.shapes(options)
  options = options_of(options, "shapes", { size = true, count = true, seed = true, colours = true, rotate = true })
  return native.shapes(options.size or 32, options.count or 10000, options.seed or 0, options)
end

function data.dataset(options)
  options = options_of(options, "dataset", { length = true, get = true })
  if type(options.length) ~= "number" then error("data.dataset: option 'length' (a number) is required", 2) end
  if type(options.get) ~= "function" then error("data.dataset: option 'get' (a function) is required", 2) end
  return native.lua_dataset(options.length, options.get)
end

local Loader = debug.getregistry()["runner.Loader"].__index

-- Reports each bad file the skip policy left out, once.
local function report_skips(loader)
  for _, report in ipairs(loader:_take_new_skip_reports()) do
    runner.log.warn("data: skipped a bad sample: %s", report.message)
  end
end

local next_batch = Loader.next
function Loader:next()
  local batch = next_batch(self)
  report_skips(self)
  return batch
end

-- loader:iter() iterates over the rest of the current epoch; loader:iter{from = a, to = b} yields the
-- batches after the first `a` (a count of batches, e.g. the steps already done) up to batch `b`, across
-- epochs, so a resumed run sees exactly the batches an uninterrupted one would have.
function Loader:iter(range)
  local stop
  if range == nil then
    local per_epoch = self:len()
    local position = self:position()
    stop = (math.floor(position / per_epoch) + 1) * per_epoch
  else
    if type(range) ~= "table" then error("loader:iter: expected {from =, to =}", 2) end
    check_options(range, "loader:iter", { from = true, to = true })
    if range.from ~= nil then
      if type(range.from) ~= "number" or range.from < 0 then error("loader:iter: 'from' must be a count of batches, 0 or more", 2) end
      self:seek(range.from)
    end
    stop = range.to
    if stop ~= nil and type(stop) ~= "number" then error("loader:iter: 'to' must be a number", 2) end
  end
  self:set_end(stop)
  return function()
    if stop ~= nil and self:position() >= stop then
      return nil
    end
    return self:next()
  end
end

function data.loader(dataset, options)
  if type(options) ~= "table" then error("data.loader: expected (dataset, options)", 2) end
  return native.loader(dataset, options)
end

runner.data = data
return data
