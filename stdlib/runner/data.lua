-- runner.data: datasets, transforms and the prefetching loader (natives in bindings/data_binding.cpp).
local native = runner._data
runner._data = nil

local data = {}

-- The dataset constructors: their options are declared and checked in bindings/data_binding.cpp.
data.image_folder = native.image_folder
data.cifar10 = native.cifar10
data.mnist = native.mnist
data.npy = native.npy
data.latents = native.latents
data.shapes = native.shapes
data.dataset = native.lua_dataset

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
    local from
    from, stop = native.iter_range(range)
    if from ~= nil then self:seek(from) end
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
