-- Benchmark (runner side of bench/model_throughput.py): training-step throughput of the built-in UNet or DiT.
-- One step: drop the gradients (set to none), forward on a fixed random batch, MSE against a fixed random
-- target, backward; no optimizer. `warmup` untimed steps, then `steps` timed ones, with the device
-- synchronized before each clock reading. The model is in training mode (the UNet's dropout is active).
-- dtype=bfloat16 converts the model's parameters and the inputs to bfloat16 ("bf16 weights"): the Lua API
-- has no autocast. Prints one line: RESULT {"images_per_s": ..., "seconds": ..., ...}
--   build/runner bench/model_throughput.lua model=unet device=cpu batch=8 steps=5 warmup=2 channels=32
--   build/runner bench/model_throughput.lua model=dit device=cuda dtype=bfloat16 batch=128   # DiT-XL/2
local cfg = config {
  model = "unet",       -- unet or dit
  device = "cpu",       -- cpu, cuda, cuda:N or auto
  dtype = "float32",    -- float32 or bfloat16 (parameters and inputs converted)
  batch = 8,            -- images per step
  warmup = 2,           -- untimed steps
  steps = 5,            -- timed steps
  threads = 0,          -- intra-op CPU threads (0: LibTorch's default)
  seed = 0,
  image = 32,           -- input side
  in_channels = 0,      -- 0: the model's default (UNet 3, DiT 4)
  classes = -1,         -- -1: the model's default (UNet 0, DiT 1000)
  -- UNet (defaults: the CIFAR-10 DDPM configuration)
  channels = 128,
  mults = { 1, 2, 2, 2 },
  blocks = 2,
  attention = "16",     -- comma-separated resolutions with self-attention ("" for none)
  dropout = 0.1,
  -- DiT (defaults: DiT-XL/2)
  depth = 28,
  hidden = 1152,
  heads = 16,
  patch = 2,
  learn_sigma = true,
}
if cfg.model ~= "unet" and cfg.model ~= "dit" then runner.usage_error("model must be unet or dit") end
if cfg.dtype ~= "float32" and cfg.dtype ~= "bfloat16" then runner.usage_error("dtype must be float32 or bfloat16") end
if cfg.batch < 1 or cfg.steps < 1 or cfg.warmup < 0 then
  runner.usage_error("batch and steps must be >= 1, warmup >= 0")
end

if cfg.threads > 0 then torch.set_num_threads(cfg.threads) end
torch.manual_seed(cfg.seed)
local device = torch.device(cfg.device)
local on_cuda = device:find("^cuda") ~= nil
local function synchronize()
  if on_cuda then torch.cuda.synchronize() end
end

local build_start = runner.clock()
local model
if cfg.model == "unet" then
  local attention = {}
  for value in cfg.attention:gmatch("[^,%s]+") do attention[#attention + 1] = tonumber(value) end
  model = nn.UNet {
    channels = cfg.channels, mults = cfg.mults, blocks = cfg.blocks, attention = attention,
    dropout = cfg.dropout, image = cfg.image,
    in_channels = cfg.in_channels > 0 and cfg.in_channels or 3,
    classes = cfg.classes >= 0 and cfg.classes or 0,
  }
else
  model = nn.DiT {
    depth = cfg.depth, hidden = cfg.hidden, heads = cfg.heads, patch = cfg.patch, image = cfg.image,
    in_channels = cfg.in_channels > 0 and cfg.in_channels or 4,
    classes = cfg.classes >= 0 and cfg.classes or 1000,
    learn_sigma = cfg.learn_sigma,
  }
end
model:to(device)
if cfg.dtype ~= "float32" then model:to(cfg.dtype) end
model:train()
local info = model:info()

local options = { device = device, dtype = cfg.dtype }
local x = torch.randn({ cfg.batch, info.in_channels, info.image, info.image }, options)
local target = torch.randn({ cfg.batch, info.out_channels, info.image, info.image }, options)
local t = torch.randint(0, 1000, { cfg.batch }, { device = device })
local y = nil
if info.classes > 0 then y = torch.randint(0, info.classes, { cfg.batch }, { device = device }) end
local params = model:parameters()
synchronize()
local build_s = runner.clock() - build_start

local function step()
  for i = 1, #params do params[i].grad = nil end
  local loss = nn.functional.mse_loss(model(x, t, y), target)
  loss:backward()
  return loss
end

local warmup_start = runner.clock()
for _ = 1, cfg.warmup do step() end
synchronize()
local start = runner.clock()
local loss
for _ = 1, cfg.steps do loss = step() end
synchronize()
local seconds = runner.clock() - start
local warmup_s = start - warmup_start
local last_loss = loss:item()

print(string.format(
  'RESULT {"images_per_s": %.4f, "steps_per_s": %.5f, "seconds": %.6f, "steps": %d, "warmup": %d, ' ..
  '"warmup_s": %.4f, "build_s": %.4f, "batch": %d, "parameters": %d, "loss": %.6f, "threads": %d, ' ..
  '"device": "%s", "dtype": "%s", "model": "%s"}',
  cfg.steps * cfg.batch / seconds, cfg.steps / seconds, seconds, cfg.steps, cfg.warmup, warmup_s, build_s,
  cfg.batch, model:num_parameters(), last_loss, torch.get_num_threads(), device, cfg.dtype, cfg.model))
