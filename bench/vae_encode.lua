-- Runner side of bench/vae_encode.py: timed `vae:encode` calls of the Stable Diffusion VAE (random weights) on
-- random images; prints `RESULT {json}`.
--   build/runner bench/vae_encode.lua device=cuda size=256 batch=32
local cfg = config {
  device = "cuda",   -- cpu, cuda or cuda:N
  size = 256,        -- image side
  batch = 32,
  dtype = "float32", -- float32 or bfloat16 (weights and images)
  steps = 10,        -- timed calls
  warmup = 3,        -- untimed calls before them
  seed = 0,
}
torch.manual_seed(cfg.seed)
local on_cuda = cfg.device:find("^cuda") ~= nil
if on_cuda then torch.cuda.tf32(true) end  -- as PyTorch's default conv setting (cudnn.allow_tf32)
local vae = nn.AutoencoderKL():to(cfg.device):to(cfg.dtype)
vae:eval()
local images = (torch.rand(cfg.batch, 3, cfg.size, cfg.size, { device = cfg.device }) * 2 - 1):to(cfg.dtype)
local function synchronize()
  if on_cuda then torch.cuda.synchronize() end
end
torch.no_grad(function()
  for _ = 1, cfg.warmup do vae:encode(images) end
  synchronize()
  local start = runner.clock()
  local mean
  for _ = 1, cfg.steps do mean = vae:encode(images) end
  synchronize()
  local seconds = runner.clock() - start
  print(string.format('RESULT {"images_per_s": %.4f, "call_ms": %.4f, "steps": %d, "batch": %d, "size": %d, ' ..
    '"dtype": "%s", "device": "%s", "threads": %d, "mean_abs": %.6f}', cfg.steps * cfg.batch / seconds,
    1000 * seconds / cfg.steps, cfg.steps, cfg.batch, cfg.size, cfg.dtype, cfg.device, torch.get_num_threads(),
    mean:float():abs():mean():item()))
end)
