-- Benchmark (runner side of bench/data_loading.py): images/s of the JPEG loader, decode to normalized batch.
-- One epoch over an image folder: decode, resize the shorter side to `size`, random crop `size`, random
-- horizontal flip, normalize to [-1, 1], batches of `batch`. The clock starts when the first batch arrives
-- and stops when the last one arrives; the images counted are those of the batches after the first.
-- Prints one line: RESULT {"images_per_s": ..., "batches": ..., "seconds": ..., "workers": ..., "size": ...}
--   build/runner bench/data_loading.lua path=DIR size=64 workers=4 batch=64 [images=N]
local cfg = config {
  path = "",     -- image folder: one subfolder per class
  size = 64,     -- output side in pixels
  workers = 2,   -- loader workers
  batch = 64,    -- images per batch
  images = 0,    -- stop after this many images (0: one full epoch)
}
if cfg.path == "" then runner.usage_error("give the image folder: path=DIR") end

local data = require("runner.data")

local dataset = data.image_folder { path = cfg.path, labels = true }
local loader = data.loader(dataset, {
  batch = cfg.batch, shuffle = true, drop_last = true, workers = cfg.workers, seed = 0,
  transform = { resize = cfg.size, random_crop = cfg.size, flip = true },
})

local start = runner.clock()
local first, last
local batches, images, timed_images = 0, 0, 0
for batch in loader:iter() do
  local now = runner.clock()
  local count = batch.data:size(1)
  batches = batches + 1
  images = images + count
  if first == nil then
    first = now
  else
    timed_images = timed_images + count
  end
  last = now
  if cfg.images > 0 and images >= cfg.images then break end
end
if batches < 2 then
  error(string.format("only %d batch(es) of %d images in %s: need at least two", batches, cfg.batch, cfg.path))
end

local seconds = last - first
local stats = loader:stats()
print(string.format(
  'RESULT {"images_per_s": %.3f, "batches": %d, "images": %d, "seconds": %.6f, "first_batch_s": %.6f, ' ..
  '"workers": %d, "size": %d, "wait_s": %.6f, "skipped": %d}',
  timed_images / seconds, batches, timed_images, seconds, first - start,
  stats.workers or cfg.workers, cfg.size, stats.wait_s or 0, stats.skipped or 0))
