---@meta
-- `runner.data` (also `require("runner.data")`): datasets, per-sample transforms and the loader.
--
-- Sample indices given as Lua numbers (dataset:get(i), batch steps) are 1-based; the contents of
-- `batch.index` and `batch.label` tensors are 0-based dataset indices and class ids, as in PyTorch.

---@class runner.data
local data = {}

---@class Dataset
--- `#dataset` is the number of samples; tostring(dataset) describes it.
local Dataset = {}
--- The raw sample i (1-based): a uint8 tensor [C, H, W] for image datasets (RGB; grayscale MNIST has C = 1),
--- the stored row for .npy datasets, what get(i) returns for Lua datasets; and its label or nil.
---@param i integer
---@return Tensor sample
---@return integer|nil label
function Dataset:get(i) end
--- Class names by label id (label 0 is classes()[1]); empty when the dataset has none.
---@return string[]
function Dataset:classes() end
---@return integer
function Dataset:len() end

--- JPEG and PNG files under `path`, recursively, in sorted path order (hidden files and folders skipped).
--- With `labels = true` the class of an image is its first-level subfolder (classes sorted by name), as
--- torchvision's ImageFolder. Decoding matches PIL's Image.convert("RGB").
---@param options {path: string, labels?: boolean}
---@return Dataset
function data.image_folder(options) end

--- CIFAR-10, binary version (`cifar-10-batches-bin`: data_batch_1..5.bin, test_batch.bin); memory-mapped.
---@param options {path: string, split?: "train"|"test"}
---@return Dataset
function data.cifar10(options) end

--- MNIST IDX files (train-images-idx3-ubyte, ...; also torchvision's MNIST/raw layout); 1 x 28 x 28 images.
---@param options {path: string, split?: "train"|"test"}
---@return Dataset
function data.mnist(options) end

--- A memory-mapped .npy array [N, ...] of any common dtype (never loaded whole), for example VAE latents
--- [N, 4, 32, 32] or the uint8 images `runner data pack` writes. `labels` is an integer .npy of shape [N];
--- `classes` a list of names or the path of a JSON list (the .classes.json `runner data pack` writes).
---@param options {path: string, labels?: string, classes?: string[]|string}
---@return Dataset
function data.npy(options) end

--- Procedural images for tests and the quickstart: a circle, square or triangle (labels 0, 1, 2) in a
--- random colour on a plain background, antialiased; deterministic in (seed, index). Defaults: size 32,
--- count 10000, seed 0.
---@param options? {size?: integer, count?: integer, seed?: integer}
---@return Dataset
function data.shapes(options) end

--- A dataset defined in Lua: get(i) (1-based) returns a tensor of fixed shape and dtype, and optionally an
--- integer label. The slow path: samples are read on the script's thread, one at a time, so a loader over
--- it has no worker threads.
---@param options {length: integer, get: fun(i: integer): Tensor, integer?}
---@return Dataset
function data.dataset(options) end

--- Per-sample transforms, applied in this order. Images: resize the shorter side (antialiased bilinear, as
--- torchvision's Resize), crop, flip, then 8-bit values v become float32 v / 127.5 - 1 (`normalize`, default
--- true). Tensor samples (.npy, Lua datasets): crop and flip act on the last two dimensions; normalize
--- applies to uint8 data only. Random choices are a function of (seed, epoch, sample index) only.
--- `fast_decode` (default true) lets JPEG decoding downscale by 1/2, 1/4 or 1/8 in the DCT domain to a size
--- still at least `resize` (as PIL's draft mode); false decodes at full size, pixel-identical to PIL. Either
--- way a JPEG is decoded only down to the last row the crop needs, and only the columns around it.
---@alias Transform {resize?: integer, crop?: integer|integer[], random_crop?: integer|integer[], flip?: boolean, normalize?: boolean, fast_decode?: boolean}

---@class Batch
---@field data Tensor [B, ...] on the loader's device (float32 in [-1, 1] for normalized 8-bit data)
---@field label Tensor|nil int64 [B] class ids, when the dataset has labels
---@field index Tensor int64 [B] 0-based dataset indices (on the CPU)
---@field step integer 1-based number of this batch in the loader's stream (across epochs)
---@field epoch integer 1-based epoch of this batch

---@class LoaderStats
---@field wait_s number seconds next() spent waiting for batches
---@field elapsed_s number seconds since the first next()
---@field batches integer
---@field samples integer
---@field skipped integer bad samples left out (on_error = "skip")
---@field queue_depth integer batches ready when the last next() was called
---@field workers integer
---@field batches_per_s number
---@field images_per_s number

---@class LoaderState
---@field seed string the seed as a decimal string (all 64 bits)
---@field position integer batches consumed
---@field dataset_size integer
---@field batch integer
---@field rank integer
---@field world_size integer
---@field shuffle boolean
---@field drop_last boolean

---@class Loader
--- `#loader` is the number of batches per epoch for this rank.
local Loader = {}
--- The next batch; waits for it if the workers are behind (Ctrl-C interrupts the wait).
---@return Batch
function Loader:next() end
--- With no argument, the batches of the rest of the current epoch. With {from = a, to = b}: the batches
--- after the first a (a count, e.g. the optimizer steps already done) up to batch b, across epochs.
---@param range? {from?: integer, to?: integer}
---@return fun(): Batch
function Loader:iter(range) end
---@return integer
function Loader:len() end
--- Batches consumed so far.
---@return integer
function Loader:position() end
--- Continue after the first `position` batches (drops batches in flight).
function Loader:seek(position) end
--- Stop prefetching at batch `step` (nil: no limit); iter{to = ...} sets it.
function Loader:set_end(step) end
--- The 0-based dataset indices of batch `step` (1-based) for this rank, before any skipping.
---@return Tensor
function Loader:indices(step) end
--- The state to save with a checkpoint; restore() makes the following batches equal to those of an
--- uninterrupted run. restore() refuses a state saved with another dataset size, batch, rank, world size,
--- shuffle or drop_last.
---@return LoaderState
function Loader:state() end
---@param state LoaderState
function Loader:restore(state) end
---@return LoaderStats
function Loader:stats() end
--- Bad samples skipped since the last call, one entry per file over the loader's life (the loader also logs
--- each as a warning).
---@return {path: string, message: string}[]
function Loader:skip_reports() end
---@return Dataset
function Loader:dataset() end

--- A loader: a seeded permutation per epoch (shuffle, default true), sharded by rank (each global batch of
--- batch x world_size samples is split over the ranks, so every sample is seen once per epoch across
--- ranks), batches assembled by `workers` threads (default: min(4 per GPU, cores - 1)) up to `prefetch`
--- batches ahead (default 2 per worker), in pinned memory and copied to a CUDA device on a side stream
--- before they are asked for. on_error = "skip" leaves bad samples out of their batch and reports each file
--- once; "raise" (default) stops with an error naming the file.
---@param dataset Dataset
---@param options {batch: integer, shuffle?: boolean, drop_last?: boolean, workers?: integer, prefetch?: integer, seed?: integer, rank?: integer, world_size?: integer, device?: string, pin_memory?: boolean, transform?: Transform, on_error?: "raise"|"skip"}
---@return Loader
function data.loader(dataset, options) end

runner.data = data
return data
