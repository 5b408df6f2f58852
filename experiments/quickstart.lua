-- Quickstart: a tiny denoising model in Lua, trained on 2-D points it generates itself.
-- Points lie on a ring; the model learns to predict the noise added to them at a random noise level,
-- the training objective of DDPM, in miniature. Runs in well under a minute on a laptop CPU.
--   scripts/run experiments/quickstart.lua steps=1000 lr=3e-3
local cfg = config {
  steps = 600,      -- optimizer steps
  batch = 256,      -- points per step
  hidden = 128,     -- width of the MLP
  lr = 2e-3,        -- AdamW learning rate
  seed = 0,
  device = "auto",  -- cpu, cuda, cuda:N or auto
  log_every = 50,
}

torch.manual_seed(cfg.seed)
local device = torch.device(cfg.device)

-- Data: points on the unit circle, with a little jitter.
local function sample_points(n)
  local angle = torch.rand(n, 1, { device = device }) * (2 * math.pi)
  local points = torch.cat({ angle:cos(), angle:sin() }, 2)
  return points + torch.randn(n, 2, { device = device }) * 0.02
end

-- Model: an MLP on (noisy point, noise level) that predicts the noise.
local Denoiser = nn.Module("Denoiser")

function Denoiser:init(hidden)
  self.net = nn.Sequential(
    nn.Linear(3, hidden), nn.SiLU(),
    nn.Linear(hidden, hidden), nn.SiLU(),
    nn.Linear(hidden, 2))
end

function Denoiser:forward(x, t)
  return self.net(torch.cat({ x, t }, 2))
end

local model = Denoiser(cfg.hidden):to(device)
local opt = optim.AdamW(model, { lr = cfg.lr, weight_decay = 0.0 })
print(model)
print(string.format("%d parameters on %s", model:num_parameters(), device))

local start = runner.clock()
local running, count = 0, 0
for step = 1, cfg.steps do
  local x0 = sample_points(cfg.batch)
  local t = torch.rand(cfg.batch, 1, { device = device })
  local noise = torch.randn_like(x0)
  -- Variance-preserving noising: x_t = sqrt(1 - t) * x0 + sqrt(t) * noise
  local xt = x0 * (1 - t):sqrt() + noise * t:sqrt()
  local loss = nn.functional.mse_loss(model(xt, t), noise)
  opt:zero_grad()
  loss:backward()
  opt:step()
  running, count = running + loss:item(), count + 1
  if step == 1 or step % cfg.log_every == 0 or step == cfg.steps then
    local elapsed = runner.clock() - start
    print(string.format("step %5d  loss %.4f  (%.0f steps/s)", step, running / count, step / elapsed))
    running, count = 0, 0
  end
end
