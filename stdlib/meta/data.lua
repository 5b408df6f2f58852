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
---@param options ImageFolderOptions
---@return Dataset
function data.image_folder(options) end

---@class ImageFolderOptions
---@field path string
---@field labels? boolean  the first-level subfolder is the class (default false)

--- CIFAR-10, binary version (`cifar-10-batches-bin`: data_batch_1..5.bin, test_batch.bin); memory-mapped.
---@param options Cifar10Options
---@return Dataset
function data.cifar10(options) end

---@class Cifar10Options
---@field path string
---@field split? "train"|"test"  default "train"

--- MNIST IDX files (train-images-idx3-ubyte, ...; also torchvision's MNIST/raw layout); 1 x 28 x 28 images.
---@param options MnistOptions
---@return Dataset
function data.mnist(options) end

---@class MnistOptions
---@field path string
---@field split? "train"|"test"  default "train"

--- A memory-mapped .npy array [N, ...] of any common dtype (never loaded whole), for example VAE latents
--- [N, 4, 32, 32] or the uint8 images `runner data pack` writes. `labels` is an integer .npy of shape [N];
--- `classes` a list of names or the path of a JSON list (the .classes.json `runner data pack` writes).
---@param options NpyOptions
---@return Dataset
function data.npy(options) end

---@class NpyOptions
---@field path string
---@field labels? string             an integer .npy of shape [N]
---@field classes? string[]|string   class names, or the path of a JSON list of them

--- VAE latents that `runner data encode` wrote (see README, "Latent diffusion"): each read draws a new
--- latent from the stored posterior, scale * (mean + exp(logvar / 2) * noise - shift), with the noise (and
--- the choice between an image and its flip, when encoded with --flip) from the loader's keyed random
--- stream of that sample, so a resumed run draws what the uninterrupted one would. `scale` defaults to the
--- VAE's scaling factor from the manifest (0.18215 for Stable Diffusion's VAE). Labels and class names come
--- from the files beside the array. Samples are float32 [C, h, w].
---@param options LatentsOptions
---@return Dataset
function data.latents(options) end

---@class LatentsOptions
---@field path string
---@field scale? number  default: the VAE's scaling factor from the manifest

--- Procedural images for tests and the quickstart: a circle, square or triangle (labels 0, 1, 2) in a
--- random colour on a plain background of another colour, at a random place, size and rotation,
--- antialiased; deterministic in (seed, index). `colours = false` draws white shapes on black and
--- `rotate = false` upright ones (squares axis-aligned, triangles pointing up): far easier to learn, the
--- quickstart's data. An index keeps its class, place and size whatever these two options say.
---@param options? ShapesOptions
---@return Dataset
function data.shapes(options) end

---@class ShapesOptions
---@field size? integer     images are size x size (default 32)
---@field count? integer    default 10000
---@field seed? integer     default 0
---@field colours? boolean  default true
---@field rotate? boolean   default true

--- A dataset defined in Lua: get(i) (1-based) returns a tensor of fixed shape and dtype, and optionally an
--- integer label. The slow path: samples are read on the script's thread, one at a time, so a loader over
--- it has no worker threads.
---@param options LuaDatasetOptions
---@return Dataset
function data.dataset(options) end

---@class LuaDatasetOptions
---@field length integer
---@field get fun(i: integer): Tensor, integer?

--- Per-sample transforms, applied in this order. Images: resize the shorter side (antialiased bilinear, as
--- torchvision's Resize), crop, flip, then 8-bit values v become float32 v / 127.5 - 1 (`normalize`, default
--- true). Tensor samples (.npy, Lua datasets): crop and flip act on the last two dimensions; normalize
--- applies to uint8 data only. Random choices are a function of (seed, epoch, sample index) only.
--- `fast_decode` (default true) lets JPEG decoding downscale by 1/2, 1/4 or 1/8 in the DCT domain to a size
--- still at least `resize` (as PIL's draft mode); false decodes at full size, pixel-identical to PIL. Either
--- way a JPEG is decoded only down to the last row the crop needs, and only the columns around it.
---@class TransformOptions
---@field resize? integer                  the shorter side after resizing (0 or absent: no resize)
---@field crop? integer|integer[]          center crop n or {height, width}
---@field random_crop? integer|integer[]   random crop n or {height, width} (not with crop)
---@field flip? boolean                    horizontal flip with probability 1/2 (default false)
---@field normalize? boolean               8-bit v -> v / 127.5 - 1 (default true)
---@field fast_decode? boolean             JPEG DCT-domain downscaling when resizing anyway (default true)

---@class Batch
---@field data Tensor [B, ...] on the loader's device (float32 in [-1, 1] for normalized 8-bit data)
---@field label Tensor|nil int64 [B] class ids, when the dataset has labels
---@field index Tensor int64 [B] 0-based dataset indices (on the CPU)
---@field step integer 1-based number of this batch in the loader's stream (across epochs)
---@field epoch integer 1-based epoch of this batch
---@field wait_s number seconds loader:next() took to hand this batch over (waiting for the workers; loading it
---                     itself without workers): the trainer logs it as time/batch_wait_ms

---@class LoaderStats
---@field wait_s number seconds next() spent waiting for batches
---@field elapsed_s number seconds since the first next()
---@field batches integer
---@field samples integer
---@field skipped integer bad samples left out (on_error = "skip")
---@field queue_depth integer batches ready when the last next() was called, the one it took included (prefetch
---                           when the workers keep ahead)
---@field workers integer
---@field batches_per_s number
---@field images_per_s number

---@class LoaderState
---@field seed integer the loader's seed
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
---@param range? IterRange
---@return fun(): Batch
function Loader:iter(range) end
---@class IterRange
---@field from? integer  batches to skip first (default 0)
---@field to? integer    the batch to stop after (default: no end)

---@return integer
function Loader:len() end
--- Batches consumed so far.
---@return integer
function Loader:position() end
--- Continue after the first `position` batches (drops batches in flight).
function Loader:seek(position) end
--- Stop prefetching at batch `step` (nil: no limit); iter{to = ...} sets it, and a next() at or past it lifts it
--- (after the loop, loader:next() gives the following batch).
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
--- The bad samples skipped so far, one entry per file in the order they were met (stats().skipped counts
--- every skip, a file again in each epoch); the loader also logs each file once as a warning.
---@return {path: string, message: string}[]
function Loader:skip_reports() end
---@return Dataset
function Loader:dataset() end

---@class LoaderOptions
---@field batch integer                    samples per step across all ranks, the global batch (required); each of W
---                                        ranks gets batch / W
---@field shuffle? boolean                 default true
---@field drop_last? boolean               default false
---@field workers? integer                 decoding threads (default min(4 per GPU, cores - 1)); 0: on the caller's
---                                        thread
---@field prefetch? integer                batches in flight (default 2 per worker)
---@field seed? integer                    the order's and the random transforms' seed (default 0)
---@field rank? integer                    this process's shard (default: the launch's RANK, else 0)
---@field world_size? integer              number of shards (default: the launch's WORLD_SIZE, else 1)
---@field device? string                   where batches are delivered (default "cpu")
---@field pin_memory? boolean              pinned host buffers for CUDA devices (default true)
---@field transform? TransformOptions
---@field on_error? "raise"|"skip"         bad samples: stop naming the file (default) or leave them out

--- A loader: a seeded permutation per epoch (shuffle, default true), sharded by rank (each global batch of
--- `batch` samples is split evenly over the world_size ranks, so every sample is seen once per epoch across
--- ranks), batches assembled by `workers` threads (default: min(4 per GPU, cores - 1); for one of R ranks on a node, min(4, cores / R - 1)) up to `prefetch`
--- batches ahead (default 2 per worker), in pinned memory and copied to a CUDA device on a side stream
--- before they are asked for. on_error = "skip" leaves bad samples out of their batch and reports each file
--- once; "raise" (default) stops with an error naming the file.
--- rank and world_size default to the process's place in a distributed job (RANK / WORLD_SIZE, as torchrun
--- and Slurm set them; 0 and 1 for a single process). The same script sees the same global batch stream at
--- any world size, and a loader state restores at another world size (the position counts global batches).
---@param dataset Dataset
---@param options LoaderOptions
---@return Loader
function data.loader(dataset, options) end

runner.data = data
return data
