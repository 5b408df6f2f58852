-- DDPM on CIFAR-10 with the setup of Ho et al. (2020): the 35.7M-parameter UNet, 1000 linear-schedule steps,
-- Adam at 2e-4 with 5000 warmup steps, batch 128, gradient clipping at 1, random flips, EMA 0.9999.
-- The data is the CIFAR-10 binary version (the folder holding data_batch_1.bin ... data_batch_5.bin):
--   scripts/run experiments/ddpm_cifar.lua data=/path/to/cifar-10-batches-bin
--   scripts/run experiments/ddpm_cifar.lua data=... channels=64 steps=50000 batch=64
local cfg = config({
  data = "",                  -- folder of the CIFAR-10 binary batches (required)
  steps = 800000,             -- optimizer steps
  batch = 128,
  lr = 2e-4,
  warmup = 5000,              -- linear learning-rate warmup steps
  clip = 1.0,                 -- gradient norm clipping
  ema = 0.9999,               -- EMA decay of the weights used for sampling
  channels = 128,
  mults = { 1, 2, 2, 2 },
  blocks = 2,
  attention = { 16 },
  dropout = 0.1,
  groups = 32,                -- GroupNorm groups
  timesteps = 1000,
  schedule = "linear",
  sample_every = 10000,       -- write a grid of EMA samples every this many steps (and at the end)
  sample_steps = 100,         -- DDIM steps for the grids
  samples = 64,
  log_every = 100,
  checkpoint_every = 5000,    -- save a resumable checkpoint every this many steps (and at the end)
  amp = "auto",               -- bf16 autocast on GPUs, fp32 on the CPU (or bf16, fp16, fp32)
  accumulate = 1,             -- micro-batches per step (the batch is split into this many)
  seed = 0,
  device = "auto",
  shard = "none",             -- with --nproc N: "optimizer" or "gradients" keeps a 1/N share of the state per rank
  graph = true,               -- on CUDA, replay each training step from a CUDA graph (data parallel runs eagerly)
  workers = -1,               -- loader threads (-1: automatic)
}, { sample_every = { min = 1 }, log_every = { min = 1 }, checkpoint_every = { min = 1 } })
if cfg.data == "" then runner.usage_error("give the CIFAR-10 folder: data=/path/to/cifar-10-batches-bin") end
-- The arguments are checked before the run starts: a mistake in them leaves no run behind.
local folder = io.open(cfg.data)
if not folder then runner.usage_error(string.format("data=%s: no such file or folder", cfg.data)) end
folder:close()
local ddpm = runner.diffusion.gaussian { timesteps = cfg.timesteps, schedule = cfg.schedule, seed = cfg.seed }

local amp_ok, amp_problem = pcall(runner.precision, cfg.amp, cfg.device)  -- refused before a run is recorded
if not amp_ok then runner.usage_error(amp_problem) end

local run = runner.start(cfg)  -- seeds every generator from cfg.seed, picks the device, opens runs/<name>/
local device = run.device

local train_set = runner.data.cifar10 { path = cfg.data, split = "train" }
local loader_options = { batch = cfg.batch, shuffle = true, drop_last = true, seed = cfg.seed, device = device,
                         transform = { flip = true } }
if cfg.workers >= 0 then loader_options.workers = cfg.workers end
local loader = runner.data.loader(train_set, loader_options)

local function make_model()
  return nn.UNet { image = 32, channels = cfg.channels, mults = cfg.mults, blocks = cfg.blocks,
                   attention = cfg.attention, dropout = cfg.dropout, groups = cfg.groups }
end
local model = make_model():to(device)
-- Adam with linear warmup, clipping and an EMA copy, each step in C++; the EMA model is what samples come from.
local train = runner.trainer { model = model, optimizer = { "adam", lr = cfg.lr }, objective = ddpm:objective(model),
                               warmup = cfg.warmup, clip = cfg.clip,
                               ema = cfg.ema, ema_model = make_model():to(device), amp = cfg.amp,
                               accumulate = cfg.accumulate, steps = cfg.steps, batch = cfg.batch, progress = false,
                               graph = cfg.graph and "auto" or false, shard = cfg.shard }
-- Continues from the latest good checkpoint when the run was interrupted.
run:restore { trainer = train, loader = loader, state = { ddpm = ddpm } }
print(model)
print(string.format("%.1fM parameters on %s; %s; %d steps of batch %d (%s)", model:num_parameters() / 1e6, device,
  tostring(train_set), cfg.steps, cfg.batch, train:precision()))

-- Rank 0 draws and writes the grids (the other ranks of a data-parallel run wait for it at the next step). Every
-- rank reads the EMA model: with shard, reading it gathers it from every rank.
local function write_samples(step)
  local ema = train.ema
  if not runner.dist.is_main then return end
  local samples = ddpm:sample(ema, { n = cfg.samples, steps = cfg.sample_steps, seed = cfg.seed })
  local path = run:images("samples", samples)
  print(string.format("step %7d  EMA samples: %s", step, path))
end

local start = runner.clock()
local first = run.step
local running, count, last = 0, 0, nil
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(batch)
  local step = run.step
  run:log { loss = out.loss, grad_norm = out.grad_norm, lr = out.lr }
  last = out
  if step == first + 1 or step % cfg.log_every == 0 or step == cfg.steps then
    local loss_value = out.loss:item()  -- reading the loss waits for the device: only on log lines
    local elapsed = runner.clock() - start
    print(string.format("step %7d  loss %.4f  grad norm %.3f  lr %.2e  %.1f img/s", step, loss_value,
      out.grad_norm:item(), out.lr, (step - first) * cfg.batch / elapsed))
  end
  if step % cfg.checkpoint_every == 0 then run:checkpoint() end
  if step % cfg.sample_every == 0 or step == cfg.steps then write_samples(step) end
end
run:checkpoint { wait = true }
local ema = train.ema  -- on every rank (gathered with shard); rank 0 writes it
if runner.dist.is_main then
  ema:save(run.dir .. "/ema.safetensors", { steps = tostring(cfg.steps) })
  run:set_summary { loss = last and last.loss:item() or nil, seconds = runner.clock() - start }
  print(string.format("done in %.0f s; EMA weights in %s/ema.safetensors", runner.clock() - start, run.dir))
end
