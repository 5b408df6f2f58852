-- FP8 against bf16 (bench/fp8_curve.py): a DiT's loss curve on shapes latents; resume_at=K stops there, run again resumes
local cfg = config {
  amp = "bf16",              -- bf16, or fp8 (CUDA of compute capability 8.9 and up), or fp32
  steps = 1000,              -- optimizer steps
  resume_at = 0,             -- stop after this step (run:stop: a checkpoint, the run interrupted); the same command
                             -- again continues the run to the end (0: no stop)
  size = "DiT-S/2",          -- the DiT preset; depth, hidden and heads override it when > 0
  depth = 0,
  hidden = 0,
  heads = 0,
  batch = 128,
  lr = 1e-4,                 -- AdamW, no weight decay (the DiT recipe)
  ema = 0.9999,
  every = 50,                -- the curve: mean loss per this many steps
  last = 100,                -- the final loss: mean over the last this many steps
  images = 50000,            -- shapes images in the training set (64x64, random colours and rotations)
  fused = false,             -- nn.DiT { fused = true }
  cast_weights_once = false, -- runner.trainer { cast_weights_once = true }
  graph = true,              -- on CUDA, steps replayed from a CUDA graph (graph = "auto"); no effect on the CPU
  deterministic = false,     -- the trainer's deterministic algorithms (bit-identical resumes on CUDA)
  workers = -1,              -- loader threads (-1: the loader's default)
  run_name = "",             -- the run's name (default fp8_curve-N)
  seed = 0,
  device = "auto",
}
-- Checked before runner.start, so that a mistake starts no run.
local preset, size_error = nn.dit_size(cfg.size)
if not preset then runner.usage_error("size=" .. cfg.size .. ": " .. size_error) end
local architecture = {}
for _, key in ipairs { "depth", "hidden", "heads" } do
  architecture[key] = cfg[key] > 0 and cfg[key] or preset[key]
end
if architecture.hidden % architecture.heads ~= 0 then
  runner.usage_error(string.format("hidden=%d is not a multiple of heads=%d", architecture.hidden, architecture.heads))
end
if cfg.steps < 1 or cfg.every < 1 or cfg.last < 1 or cfg.batch < 1 then
  runner.usage_error("steps, every, last and batch must be positive")
end
if cfg.resume_at < 0 or cfg.resume_at >= cfg.steps then
  runner.usage_error(string.format("resume_at=%d: give a step before steps=%d (0: no stop)", cfg.resume_at, cfg.steps))
end

-- The latents: a 64x64 RGB shapes image, each 2x2 pixel block (12 values) taken to 4 channels by a fixed random
-- projection (no VAE weights needed: a stand-in for a VAE encoder's 32x32x4 latents), scaled to unit
-- standard deviation over the first 256 images. The projection comes from its own generator (Park-Miller with
-- Box-Muller), so that it touches no RNG stream of the run.
local LATENT_CHANNELS, PATCH, SIDE = 4, 2, 64
local function projection_matrix()
  local state = 20261127
  local function uniform()
    state = state * 16807 % 2147483647
    return state / 2147483647
  end
  local rows = {}
  for i = 1, LATENT_CHANNELS do
    rows[i] = {}
    for j = 1, 3 * PATCH * PATCH do
      local normal = math.sqrt(-2 * math.log(uniform())) * math.cos(2 * math.pi * uniform())
      rows[i][j] = normal / math.sqrt(3 * PATCH * PATCH)
    end
  end
  return torch.tensor(rows)
end
local projection = projection_matrix()
local function project(images, weights)  -- [B, 3, 64, 64] in [-1, 1] -> [B, 4, 32, 32], unscaled
  local b, side = images.shape[1], SIDE / PATCH
  local blocks = images:reshape(b, 3, side, PATCH, side, PATCH):permute(1, 2, 4, 6, 3, 5)
  return weights:matmul(blocks:reshape(b, 3 * PATCH * PATCH, side * side)):reshape(b, LATENT_CHANNELS, side, side)
end
local function shapes_data(count)
  return runner.data.shapes { size = SIDE, count = count, seed = cfg.seed }
end
local latent_scale
do
  local sample = shapes_data(256)
  local images = {}
  for i = 1, #sample do images[i] = sample:get(i) end
  latent_scale = 1 / project(torch.stack(images, 1):float() / 127.5 - 1, projection):std():item()
end

local diffusion = runner.diffusion.gaussian { timesteps = 1000, schedule = "linear", seed = cfg.seed }
local run = runner.start(cfg, { name = cfg.run_name ~= "" and cfg.run_name or nil })
local device = run.device
local on_cuda = tostring(device):find("^cuda") ~= nil
local shapes = shapes_data(cfg.images)
local loader_options = { batch = cfg.batch, shuffle = true, drop_last = true, seed = cfg.seed, device = device }
if cfg.workers >= 0 then loader_options.workers = cfg.workers end
local loader = runner.data.loader(shapes, loader_options)
local weights = projection:to(device)
local function latents(batch)
  return { data = project(batch.data, weights) * latent_scale, label = batch.label }
end

local model = nn.DiT { depth = architecture.depth, hidden = architecture.hidden, heads = architecture.heads,
                       patch = preset.patch, image = SIDE / PATCH, in_channels = LATENT_CHANNELS, classes = 3,
                       learn_sigma = true, fused = cfg.fused }:to(device)
local train = runner.trainer { model = model, optimizer = { "adamw", lr = cfg.lr, weight_decay = 0 }, clip = 1.0,
                               objective = diffusion:objective(model), ema = cfg.ema, amp = cfg.amp,
                               cast_weights_once = cfg.cast_weights_once, deterministic = cfg.deterministic,
                               graph = cfg.graph and "auto" or false, steps = cfg.steps, batch = cfg.batch,
                               progress = false }
run:restore { trainer = train, loader = loader, state = { diffusion = diffusion } }
local first = run.step
print(string.format("DiT (depth %d, hidden %d, heads %d, patch %d), %.1fM parameters, %s on %s; %d steps of batch %d "
  .. "from step %d; latents 32x32x4 of 64x64 shapes (fixed random projection, scale %.4f)", architecture.depth,
  architecture.hidden, architecture.heads, preset.patch, model:num_parameters() / 1e6, train:precision(), device,
  cfg.steps, cfg.batch, first, latent_scale))

local start = runner.clock()
for batch in loader:iter { from = run.step, to = cfg.steps } do
  local out = train:step(latents(batch))
  run:log { loss = out.loss }
  if run:every(cfg.every) then
    print(string.format("step %5d  loss %.4f  %.1f img/s", run.step, out.loss:item(),
      (run.step - first) * cfg.batch / (runner.clock() - start)))
  end
  if run.step == cfg.resume_at then
    print(string.format("stopping at step %d (resume_at): the same command again continues the run", run.step))
    run:stop()  -- a checkpoint of this step, the run interrupted, exit 0 at the next batch
  end
end
if on_cuda then torch.cuda.synchronize() end
local seconds = runner.clock() - start
run:checkpoint { wait = true }
run:flush()

-- The whole run's losses from the index (every attempt's, one series), in float64 as logged.
local rows = runner.query("SELECT m.step AS step, m.value AS value FROM metrics m JOIN runs r USING (run) "
  .. "WHERE r.id = ? AND m.key = 'loss' ORDER BY m.step", run.id)
if #rows ~= cfg.steps then error(string.format("the index holds %d loss values of %d steps", #rows, cfg.steps)) end
local losses = {}
for i, row in ipairs(rows) do
  if row.step ~= i then error(string.format("loss of step %d missing from the index", i)) end
  losses[i] = row.value or 0 / 0  -- NULL is NaN
end
local function mean(from, to)
  local sum = 0
  for i = from, to do sum = sum + losses[i] end
  return sum / (to - from + 1)
end
local function json_number(value) return value ~= value and "null" or string.format("%.17g", value) end
local curve = {}
for from = 1, cfg.steps, cfg.every do
  local to = math.min(from + cfg.every - 1, cfg.steps)
  curve[#curve + 1] = string.format('{"steps": [%d, %d], "loss": %s}', from, to, json_number(mean(from, to)))
  print(string.format("steps %5d-%5d  mean loss %.5f", from, to, mean(from, to)))
end
local last = math.min(cfg.last, cfg.steps)
local final = mean(cfg.steps - last + 1, cfg.steps)
local graphs = train:graphs()
local step_losses = {}
for i, value in ipairs(losses) do step_losses[i] = json_number(value) end
print(string.format("final loss (mean of steps %d-%d): %.5f", cfg.steps - last + 1, cfg.steps, final))
print(string.format('RESULT {"amp": "%s", "precision": "%s", "steps": %d, "batch": %d, "size": "%s", "depth": %d, '
  .. '"hidden": %d, "heads": %d, "parameters": %d, "resume_at": %d, "start_step": %d, "resumed": %s, '
  .. '"final_loss": %s, "final_steps": %d, "every": %d, "curve": [%s], "losses": [%s], "seconds": %.4f, '
  .. '"images_per_s": %.4f, "device": "%s", "fused": %s, "cast_weights_once": %s, "deterministic": %s, '
  .. '"graphs_captured": %d, "graphs_replayed": %d, "latent_scale": %.17g, "run": "%s", "run_id": "%s", '
  .. '"run_dir": "%s", "checkpoint": "%s"}',
  cfg.amp, train:precision(), cfg.steps, cfg.batch, cfg.size, architecture.depth, architecture.hidden,
  architecture.heads, model:num_parameters(), cfg.resume_at, first, tostring(run.resumed and true or false),
  json_number(final), last, cfg.every, table.concat(curve, ", "),
  table.concat(step_losses, ", "),
  seconds, (cfg.steps - first) * cfg.batch / seconds, tostring(device), tostring(cfg.fused),
  tostring(cfg.cast_weights_once), tostring(cfg.deterministic), graphs.captured or 0, graphs.replayed or 0,
  latent_scale, run.name, run.id, run.dir, string.format("%s/checkpoints/step-%07d", run.dir, cfg.steps)))
