-- Quickstart: a small DDPM UNet learns to draw the built-in `shapes` images (16x16 circles, squares and
-- triangles) in three to four minutes on a 2-core CPU, faster on a GPU with the same script. It prints the
-- loss as it goes, writes sample grids as PNG files and reports a sample-quality number: the sliced
-- Wasserstein distance between generated and real images (lower is better; needs no download).
--   scripts/run experiments/quickstart.lua steps=200 seed=3
local cfg = config {
  steps = 600,             -- optimizer steps
  batch = 64,              -- images per step
  lr = 2e-3,               -- AdamW learning rate
  ema = 0.995,             -- decay of the weight average that samples are drawn from
  image = 16,              -- image side
  channels = 32,           -- UNet base width
  timesteps = 1000,        -- diffusion steps
  schedule = "cosine",     -- noise schedule: linear, cosine or scaled_linear
  prediction = "v",        -- what the model predicts: eps, x0 or v
  sample_steps = 50,       -- DDIM steps when sampling
  sample_every = 300,      -- write a sample grid every this many steps (and at the end)
  metric_samples = 256,    -- generated and real images compared by the quality metric
  seed = 0,
  device = "auto",         -- cpu, cuda, cuda:N or auto
  log_every = 50,
  out = "quickstart",      -- folder for the sample grids
}

torch.manual_seed(cfg.seed)
local device = torch.device(cfg.device)
os.execute(string.format("mkdir -p '%s'", cfg.out))

local shapes = runner.data.shapes { size = cfg.image, count = 50000, seed = cfg.seed }
local loader = runner.data.loader(shapes, { batch = cfg.batch, shuffle = true, seed = cfg.seed, device = device })

local function make_model()
  return nn.UNet { image = cfg.image, channels = cfg.channels, mults = { 1, 2, 2 }, blocks = 1, attention = { 8 },
                   dropout = 0, groups = 8 }
end
local model = make_model():to(device)
local ema = make_model():to(device)
ema:load_state_dict(model:state_dict())
local ddpm = runner.diffusion.gaussian { timesteps = cfg.timesteps, schedule = cfg.schedule, prediction = cfg.prediction,
                                         seed = cfg.seed }
local opt = optim.AdamW(model, { lr = cfg.lr, weight_decay = 0 })
print(model)
print(string.format("%.2fM parameters on %s; %d steps of batch %d", model:num_parameters() / 1e6, device, cfg.steps, cfg.batch))

-- Real images the metric compares against: shapes the model never trains on (another seed).
local held_out = runner.data.shapes { size = cfg.image, count = cfg.metric_samples, seed = cfg.seed + 1000003 }
local real = runner.data.loader(held_out, { batch = cfg.metric_samples }):next().data
runner.save_grid(cfg.out .. "/real.png", real:narrow(1, 1, 64))

local function evaluate(step)
  local samples = ddpm:sample(ema, { n = cfg.metric_samples, steps = cfg.sample_steps, seed = cfg.seed })
  local path = string.format("%s/samples-%06d.png", cfg.out, step)
  runner.save_grid(path, samples:narrow(1, 1, 64))
  local distance = runner.eval.sliced_wasserstein(samples, real)
  print(string.format("step %5d  samples: %s  sliced Wasserstein to real shapes: %.4f", step, path, distance))
  return distance
end

local start = runner.clock()
local running, count = 0, 0
local distance
for batch in loader:iter { from = 0, to = cfg.steps } do
  local loss = ddpm:loss(model, batch)
  opt:zero_grad()
  loss:backward()
  opt:step()
  nn.ema_update(ema, model, cfg.ema)
  running, count = running + loss:item(), count + 1
  local step = batch.step
  if step == 1 or step % cfg.log_every == 0 or step == cfg.steps then
    local elapsed = runner.clock() - start
    print(string.format("step %5d  loss %.4f  %.1f steps/s  %.0f s", step, running / count, step / elapsed, elapsed))
    running, count = 0, 0
  end
  if step % cfg.sample_every == 0 and step ~= cfg.steps then evaluate(step) end
end
distance = evaluate(cfg.steps)
print(string.format("sample quality (sliced Wasserstein distance to real shapes, lower is better): %.4f", distance))
print(string.format("done in %.0f s; sample grids in %s/", runner.clock() - start, cfg.out))
