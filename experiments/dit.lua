-- Class-conditional DiT (Peebles & Xie 2023) on latents, or with objective=flow the same backbone trained as SiT
-- (Ma et al. 2024: flow matching, linear path, velocity prediction, sampled by the ODE): the posteriors `runner data encode` writes (a new
-- latent drawn from each image's posterior at every read, its labels beside it), or any .npy of [N, 4, 32, 32]
-- float latents (already scaled) with int64 labels [N]. Learned sigma, linear schedule of 1000 steps, AdamW at
-- 1e-4 without weight decay, EMA 0.9999, label dropout 0.1 for classifier-free guidance; samples are drawn with
-- guidance in the latent space and saved as raw latents (.safetensors) and as a grid: decoded to images with
-- vae=DIR, else their first three channels.
-- Fine-tuning starts from a state dict (init=, e.g. the official DiT-XL-2-256x256.pt); FID against reference
-- statistics is logged every fid_every steps (fid, fid_seconds) and ranks the checkpoints kept. Data parallel:
-- rank 0 alone draws the samples and FID while the other ranks wait at their next step, for at most
-- RUNNER_DIST_TIMEOUT seconds (raise it for large fid_samples).
--   runner data encode images/ latents.npy --vae sd-vae-ft-mse --size 256 --flip
--   scripts/run experiments/dit.lua data=latents.npy vae=sd-vae-ft-mse size=DiT-B/2
--   scripts/run experiments/dit.lua data=latents.npy depth=2 hidden=64 heads=2 batch=8 steps=100   (a small try)
--   scripts/run experiments/dit.lua data=latents.npy vae=sd-vae-ft-mse init=DiT-XL-2-256x256.pt lr=2e-5 \
--       fid_every=5000 fid_ref=images.npz fid_weights=pt_inception-2015-12-05-6726825d.pth
local cfg = config({
  data = "",                 -- latents of `runner data encode`, or an .npy of latents [N, C, H, W] (required)
  labels = "",               -- .npy of int64 class labels [N] (for a plain .npy; encoded latents have theirs)
  vae = "",                  -- VAE folder or safetensors file to decode the sample grids with (optional)
  init = "",                 -- weights to start from (.pt / .pth / .safetensors state dict), e.g. an official DiT
  fid_every = 0,             -- log FID every this many steps (0: never; needs vae, fid_ref and fid_weights)
  fid_samples = 1000,        -- EMA samples per FID (the papers use 50000)
  fid_ref = "",              -- reference: .npz statistics (runner data fid-stats) or a folder of images
  fid_weights = "",          -- pytorch-fid's FID Inception weights (pt_inception-2015-12-05-6726825d.pth)
  classes = 1000,
  size = "DiT-XL/2",         -- DiT-S/2 ... DiT-XL/8; depth, hidden, heads and patch override it when > 0
  depth = 0,                 -- transformer blocks (a small model to try things: depth=2 hidden=64 heads=2)
  hidden = 0,                -- hidden width, a multiple of heads
  heads = 0,                 -- attention heads
  patch = 0,                 -- patch side
  steps = 400000,
  batch = 256,
  lr = 1e-4,
  ema = 0.9999,
  class_dropout = 0.1,
  objective = "ddpm",        -- ddpm (DiT's Gaussian diffusion) or flow (SiT's flow matching)
  timesteps = 1000,          -- ddpm
  schedule = "linear",       -- ddpm
  path = "linear",           -- flow: linear, gvp or vp
  flow_prediction = "velocity", -- flow: velocity, noise or score
  time = "uniform",          -- flow: training times uniform or logit_normal
  guidance = 4.0,            -- classifier-free guidance scale for the samples
  sample_steps = 250,        -- steps for the samples (ddpm: DDPM; flow: the ODE's Euler steps)
  sample_every = 50000,
  sample_classes = { 207, 360, 387, 974, 88, 979, 417, 279 },
  checkpoint = false,        -- activation checkpointing (less memory, about a third more compute)
  log_every = 100,
  checkpoint_every = 10000,  -- save a resumable checkpoint every this many steps (and at the end)
  amp = "auto",              -- bf16 autocast on GPUs, fp32 on the CPU (or bf16, fp16, fp32; fp8 on Ada/Hopper GPUs)
  seed = 0,
  device = "auto",
  shard = "none",            -- with --nproc N: "optimizer" or "gradients" keeps a 1/N share of the state per rank
  graph = true,              -- on CUDA, replay each training step from a CUDA graph (steps that cannot be captured,
                             -- e.g. with activation checkpointing or data parallel, run eagerly)
  workers = -1,
}, { fid_every = { min = 0 }, sample_every = { min = 1 }, log_every = { min = 1 }, checkpoint_every = { min = 1 } })
local manifest = cfg.data:gsub("%.npy$", "") .. ".json"
local encoded = cfg.data ~= "" and io.open(manifest) ~= nil
if cfg.data == "" or (not encoded and cfg.labels == "") then
  runner.usage_error("give the latents: data=latents.npy from runner data encode, or data=latents.npy labels=labels.npy")
end
-- The arguments are checked before the run starts: a mistake in them leaves no run behind.
for _, key in ipairs { "data", "labels", "vae", "init", "fid_ref", "fid_weights" } do
  local file = cfg[key] ~= "" and io.open(cfg[key]) or nil  -- a folder opens too
  if file then file:close() end
  if cfg[key] ~= "" and not file then runner.usage_error(string.format("%s=%s: no such file or folder", key, cfg[key])) end
end
if cfg.fid_every > 0 and (cfg.vae == "" or cfg.fid_ref == "" or cfg.fid_weights == "") then
  runner.usage_error("fid_every needs vae=, fid_ref= (statistics .npz or image folder) and fid_weights=")
end
local preset, size_error = nn.dit_size(cfg.size)
if not preset then runner.usage_error("size=" .. cfg.size .. ": " .. size_error) end
local architecture = {}  -- the size's depth, hidden, heads and patch, each overridden by its key when > 0
for _, key in ipairs { "depth", "hidden", "heads", "patch" } do
  if cfg[key] < 0 then runner.usage_error(string.format("%s=%d: give a positive number (0: the size's)", key, cfg[key])) end
  architecture[key] = cfg[key] > 0 and cfg[key] or preset[key]
end
if architecture.hidden % architecture.heads ~= 0 then
  runner.usage_error(string.format("hidden=%d is not a multiple of heads=%d", architecture.hidden, architecture.heads))
end
local preset_kept = architecture.depth == preset.depth and architecture.hidden == preset.hidden and
                    architecture.heads == preset.heads and architecture.patch == preset.patch
local model_name = preset_kept and cfg.size or string.format("DiT (depth %d, hidden %d, heads %d, patch %d)",
  architecture.depth, architecture.hidden, architecture.heads, architecture.patch)
local diffusion
if cfg.objective == "ddpm" then
  diffusion = runner.diffusion.gaussian { timesteps = cfg.timesteps, schedule = cfg.schedule, seed = cfg.seed }
elseif cfg.objective == "flow" then
  diffusion = runner.diffusion.flow { path = cfg.path, prediction = cfg.flow_prediction, time = cfg.time, seed = cfg.seed }
else
  runner.usage_error(string.format("objective must be ddpm or flow, got '%s'", cfg.objective))
end
-- Guided EMA samples of `labels`: DDPM's ancestral sampler, or the flow's ODE.
local function draw_samples(model, labels, seed)
  return diffusion:sample(model, { labels = labels, guidance = cfg.guidance, steps = cfg.sample_steps, seed = seed,
                                   sampler = cfg.objective == "ddpm" and "ddpm" or "euler" })
end

local amp_ok, amp_problem = pcall(runner.precision, cfg.amp, cfg.device)  -- refused before a run is recorded
if not amp_ok then runner.usage_error(amp_problem) end

local run = runner.start(cfg)  -- seeds every generator from cfg.seed, picks the device, opens runs/<name>/
local device = run.device

local latents = encoded and runner.data.latents { path = cfg.data } or runner.data.npy { path = cfg.data, labels = cfg.labels }
local vae = cfg.vae ~= "" and nn.AutoencoderKL.load(cfg.vae):to(device) or nil
local scale, shift = vae and vae:info().scaling_factor, vae and vae:info().shift_factor or 0
local shape = latents:get(1).shape
local loader_options = { batch = cfg.batch, shuffle = true, drop_last = true, seed = cfg.seed, device = device }
if cfg.workers >= 0 then loader_options.workers = cfg.workers end
local loader = runner.data.loader(latents, loader_options)

local function make_model()
  local dit = nn.DiT { depth = architecture.depth, hidden = architecture.hidden, heads = architecture.heads,
                       patch = architecture.patch, image = shape[3], in_channels = shape[1], classes = cfg.classes,
                       class_dropout = cfg.class_dropout, learn_sigma = true, checkpoint = cfg.checkpoint }
  if cfg.init ~= "" then dit:load(cfg.init) end  -- a resumed run's checkpoint replaces these weights
  return dit:to(device)
end
local model = make_model()
-- AdamW (fused on CUDA) under bf16 autocast on GPUs, with an EMA copy for sampling, each step in C++.
local train = runner.trainer { model = model, optimizer = { "adamw", lr = cfg.lr, weight_decay = 0 },
                               objective = diffusion:objective(model), ema = cfg.ema,
                               ema_model = make_model(), amp = cfg.amp, steps = cfg.steps, batch = cfg.batch,
                               progress = false, graph = cfg.graph and "auto" or false, shard = cfg.shard }
-- Continues from the latest good checkpoint when the run was interrupted.
run:restore { trainer = train, loader = loader, state = { diffusion = diffusion },
              keep_best = cfg.fid_every > 0 and 1 or 0, metric = "fid" }
print(model)
print(string.format("%s: %.1fM parameters on %s; %s", model_name, model:num_parameters() / 1e6, device, tostring(latents)))

local function write_samples(step)
  local labels = {}
  for i, class in ipairs(cfg.sample_classes) do labels[i] = class % cfg.classes end
  local samples = draw_samples(train.ema, labels, cfg.seed)
  local stem = string.format("%s/samples-%07d", run.dir, step)
  torch.save({ latents = samples, labels = torch.tensor(labels, { dtype = "int64" }) }, stem .. ".safetensors")
  if vae then
    local images = torch.no_grad(function() return vae:decode(samples:to(device) / scale + shift) end)
    run:images("samples", images:clamp(-1, 1))
  else
    run:images("samples", samples:narrow(2, 1, math.min(3, shape[1])), { range = { -2, 2 } })
  end
  print(string.format("step %7d  EMA samples (guidance %.1f): %s.safetensors", step, cfg.guidance, stem))
end

-- FID of fid_samples EMA samples (every class in turn, the grid's guidance), decoded by the VAE, in batches.
local function evaluate_fid(step)
  local began = runner.clock()
  local images, done = {}, 0
  while done < cfg.fid_samples do
    local n = math.min(cfg.batch, cfg.fid_samples - done)
    local labels = {}
    for i = 1, n do labels[i] = (done + i - 1) % cfg.classes end
    local latents = draw_samples(train.ema, labels, cfg.seed + step + done)
    images[#images + 1] = torch.no_grad(function() return vae:decode(latents:to(device) / scale + shift):clamp(-1, 1):cpu() end)
    done = done + n
  end
  local fid = runner.eval.fid(torch.cat(images, 1), cfg.fid_ref, { weights = cfg.fid_weights, device = device })
  local seconds = runner.clock() - began
  run:log { fid = fid, fid_seconds = seconds }
  print(string.format("step %7d  FID %.2f of %d EMA samples (%.0f s)", step, fid, cfg.fid_samples, seconds))
  return fid
end

local main = runner.dist.is_main
local start = runner.clock()
local first = run.step
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(batch)
  local step = run.step
  run:log { loss = out.loss }
  if step == first + 1 or step % cfg.log_every == 0 or step == cfg.steps then
    local elapsed = runner.clock() - start
    print(string.format("step %7d  loss %.4f  %.1f img/s", step, out.loss:item(), (step - first) * cfg.batch / elapsed))
  end
  -- Samples and FID on rank 0 only (the other ranks wait for it at their next step); every rank checkpoints, and
  -- every rank reads the EMA model first (with shard, reading it gathers it from every rank).
  local fid_step = cfg.fid_every > 0 and (step % cfg.fid_every == 0 or step == cfg.steps)
  local sample_step = step % cfg.sample_every == 0 or step == cfg.steps
  if fid_step or sample_step then local _ = train.ema end
  local fid = fid_step and main and evaluate_fid(step) or nil
  if step % cfg.checkpoint_every == 0 or fid_step then run:checkpoint { value = fid } end
  if main and sample_step then write_samples(step) end
end
run:checkpoint { wait = true }
local ema = train.ema  -- on every rank (gathered with shard); rank 0 writes it
if main then
  ema:save(run.dir .. "/ema.safetensors", { size = model_name, steps = tostring(cfg.steps) })
  print(string.format("done in %.0f s; EMA weights in %s/ema.safetensors", runner.clock() - start, run.dir))
end
