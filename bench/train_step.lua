-- Runner side of bench/train_step.py: timed `train:step` calls of the step users run (DDPM loss with its noise and
-- timestep sampling, forward and backward under autocast, clip 1.0, AdamW, fp32 EMA); prints `RESULT {json}` with the
-- CUDA allocator's peak memory (whole run and timed steps) and the process's peak RSS and its RSS before the model.
--   build/runner bench/train_step.lua model=unet batch=128                       # the CIFAR-10 UNet on CUDA
--   build/runner bench/train_step.lua model=dit size=DiT-XL/2 batch=256
--   build/runner bench/train_step.lua model=quickstart batch=32                  # the main job's 16x16 UNet
--   build/runner bench/train_step.lua model=quickstart batch=32 graph=true       # its steps replayed as CUDA graphs
--   build/runner bench/train_step.lua model=dit size=DiT-XL/2 batch=256 fused=true cast_weights_once=true amp=fp8
--   build/runner bench/train_step.lua model=unet device=cpu channels=32 batch=8 steps=3 warmup=1
local cfg = config {
  model = "unet",       -- unet (the DDPM CIFAR-10 UNet), quickstart (the main job's UNet on 16x16 images) or dit
                        -- (class-conditional, 32x32x4 latents)
  size = "DiT-B/2",     -- the DiT preset
  channels = 128,       -- the UNet's width (128: 35.7M parameters)
  device = "cuda",      -- cpu, cuda or cuda:N
  batch = 128,
  amp = "auto",         -- bf16 autocast on CUDA, fp32 on the CPU
  steps = 20,           -- timed steps
  warmup = 5,           -- untimed steps before them (with graph=true: the graph's 3 warm-up steps and its capture)
  graph = false,        -- replay each step from a CUDA graph (runner.trainer { graph = true })
  fused = false,        -- the DiT's fused block (nn.DiT { fused = true }: runner's CUDA kernels, one adaLN GEMM)
  cast_weights_once = false,  -- the weights cast to bf16 once per step (runner.trainer { cast_weights_once = true })
  seed = 0,
}
if cfg.model ~= "unet" and cfg.model ~= "quickstart" and cfg.model ~= "dit" then
  runner.usage_error("model must be unet, quickstart or dit")
end
torch.manual_seed(cfg.seed)
local device = cfg.device
local on_cuda = device:find("^cuda") ~= nil
local cuda_index = tonumber(device:match("^cuda:(%d+)$")) or 0  -- whose memory statistics are read

-- The process's resident set size in GiB from /proc/self/status: "VmRSS" now, "VmHWM" its peak since runner started
-- (this program's own: unlike getrusage's maxrss it does not start from the parent's size); nil without /proc
local function process_memory_gib(field)
  local status = io.open("/proc/self/status", "r")
  if not status then return nil end
  local text = status:read("*a")
  status:close()
  local kib = text:match(field .. ":%s*(%d+) kB")
  return kib and tonumber(kib) / 2 ^ 20 or nil
end
local start_rss_gib = process_memory_gib("VmRSS")  -- LibTorch and Lua loaded, no model yet: the peak's baseline

local function make_model()
  if cfg.model == "unet" then
    return nn.UNet { image = 32, channels = cfg.channels, mults = { 1, 2, 2, 2 }, blocks = 2, attention = { 16 },
                     dropout = 0.1 }
  elseif cfg.model == "quickstart" then  -- as experiments/quickstart.lua builds it
    return nn.UNet { image = 16, channels = 32, mults = { 1, 2, 2 }, blocks = 1, attention = { 8 }, dropout = 0, groups = 8 }
  end
  return nn.DiT { size = cfg.size, image = 32, in_channels = 4, classes = 1000, learn_sigma = true, fused = cfg.fused }
end
local model = make_model():to(device)
local ddpm = runner.diffusion.gaussian { timesteps = 1000, schedule = "linear", seed = cfg.seed }
local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-4, weight_decay = 0 }, clip = 1.0,
                               objective = ddpm:objective(model),
                               ema = 0.9999, ema_model = make_model():to(device), amp = cfg.amp,
                               graph = cfg.graph, cast_weights_once = cfg.cast_weights_once, steps = cfg.warmup + cfg.steps, batch = cfg.batch, progress = false }
local batch
if cfg.model ~= "dit" then
  local side = cfg.model == "quickstart" and 16 or 32
  batch = { data = torch.randn(cfg.batch, 3, side, side, { device = device }) }
else
  batch = { data = torch.randn(cfg.batch, 4, 32, 32, { device = device }),
            label = torch.randint(0, 1000, { cfg.batch }, { device = device }) }
end

local function synchronize()
  if on_cuda then torch.cuda.synchronize() end
end

local out
local warmup_start = runner.clock()
for _ = 1, cfg.warmup do out = train:step(batch) end
synchronize()
-- CUDA allocator peaks: over the process until the end of the warm-up (model, optimizer, graph capture), then over
-- the timed steps alone
local warmup_peak_bytes = on_cuda and torch.cuda.max_memory_allocated(cuda_index) or nil
if on_cuda then torch.cuda.reset_peak_memory_stats(cuda_index) end
local start = runner.clock()
for _ = 1, cfg.steps do out = train:step(batch) end
local loss = out.loss:item()
synchronize()
local seconds = runner.clock() - start
local timing = out.timing
local timed_peak_bytes = on_cuda and torch.cuda.max_memory_allocated(cuda_index) or nil
local function json_gib(value) return value and string.format("%.4f", value) or "null" end
print(string.format('RESULT {"images_per_s": %.4f, "step_ms": %.4f, "seconds": %.6f, "steps": %d, "warmup": %d, ' ..
  '"warmup_s": %.4f, "batch": %d, "parameters": %d, "loss": %.6f, "device": "%s", "amp": "%s", ' ..
  '"peak_memory_gib": %s, "timed_peak_memory_gib": %s, "process_peak_rss_gib": %s, "start_rss_gib": %s, ' ..
  '"threads": %d, ' ..
  '"forward_backward_ms": %.4f, "optimizer_ms": %.4f, "ema_ms": %.4f, ' ..
  '"graphs_replayed": %d}',
  cfg.steps * cfg.batch / seconds, 1000 * seconds / cfg.steps, seconds, cfg.steps, cfg.warmup, start - warmup_start,
  cfg.batch, model:num_parameters(), loss, device, train:precision(),
  json_gib(on_cuda and math.max(warmup_peak_bytes, timed_peak_bytes) / 2 ^ 30),
  json_gib(on_cuda and timed_peak_bytes / 2 ^ 30), json_gib(process_memory_gib("VmHWM")), json_gib(start_rss_gib),
  torch.get_num_threads(), 1000 * timing.forward_backward, 1000 * timing.optimizer, 1000 * timing.ema,
  train:graphs().replayed))
