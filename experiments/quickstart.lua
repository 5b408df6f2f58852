-- Quickstart: a small DDPM UNet (or with objective=flow, the same UNet trained by flow matching) learns the built-in `shapes` images (16x16 white circles, squares and triangles,
-- upright, on black) in about four minutes on a 2-core CPU, faster on a GPU with the same script: its last sample
-- grid shows the three shapes. `colours=true rotate=true` trains on the harder variant (random colours, any
-- rotation), whose corners take far longer: in four minutes it draws blobs of the right colours, and with seven
-- times the images (steps=6000 batch=64) circles and many triangles but still rounded squares.
-- It prints the loss as it goes and reports a sample-quality number: the sliced Wasserstein distance between
-- generated and real images (lower is better; needs no download), beside its floor: the distance between two
-- sets of real images, which no model can beat by much. The run is recorded in the index (runs/ by default):
-- metrics, sample grids, checkpoints and the final numbers; `runner show last` and `runner report last` show
-- them. Stopped (Ctrl-C) or killed, it continues from its latest checkpoint when started again.
--   scripts/run experiments/quickstart.lua steps=600 seed=3
local cfg = config({
  steps = 1800,            -- optimizer steps
  batch = 32,              -- images per step (small batches learn more per image here than large ones)
  lr = 2e-3,               -- AdamW learning rate
  warmup = 50,             -- steps of linear LR warmup (without it, a wider UNet, channels=64, does not learn at 2e-3)
  ema = 0.995,             -- decay of the weight average that samples are drawn from (warmed up: a short run's
                           -- average forgets the untrained weights)
  image = 16,              -- image side
  colours = false,         -- shapes in random colours on backgrounds of other colours (else white on black)
  rotate = false,          -- shapes at any rotation (else upright: squares axis-aligned, triangles pointing up)
  channels = 32,           -- UNet base width
  objective = "ddpm",      -- what the model learns: ddpm (Gaussian diffusion) or flow (SiT's flow matching)
  timesteps = 1000,        -- diffusion steps (ddpm)
  schedule = "cosine",     -- noise schedule (ddpm): linear, cosine or scaled_linear
  prediction = "v",        -- what the model predicts (ddpm): eps, x0 or v
  min_snr = 5,             -- min-SNR loss weighting gamma (ddpm; faster convergence); 0: off
  path = "linear",         -- interpolant (flow): linear (rectified flow), gvp or vp
  flow_prediction = "velocity", -- what the model predicts (flow): velocity, noise or score
  timestep_sampling = "logit_normal", -- how training draws noise levels: uniform, or logit_normal (more of the
                           -- middle levels, where a 16x16 image's shape is decided; the ends are near-trivial)
  sample_steps = 50,       -- sampling steps (ddpm: DDIM; flow: the ODE's Euler steps)
  sample_every = 600,      -- write a sample grid every this many steps (and at the end)
  checkpoint_every = 300,  -- save a checkpoint every this many steps (and at the end)
  metric_samples = 256,    -- generated and real images compared by the quality metric
  seed = 0,
  device = "auto",         -- cpu, cuda, cuda:N or auto
  shard = "none",          -- with --nproc N: "optimizer" or "gradients" keeps a 1/N share of the state per rank
  graph = true,            -- on CUDA, replay each training step from a CUDA graph (no effect on the CPU)
}, { steps = { min = 0 }, sample_steps = { min = 1 }, sample_every = { min = 1 }, checkpoint_every = { min = 1 },
    metric_samples = { min = 1 } })

-- Made before the run starts, so that a mistake in its settings leaves no run behind. Both objectives train, sample
-- and checkpoint through the same calls.
local diffusion
if cfg.objective == "ddpm" then
  diffusion = runner.diffusion.gaussian { timesteps = cfg.timesteps, schedule = cfg.schedule, prediction = cfg.prediction,
                                          min_snr = cfg.min_snr > 0 and cfg.min_snr or nil,
                                          timestep_sampling = cfg.timestep_sampling, seed = cfg.seed }
elseif cfg.objective == "flow" then
  diffusion = runner.diffusion.flow { path = cfg.path, prediction = cfg.flow_prediction, time = cfg.timestep_sampling,
                                      seed = cfg.seed }
else
  runner.usage_error(string.format("objective must be ddpm or flow, got '%s'", cfg.objective))
end

local run = runner.start(cfg)  -- seeds every generator from cfg.seed, picks the device, opens runs/<name>/
local device = run.device

local function shapes_data(count, seed)
  return runner.data.shapes { size = cfg.image, count = count, seed = seed, colours = cfg.colours, rotate = cfg.rotate }
end
local shapes = shapes_data(50000, cfg.seed)
local loader = runner.data.loader(shapes, { batch = cfg.batch, shuffle = true, seed = cfg.seed, device = device })

local function make_model()
  return nn.UNet { image = cfg.image, channels = cfg.channels, mults = { 1, 2, 2 }, blocks = 1, attention = { 8 },
                   dropout = 0, groups = 8 }
end
local model = make_model():to(device)
-- The trainer runs each step in C++ (the diffusion loss, AdamW, EMA, progress display); the EMA model is what samples
-- come from.
local train = runner.trainer { model = model, optimizer = { "adamw", lr = cfg.lr, weight_decay = 0 }, warmup = cfg.warmup,
                               objective = diffusion:objective(model),
                               ema = { decay = cfg.ema, warmup = true },
                               ema_model = make_model():to(device), steps = cfg.steps, batch = cfg.batch,
                               graph = cfg.graph and "auto" or false, shard = cfg.shard }
-- Continues from the latest checkpoint when the same command runs again after a stop or a failure (or with --resume).
run:restore { trainer = train, loader = loader, state = { [cfg.objective] = diffusion } }
print(model)
print(string.format("%.2fM parameters on %s; %d steps of batch %d", model:num_parameters() / 1e6, device, cfg.steps, cfg.batch))

-- Real images the metric compares against: shapes the model never trains on (seeds of their own, the same for every
-- run, so that runs of different seeds compare); a second such set gives the metric's floor. Every rank of a
-- data-parallel run takes the whole set (one shard of one).
local function real_shapes(seed)
  local held_out = shapes_data(cfg.metric_samples, seed)
  return runner.data.loader(held_out, { batch = cfg.metric_samples, rank = 0, world_size = 1 }):next().data
end
local real = real_shapes(1000003)
local floor = runner.eval.sliced_wasserstein(real_shapes(2000003), real)
if run.step == 0 then run:images("real", real:narrow(1, 1, math.min(64, cfg.metric_samples))) end

-- Rank 0 draws the metric's samples and records them (the other ranks of a data-parallel run wait for it at the
-- next step) and prints the paths of the files it writes; the others return nil. Every rank reads the EMA model:
-- with shard, reading it gathers it from every rank.
local function evaluate()
  local ema = train.ema
  if not runner.dist.is_main then return nil end
  local samples = diffusion:sample(ema, { n = cfg.metric_samples, steps = cfg.sample_steps, seed = cfg.seed })
  local path = run:images("samples", samples:narrow(1, 1, math.min(64, cfg.metric_samples)))
  local distance = runner.eval.sliced_wasserstein(samples, real)
  run:log { swd = distance }
  print(string.format("step %5d  samples: %s  sliced Wasserstein to real shapes: %.4f (real to real: %.4f)", run.step,
    path, distance, floor))
  return distance
end

local start = runner.clock()
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(batch)
  run:log { loss = out.loss }
  if run:every(cfg.checkpoint_every) and run.step ~= cfg.steps then run:checkpoint() end
  if run:every(cfg.sample_every) and run.step ~= cfg.steps then evaluate() end
end
local distance = evaluate()
run:checkpoint { metric = "swd", value = distance, wait = true }
if runner.dist.is_main then
  run:set_summary { swd = distance, swd_floor = floor, seconds = runner.clock() - start }
  print(string.format("sample quality (sliced Wasserstein distance to real shapes, lower is better): %.4f; "
    .. "real shapes against other real shapes: %.4f", distance, floor))
  print(string.format("done in %.0f s; run %s: sample grids in %s/images (runner show %s, runner report %s)",
    runner.clock() - start, run.name, run.dir, run.name, run.name))
end
