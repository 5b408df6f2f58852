-- Benchmark: share of training step time spent waiting for data, with a small UNet denoiser on procedural shapes.
-- Trains for `warmup` untimed steps, then `steps` timed ones, with the loader at its default worker count.
-- Reports steps/s and the loader's wait time over the timed loop time (the data-wait share), and prints one
-- line: RESULT {"steps_per_s": ..., "data_wait_pct": ..., ...}. Meant for a GPU; runs on a CPU too:
--   build/runner bench/data_wait.lua                       # on cuda
--   build/runner bench/data_wait.lua device=cpu steps=20 warmup=2 batch=16
local cfg = config {
  device = "cuda",  -- cpu, cuda, cuda:N or auto
  size = 64,        -- image side in pixels
  batch = 128,      -- images per step
  steps = 300,      -- timed steps
  warmup = 20,      -- untimed steps before them
}

local data = require("runner.data")

local CHANNELS = 64  -- width at full resolution; doubled at 1/2 and 1/4
local GROUPS = 8     -- GroupNorm groups

-- Nearest-neighbour 2x upsampling of [N, C, H, W].
local function upsample2x(x)
  local n, c, h, w = unpack(x.shape)
  return x:unsqueeze(4):unsqueeze(6):expand(n, c, h, 2, w, 2):reshape(n, c, 2 * h, 2 * w)
end

-- GroupNorm, SiLU, 3x3 conv twice, with a residual connection (1x1 conv when the width changes).
local Block = nn.Module("Block")

function Block:init(channels_in, channels_out)
  self.first = nn.Sequential(nn.GroupNorm(GROUPS, channels_in), nn.SiLU(),
    nn.Conv2d(channels_in, channels_out, 3, { padding = 1 }))
  self.second = nn.Sequential(nn.GroupNorm(GROUPS, channels_out), nn.SiLU(),
    nn.Conv2d(channels_out, channels_out, 3, { padding = 1 }))
  if channels_in ~= channels_out then self.skip = nn.Conv2d(channels_in, channels_out, 1) end
end

function Block:forward(x)
  local h = self.second(self.first(x))
  if self.skip then return h + self.skip(x) end
  return h + x
end

-- Two resolutions down (strided convs), one block in the middle, two up (upsample + conv), with skips.
local UNet = nn.Module("UNet")

function UNet:init(c)
  self.stem = nn.Conv2d(3, c, 3, { padding = 1 })
  self.down1 = Block(c, c)
  self.pool1 = nn.Conv2d(c, c, 3, { stride = 2, padding = 1 })
  self.down2 = Block(c, 2 * c)
  self.pool2 = nn.Conv2d(2 * c, 2 * c, 3, { stride = 2, padding = 1 })
  self.middle = Block(2 * c, 2 * c)
  self.up2 = nn.Conv2d(2 * c, 2 * c, 3, { padding = 1 })
  self.block2 = Block(4 * c, 2 * c)
  self.up1 = nn.Conv2d(2 * c, c, 3, { padding = 1 })
  self.block1 = Block(2 * c, c)
  self.head = nn.Sequential(nn.GroupNorm(GROUPS, c), nn.SiLU(), nn.Conv2d(c, 3, 3, { padding = 1 }))
end

function UNet:forward(x)
  local skip1 = self.down1(self.stem(x))
  local skip2 = self.down2(self.pool1(skip1))
  local h = self.middle(self.pool2(skip2))
  h = self.block2(torch.cat({ self.up2(upsample2x(h)), skip2 }, 2))
  h = self.block1(torch.cat({ self.up1(upsample2x(h)), skip1 }, 2))
  return self.head(h)
end

if cfg.size % 4 ~= 0 then runner.usage_error("size must be a multiple of 4") end
if cfg.steps < 1 or cfg.warmup < 0 then runner.usage_error("steps must be >= 1 and warmup >= 0") end
torch.manual_seed(0)
local device = torch.device(cfg.device)
local on_cuda = device:find("^cuda") ~= nil
local function synchronize()
  if on_cuda then torch.cuda.synchronize() end
end

local dataset = data.shapes { size = cfg.size, count = 50000, seed = 0 }
local loader = data.loader(dataset, {
  batch = cfg.batch, shuffle = true, drop_last = true, device = device, transform = { flip = true },
})
local model = UNet(CHANNELS):to(device)
local opt = optim.AdamW(model, { lr = 1e-3 })
print(string.format("UNet, %d parameters, on %s; batch %d of %dx%d", model:num_parameters(), device,
  cfg.batch, cfg.size, cfg.size))

local total_steps = cfg.warmup + cfg.steps
local step = 0
local timed_start, wait_start, loss_sum

local function start_timing()
  synchronize()
  timed_start = runner.clock()
  wait_start = loader:stats().wait_s
end

if cfg.warmup == 0 then start_timing() end
while step < total_steps do
  local epoch_batches = 0
  for batch in loader:iter() do
    epoch_batches = epoch_batches + 1
    step = step + 1
    local x = batch.data
    local noise = torch.randn_like(x)
    local loss = nn.functional.mse_loss(model(x + noise), noise)
    opt:zero_grad()
    loss:backward()
    opt:step()
    if step > cfg.warmup then
      loss_sum = loss_sum and loss_sum + loss:detach() or loss:detach()
    end
    if step == cfg.warmup then start_timing() end
    if step == total_steps then break end
  end
  if epoch_batches == 0 then error("the loader produced no batches") end
end
synchronize()
local seconds = runner.clock() - timed_start
local stats = loader:stats()
local wait = stats.wait_s - wait_start
local steps_per_s = cfg.steps / seconds
local wait_pct = 100 * wait / seconds
local mean_loss = loss_sum:item() / cfg.steps

print(string.format("%d steps in %.2f s: %.2f steps/s, %.0f images/s; data wait %.3f s = %.2f%% of step time "
  .. "(%d workers); mean loss %.4f", cfg.steps, seconds, steps_per_s, steps_per_s * cfg.batch, wait, wait_pct,
  stats.workers or -1, mean_loss))
print(string.format(
  'RESULT {"steps_per_s": %.4f, "images_per_s": %.2f, "data_wait_pct": %.4f, "wait_s": %.6f, "seconds": %.6f, ' ..
  '"steps": %d, "warmup": %d, "batch": %d, "size": %d, "device": "%s", "workers": %d, "loss": %.6f}',
  steps_per_s, steps_per_s * cfg.batch, wait_pct, wait, seconds, cfg.steps, cfg.warmup, cfg.batch, cfg.size,
  device, stats.workers or -1, mean_loss))
