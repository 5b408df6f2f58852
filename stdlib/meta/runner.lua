---@meta
-- The `runner` namespace (experiment-level API) and the global `config`.

---@class runner
---@field overrides string[]          # the key=value strings from the command line
---@field config table|nil            # the resolved config, once config{} ran
---@field pretty runner.pretty
runner = {}

--- Declares the script's settings with their defaults and returns them resolved: key=value on the
--- command line overrides a default, parsed by the default's type (number; a whole number where the
--- script writes the default as an integer literal, `steps = 600`, not `600.0`; boolean as true/false,
--- yes/no, on/off, 1/0; string; list as comma-separated values). An unknown key or a bad value stops
--- the run with exit status 2 and a message naming the key (and the key meant, for a misspelling). The resolved config is logged at start.
--- `limits` bounds number keys (and lists of numbers, element by element): `{ every = { min = 1 }, p = { min = 0,
--- max = 1 } }`; a value outside them is a bad value. Numbers are finite (nan and inf are bad values).
--- Reading an undeclared key from the result is an error. Assigning to it (in the script, or from `runner attach`) is
--- checked as key=value is: an undeclared key is an error with the key meant, and so is a value of another type, a
--- fraction for a whole-number key or a number outside the key's limits; the value stays as it was.
--- The result is a proxy over the values: `pairs(cfg)` walks them (runner's `pairs` honours `__pairs`, as Lua 5.2's).
---
--- Example: `local cfg = config({ lr = 2e-4, steps = 2000, mults = {1, 2} }, { steps = { min = 1 } })`
---@param defaults table<string, number|boolean|string|table>
---@param limits? table<string, {min?: number, max?: number}>
---@return table
function config(defaults, limits) end

--- Prints the documentation these stubs give for a runner function, class, namespace or object:
--- `help(torch.randn)`; `help(nn.DiT)` (with the fields of its options table); `help(model)` (its class and the
--- methods it has); `help "trainer"` (every documented name whose last part is "trainer", and TrainerOptions;
--- else the names containing it). Says so when nothing is documented. `help()` prints how to use it.
---@param subject? any a function, namespace or object, or a name to look up
function help(subject) end

--- Logging at a level through the runner logger (stderr; level set by --log-level).
--- Each takes a format string and arguments, as string.format.
runner.log = {}
function runner.log.trace(format, ...) end
function runner.log.debug(format, ...) end
function runner.log.info(format, ...) end
function runner.log.warn(format, ...) end
function runner.log.error(format, ...) end

--- Monotonic seconds, for timing.
---@return number
function runner.clock() end

--- {runner=, libtorch=, luajit=, sqlite=, cuda_runtime=, cuda_available=, cuda_devices={...}}
---@return table
function runner.versions() end

--- The options tables the runtime declares, by the name of their ---@class in these stubs: the keys each
--- accepts, in declaration order (for tools and the spec that keeps these stubs true).
---@return table<string, string[]>
function runner.option_tables() end

--- Stops the script as a usage error (exit status 2), prefixed with the calling script's file:line. A run
--- started before it that has not run a step and recorded nothing is not kept (see runner.start).
---@param message string
function runner.usage_error(message) end

---@class runner.pretty
runner.pretty = {}
--- Renders a value for humans: nested tables (to depth, default 3), tensors and modules by tostring.
---@return string
function runner.pretty.repr(value, depth) end
--- Prints each value rendered by repr, separated by tabs.
function runner.pretty.print(...) end

--- Writes a batch of images as one PNG grid (torchvision's make_grid layout, `columns` images per row, the
--- file written atomically). Float values in `range` (default {-1, 1}) map to 0..255; uint8 images are
--- written as they are. images: [N, 1 or 3, H, W] on any device.
---@param path string
---@param images Tensor
---@param options? GridOptions
function runner.save_grid(path, images, options) end

---@class GridOptions
---@field columns? integer     images per row (default 8)
---@field padding? integer     pixels between images and around the border (default 2)
---@field range? number[]      {low, high}: the values shown as black and white (default {-1, 1})
---@field pad_value? number    border brightness in [0, 1] (default 0)

--- The grid save_grid writes, as a uint8 tensor [H, W, C] on the CPU.
---@return Tensor
function runner.make_grid(images, options) end

runner.eval = {}
--- Sliced Wasserstein distance between two image sets of the same shape [N, C, H, W], average-pooled to
--- resolution x resolution and compared level by level on a Laplacian pyramid (detail at each side >= 8,
--- then the low-pass rest; each level scaled by the standard deviation of both sets' values): per level, the
--- mean over `projections` random unit directions (from a CPU generator seeded with `seed`) of the 1-D
--- Wasserstein-1 distance of the projected sets; the result is the mean over levels. 0 for equal sets;
--- lower is closer. A sample-quality number that needs no download (definition in
--- runtime/eval/sliced_wasserstein.h).
---@param options? SlicedWassersteinOptions
---@return number
function runner.eval.sliced_wasserstein(a, b, options) end

---@class SlicedWassersteinOptions
---@field resolution? integer   default 16
---@field projections? integer  default 512
---@field seed? integer         default 0

--- Fréchet Inception Distance as pytorch-fid computes it: the FID Inception network (TensorFlow's 2015-12-05
--- Inception v3 in pytorch-fid's form: bilinear resize to 299 x 299, 2x - 1, pool3 features), the features'
--- mean and covariance in float64, and the Fréchet distance between the two Gaussians. Each side is images
--- [N, 3, H, W] in [-1, 1] (e.g. samples), the path of a folder of images (read as RGB / 255 like pytorch-fid),
--- or the path of an .npz with mu and sigma (`runner data fid-stats`, pytorch-fid's --save-stats, ADM's and
--- clean-fid's reference files). `weights` is the user's local copy of pytorch-fid's
--- pt_inception-2015-12-05-6726825d.pth (a torch.save file, sha256
--- 6726825d0af5f729cebd5821db510b11b1cfad8faad88a03f1befd49fb9129b2, published at
--- https://github.com/mseitzer/pytorch-fid/releases/download/fid_weights/pt_inception-2015-12-05-6726825d.pth;
--- or the same tensors as safetensors); runner downloads nothing. Its sha256 is checked on load: a file of that
--- name with another sha256 is an error, other weights give a warning naming both. Without the file,
--- runner.eval.sliced_wasserstein measures sample quality with no download. The network
--- is loaded once per process. Numbers equal pytorch-fid's on the same images and weights to 1e-3 relative
--- (tests/cli/test_fid.py); FID of few images is biased upward: compare numbers of the same N.
---@param a Tensor|string
---@param b Tensor|string
---@param options FidOptions
---@return number
function runner.eval.fid(a, b, options) end

---@class FidOptions
---@field weights string   the FID Inception weights file
---@field batch? integer   images per forward pass (default 50)
---@field device? Device   default "auto"

--- The FID statistics of images [N, 3, H, W] in [-1, 1] or of a folder: mu float64 [2048], sigma float64
--- [2048, 2048] (see runner.eval.fid).
---@param images Tensor|string
---@param options FidOptions
---@return Tensor mu
---@return Tensor sigma
function runner.eval.fid_stats(images, options) end
