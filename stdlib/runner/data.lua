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

function data.loader(dataset, options)
  if type(options) ~= "table" then error("data.loader: expected (dataset, options)", 2) end
  return native.loader(dataset, options)
end

runner.data = data
return data
