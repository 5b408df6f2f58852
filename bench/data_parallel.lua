-- Runner side of bench/data_parallel.py: timed trainer steps of the DDPM UNet on random images, in one process
-- or as one rank of `runner --nproc N` (unsharded, or with shard = optimizer | gradients | weights); rank 0 gathers
-- every rank's peak RSS and `train:state_bytes()` and prints `RESULT {json}`.
--   build/runner bench/data_parallel.lua batch=16 channels=32 steps=10
--   build/runner --nproc 2 bench/data_parallel.lua batch=16 channels=32 steps=10 overlap=false
--   build/runner --nproc 2 bench/data_parallel.lua batch=16 channels=32 steps=10 shard=gradients
local cfg = config {
  device = "cpu",      -- cpu, cuda or auto (a rank's own GPU)
  batch = 16,          -- global batch: each of N ranks takes batch / N
  channels = 32,       -- the CIFAR-10 UNet's width (128 in the paper)
  steps = 10,          -- timed steps
  warmup = 3,          -- untimed steps before them
  overlap = true,      -- gradient buckets averaged during the backward pass (else after it)
  bucket_mb = 25,
  shard = "none",      -- none, optimizer (ZeRO-1), gradients (ZeRO-2) or weights (ZeRO-3): runner.trainer's shard
                       -- (ignored by 1 process)
  seed = 0,
}
local dist = runner.dist
if cfg.batch % dist.world_size ~= 0 then
  runner.usage_error(string.format("batch %d does not split over %d ranks", cfg.batch, dist.world_size))
end
local device = cfg.device == "auto" and (torch.cuda.is_available() and "cuda:" .. dist.local_rank or "cpu")
  or cfg.device
local on_cuda = device:find("^cuda") ~= nil
torch.manual_seed(cfg.seed + dist.rank)

-- This process's peak resident set size in bytes since runner started (VmHWM in /proc/self/status); 0 without /proc
local function peak_rss_bytes()
  local status = io.open("/proc/self/status", "r")
  if not status then return 0 end
  local text = status:read("*a")
  status:close()
  local kib = text:match("VmHWM:%s*(%d+) kB")
  return kib and tonumber(kib) * 1024 or 0
end

local model = nn.UNet { image = 32, channels = cfg.channels, mults = { 1, 2, 2, 2 }, blocks = 2, attention = { 16 },
                        dropout = 0.1 }
model:to(device)
local ddpm = runner.diffusion.gaussian { timesteps = 1000 }
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 2e-4 }, clip = 1.0, amp = "auto",
                               objective = ddpm:objective(model),
                               steps = cfg.warmup + cfg.steps, batch = cfg.batch, progress = false,
                               data_parallel = { overlap = cfg.overlap, bucket_mb = cfg.bucket_mb },
                               shard = cfg.shard }
local local_batch = cfg.batch / dist.world_size
local images = torch.randn(local_batch, 3, 32, 32, { device = device })

local function synchronize()
  if on_cuda then torch.cuda.synchronize() end
end

local loss
for _ = 1, cfg.warmup do
  loss = train:step(images).loss
end
synchronize()
dist.barrier()
local start = runner.clock()
for _ = 1, cfg.steps do
  loss = train:step(images).loss
end
local last = loss:item()
synchronize()
dist.barrier()
local seconds = runner.clock() - start
-- Every rank's peak RSS and model-state bytes, gathered to rank 0 after the timed steps
local state = train:state_bytes()
local gathered = dist.all_gather(torch.tensor({ peak_rss_bytes(), state.total }, { dtype = "float64" }))
local peaks, states = {}, {}
for r, t in ipairs(gathered) do
  local values = t:tolist()
  peaks[r], states[r] = string.format("%.0f", values[1]), string.format("%.0f", values[2])
end
if dist.is_main then
  print(string.format('RESULT {"world_size": %d, "batch": %d, "overlap": %s, "bucket_mb": %g, "shard": "%s", ' ..
    '"steps": %d, "seconds": %.6f, "step_s": %.6f, "images_per_s": %.4f, "parameters": %d, "loss": %.6f, ' ..
    '"device": "%s", "threads": %d, "peak_rss_bytes": [%s], "state_bytes": [%s]}', dist.world_size, cfg.batch,
    tostring(cfg.overlap), cfg.bucket_mb, cfg.shard, cfg.steps, seconds, seconds / cfg.steps,
    cfg.batch * cfg.steps / seconds, model:num_parameters(), last, device, torch.get_num_threads(),
    table.concat(peaks, ", "), table.concat(states, ", ")))
end
