-- Spec: runner.diffusion.flow (SiT's flow matching) against the independent Python reference (tests/reference/
-- transport.py): the training loss of every path, prediction and weighting, the ODE and SDE trajectories; the keyed
-- training draws, the trainer objective, the options and their errors.
-- Everything runs on the CPU in float32 (the reference cases are CPU float32).
local reference = dofile("tests/lua/reference_cases.lua")
local literal = reference.literal
torch.set_num_threads(1)

local function int64(list)
  return torch.tensor(list, { dtype = "int64" })
end

local checks = dofile("tests/lua/objective_checks.lua")
local random_unet = checks.random_unet

describe("training loss against the reference", function()
  local L, meta = reference.load("flow/losses.safetensors")
  local cases = literal(meta.cases)

  it("the reference holds every path x prediction x weighting (velocity unweighted): 21 cases", function()
    expect_eq(#cases, 21)
  end)

  -- Both sides evaluate the coefficients in float64 at the float32 times and compute the loss in float32:
  -- 1e-5 relative (about 100 float32 ulps). The weighted losses reach 1e8 at t = 0.999 of the vp path, still
  -- relative. x_t has elements near 0, so it also gets 1e-6 absolute.
  for _, case in ipairs(cases) do
    it(case .. ": the model's input, the loss and the per-sample weighted errors equal the reference", function()
      local path, prediction, weight = case:match("^(%w+)%.(%w+)%.(%w+)$")
      local flow = runner.diffusion.flow { path = path, prediction = prediction,
                                           loss_weight = weight ~= "none" and weight or nil, seed = 0 }
      local seen
      local loss, mse = flow:training_loss(function(x, t, labels)
        seen = { x = x, t = t, labels = labels }
        return L.out
      end, L.x1, L.t, L.noise)
      expect_close(seen.x, L["x_t." .. path], 1e-6, 1e-5, case .. ": x_t")
      expect_true(seen.t:equal(L.t), case .. ": the model gets t as it is (SiT's float times, no x1000)")
      expect_eq(seen.labels, nil, case .. ": no labels")
      expect_eq(loss:dim(), 0, case .. ": the loss is a scalar")
      expect_close(loss, L["loss." .. case], 0, 1e-5, "loss." .. case)
      expect_close(mse, L["mse." .. case], 0, 1e-5, "mse." .. case)
    end)
  end

  it("a learned-sigma output (2C channels) is scored on its first C channels, as SiT's model drops the rest", function()
    local flow = runner.diffusion.flow { seed = 0 }
    local with_sigma = torch.cat({ L.out, torch.randn(L.out.shape) }, 2)
    local loss = flow:training_loss(function() return with_sigma end, L.x1, L.t, L.noise)
    expect_close(loss, L["loss.linear.velocity.none"], 0, 1e-5, "loss")
  end)
end)

describe("keyed training draws", function()
  local options = { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, dropout = 0,
                    classes = 3, class_dropout = 0.5 }
  torch.manual_seed(11)
  local data = torch.randn(8, 3, 8, 8)
  local labels = int64({ 0, 1, 2, 0, 1, 2, 0, 1 })
  local indices = int64({ 5, 9, 2, 44, 7, 1, 30, 12 })

  it("a loader batch split in two gives every sample the same time, noise, label dropout and error", function()
    local model = random_unet(options, 3)
    local flow = runner.diffusion.flow { prediction = "noise", seed = 7 }
    local _, whole = flow:loss(model, { data = data, label = labels, index = indices, epoch = 2 })
    local function half(from, to)
      return { data = data[{ { from, to } }], label = labels[{ { from, to } }], index = indices[{ { from, to } }], epoch = 2 }
    end
    local _, a = flow:loss(model, half(1, 4))
    local _, b = flow:loss(model, half(5, 8))
    expect_true(torch.cat({ a.t, b.t }):equal(whole.t), "times")
    expect_close(torch.cat({ a.mse, b.mse }), whole.mse, 0, 1e-6, "per-sample errors")
    expect_eq(whole.t.dtype, "float64")
    expect_true(whole.t:ge(1e-3):all():item() and whole.t:le(1 - 1e-3):all():item(),
      "noise prediction trains in [train_eps, 1 - train_eps]")
  end)

  it("training times fill [train_eps, 1 - train_eps] and never leave it, over thousands of draws", function()
    local model = random_unet(options, 3)
    local n = 4096
    local x = torch.randn(n, 3, 8, 8)
    local batch = { data = x, label = torch.zeros({ n }, { dtype = "int64" }), index = torch.arange(n), epoch = 1 }
    for _, case in ipairs { { "noise", 0.1 }, { "velocity", 0 } } do
      local prediction, eps = case[1], case[2]
      local _, details = runner.diffusion.flow { prediction = prediction, train_eps = eps, seed = 3 }:loss(model, batch)
      local low, high = details.t:min():item(), details.t:max():item()
      -- 4096 uniform draws: the extremes lie within 0.005 of the bounds with probability 1 - 2e-9.
      expect_true(low >= eps and high <= 1 - eps, string.format("%s: times in [%g, %g], drawn [%g, %g]", prediction,
        eps, 1 - eps, low, high))
      expect_true(low < eps + 0.005 and high > 1 - eps - 0.005, string.format("%s: the draws fill [%g, %g], drawn "
        .. "[%g, %g]", prediction, eps, 1 - eps, low, high))
    end
  end)

  it("times follow the diffusion objective's keyed uniform draw: t = u over [0, 1] for velocity on the linear path", function()
    local flow = runner.diffusion.flow { seed = 5 }
    local d = runner.diffusion.gaussian { timesteps = 1000, seed = 5 }
    local model = function(x) return x * 0 end
    local _, details = flow:loss(model, { data = data, index = indices, epoch = 1 })
    local _, ddpm = d:loss(model, { data = data, index = indices, epoch = 1 })
    expect_true((details.t * 1000):floor():long():equal(ddpm.t), "floor(1000 t) is the DDPM timestep of the same key")
  end)

  it("logit_normal times are 1 - sigmoid(mean + std n): the rectified-flow noise level turned into SiT's time", function()
    local flow = runner.diffusion.flow { time = "logit_normal", logit_mean = 0.5, seed = 5 }
    local d = runner.diffusion.gaussian { timesteps = 1000000, timestep_sampling = "logit_normal", logit_mean = 0.5,
                                          seed = 5 }
    local model = function(x) return x * 0 end
    local _, details = flow:loss(model, { data = data, index = indices, epoch = 1 })
    local _, ddpm = d:loss(model, { data = data, index = indices, epoch = 1 })
    expect_true(((1 - details.t) * 1000000):floor():long():equal(ddpm.t), "1 - t is the logit-normal noise level")
    local many = torch.zeros(4096, 1, 1, 1)
    local _, spread = flow:loss(model, many)
    -- E[sigmoid(0.5 + n)] is about 0.604 (the probit approximation), so the mean time is about 0.396 (standard error
    -- 0.003 over 4096 draws): logit_mean > 0 trains at more noise.
    local mean = spread.t:mean():item()
    expect_true(mean > 0.37 and mean < 0.42, "mean time " .. mean .. " in (0.37, 0.42)")
  end)

  it("tensor batches draw from a running counter; state() and load_state() continue it", function()
    local flow = runner.diffusion.flow { seed = 1 }
    local model = function(x) return x * 0 end
    flow:loss(model, data)
    expect_eq(flow:state().stream_counter, 8)
    local _, next_draw = flow:loss(model, data)
    local other = runner.diffusion.flow { seed = 1 }
    other:load_state({ stream_counter = 8, stream_generator = flow:state().stream_generator })
    local _, resumed = other:loss(model, data)
    expect_true(resumed.t:equal(next_draw.t), "the resumed flow draws what the original would")
  end)
end)

describe("the flow objective", function()
  local options = { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, dropout = 0,
                    classes = 3, class_dropout = 0.3 }
  torch.manual_seed(22)
  local data = torch.randn(8, 3, 8, 8)
  local labels = int64({ 0, 1, 2, 0, 1, 2, 0, 1 })
  local indices = int64({ 5, 9, 2, 44, 7, 1, 30, 12 })

  it("train:step(batch) gives the loss function form's losses and weights bit for bit (accumulate 2, labels dropped)", function()
    checks.objective_steps_as_its_loss_function(function()
      return runner.diffusion.flow { seed = 9, time = "logit_normal" }
    end, options, { data = data, label = labels, index = indices })
  end)

  it("says what it computes and refuses what it cannot run", function()
    local unet = nn.UNet(options)
    local flow = runner.diffusion.flow { path = "gvp", prediction = "noise", loss_weight = "likelihood" }
    expect_eq(tostring(flow:objective(unet)),
      "Objective(flow matching (gvp path, noise prediction, likelihood weighting, uniform times, 3 classes, label "
      .. "dropout 0.3))")
    expect_error(function() flow:objective(function(x) return x end) end,
      here(-1) .. "objective: the model must be a built-in denoiser (nn.UNet, nn.DiT); for another model give the "
      .. "trainer a loss function: train:step(batch, function(micro) return flow:loss(model, micro) end)")
  end)
end)

describe("options", function()
  it("info() reports the settings with SiT's default eps", function()
    local info = runner.diffusion.flow { path = "vp", prediction = "score", seed = 3 }:info()
    expect_eq(info.objective, "flow")
    expect_eq(info.path, "vp")
    expect_eq(info.prediction, "score")
    expect_eq(info.loss_weight, "none")
    expect_eq(info.time, "uniform")
    expect_eq(info.train_eps, 1e-5)
    expect_eq(info.sample_eps, 1e-3)
    expect_eq(info.seed, 3)
    local velocity = runner.diffusion.flow {}:info()
    expect_eq(velocity.train_eps, 0)
    expect_eq(velocity.sample_eps, 0)
    local noise = runner.diffusion.flow { prediction = "noise", train_eps = 0.01 }:info()
    expect_eq(noise.train_eps, 0.01)
    expect_eq(noise.sample_eps, 1e-3)
  end)

  it("path(t) gives alpha, sigma and their derivatives", function()
    local t = torch.tensor({ 0.25, 0.5 }, { dtype = "float64" })
    local linear = runner.diffusion.flow { path = "linear" }:path(t)
    expect_close(linear.alpha, t, 0, 0, "linear alpha = t")
    expect_close(linear.sigma, 1 - t, 0, 0, "linear sigma = 1 - t")
    local gvp = runner.diffusion.flow { path = "gvp" }:path(t)
    expect_close(gvp.alpha * gvp.alpha + gvp.sigma * gvp.sigma, torch.ones(2, { dtype = "float64" }), 1e-15, 0,
      "gvp: alpha^2 + sigma^2 = 1")
  end)

  it("reports bad options with exact texts", function()
    expect_error(function() runner.diffusion.flow { path = "cosine" } end,
      here(-1) .. "path must be \"linear\", \"gvp\" or \"vp\", got \"cosine\"")
    expect_error(function() runner.diffusion.flow { prediction = "eps" } end,
      here(-1) .. "prediction must be \"velocity\", \"noise\" or \"score\", got \"eps\"")
    expect_error(function() runner.diffusion.flow { loss_weight = "velocity" } end,
      here(-1) .. "loss_weight \"velocity\" applies to noise and score predictions; the velocity loss is unweighted "
      .. "(as SiT's)")
    expect_error(function() runner.diffusion.flow { time = "cosine" } end,
      here(-1) .. "time must be \"uniform\" or \"logit_normal\", got \"cosine\"")
    expect_error(function() runner.diffusion.flow { logit_mean = 1 } end,
      here(-1) .. "logit_mean and logit_std shape time = \"logit_normal\"; it is \"uniform\"")
    expect_error(function() runner.diffusion.flow { train_eps = 0.5 } end,
      here(-1) .. "train_eps must be in [0, 0.5), got 0.5")
    expect_error(function() runner.diffusion.flow { timesteps = 10 } end,
      "unknown option 'timesteps' to 'diffusion.flow' (known: logit_mean, logit_std, loss_weight, path, prediction, "
      .. "sample_eps, seed, time, train_eps)", true)
  end)
end)

describe("sampler options", function()
  local flow = runner.diffusion.flow { seed = 2 }
  local model = function(x) return x * 0.5 end
  local x_T = torch.randn(2, 3, 4, 4)

  it("reports bad options with exact texts", function()
    expect_error(function() flow:sample(model, { x_T = x_T, sampler = "ddim" }) end,
      here(-1) .. "sampler must be \"euler\", \"heun\" or \"dopri5\", got \"ddim\"")
    expect_error(function() flow:sample(model, { x_T = x_T, sde = true, sampler = "dopri5" }) end,
      here(-1) .. "sampler must be \"euler\", \"heun\" (the SDE's), got \"dopri5\"")
    expect_error(function() flow:sample(model, { x_T = x_T, rtol = 1e-4 }) end,
      here(-1) .. "rtol and atol apply to the adaptive sampler (sampler = \"dopri5\")")
    expect_error(function() flow:sample(model, { x_T = x_T, last_step = "tweedie" }) end,
      here(-1) .. "diffusion_form, diffusion_norm, last_step and last_step_size apply to the SDE sampler (sde = true)")
    expect_error(function() flow:sample(model, { x_T = x_T, sde = true, steps = 1 }) end,
      here(-1) .. "steps must be at least 2 with sde (a step and the last step), got 1")
    expect_error(function() flow:sample(model, { x_T = x_T, steps = 0 }) end, here() .. "steps must be at least 1, got 0")
    expect_error(function() flow:sample(model, { x_T = x_T, sde = true, last_step = "Mean" }) end,
      here(-1) .. "last_step must be \"mean\", \"tweedie\", \"euler\" or \"none\", got \"Mean\"")
    expect_error(function() flow:sample(model, { x_T = x_T, sde = true, diffusion_form = "SBDM" }) end,
      here(-1) .. "diffusion_form must be \"sigma\", \"sbdm\", \"constant\", \"linear\", \"decreasing\" or "
      .. "\"increasing-decreasing\", got \"SBDM\"")
    expect_error(function() flow:sample(model, { x_T = x_T, sde = true, reverse = true }) end,
      here(-1) .. "reverse applies to the ODE sampler (sde = false)")
    expect_error(function() flow:sample(model, { x_T = x_T, guidance = 2 }) end,
      here(-1) .. "guidance 2 needs class labels (classifier-free guidance)")
    -- One mistyped number does not size the memory: the time grid is bounded, and n agrees with x_T.
    expect_error(function() flow:sample(model, { x_T = x_T, steps = 2 ^ 31 }) end,
      here(-1) .. "steps must be at most 1000000, got 2147483648")
    expect_error(function() flow:sample(model, { x_T = x_T, sde = true, steps = 2 ^ 31 }) end,
      here(-1) .. "steps must be at most 1000000, got 2147483648")
    expect_error(function() flow:sample(model, { x_T = x_T, steps = 1000001 }) end,
      here(-1) .. "steps must be at most 1000000, got 1000001")
    expect_error(function() flow:sample(model, { x_T = x_T, n = 4 }) end,
      here(-1) .. "sample: n = 4 but x_T holds 2 samples (give n or x_T, or both alike)")
    expect_eq(flow:sample(model, { x_T = x_T, n = 2, steps = 2 }).shape[1], 2, "n equal to x_T's count")
    expect_error(function() flow:sample(model, { shape = { 3, 4, 4 }, n = -4 }) end,
      here(-1) .. "sample: n must be a whole number of samples >= 1, got -4")
    expect_error(function() flow:sample(model, { x_T = x_T, guidance = -1 }) end,
      here(-1) .. "guidance must be a finite number >= 0 (1: none, 0: unconditional, above 1: towards the labels), got -1")
    expect_error(function() flow:sample(model, { x_T = x_T, guidance_channels = 9 }) end,
      here(-1) .. "guidance_channels = 9 is more than the 3 channels of a sample")
    expect_error(function() flow:sample(model, { x_T = x_T, guidance_channels = 4 }) end,
      here(-1) .. "guidance_channels = 4 is more than the 3 channels of a sample")
  end)

  it("refuses training times outside [0, 1] and likelihood probes that are not signs", function()
    local x1, noise = torch.randn(3, 3, 4, 4), torch.randn(3, 3, 4, 4)
    expect_error(function() flow:training_loss(model, x1, torch.tensor({ 0.5, 1.5, 0 }), noise) end,
      here(-1) .. "training_loss: t must hold times in [0, 1] (0 noise, 1 data), got 1.5")
    expect_error(function() flow:training_loss(model, x1, torch.tensor({ 0.5, -0.25, 0 }), noise) end,
      here(-1) .. "training_loss: t must hold times in [0, 1] (0 noise, 1 data), got -0.25")
    local loss = flow:training_loss(model, x1, torch.tensor({ 0, 0.5, 1 }), noise)
    expect_true(loss:isfinite():item(), "the interval's ends are times")
    local probes = torch.ones(4, 3, 3, 4, 4)
    expect_eq(flow:likelihood(model, x1, { steps = 2, probes = probes }).shape[1], 3, "probes of ones")
    expect_error(function() flow:likelihood(model, x1, { steps = 2, probes = torch.zeros(4, 3, 3, 4, 4) }) end,
      here(-1) .. "likelihood: probes must hold -1 and 1 only (Rademacher probes, as SiT draws them), got 0")
    expect_error(function() flow:likelihood(model, x1, { steps = 2 ^ 31 }) end,
      here(-1) .. "steps must be at most 1000000, got 2147483648")
  end)

  it("the likelihood keeps sampling's label rules", function()
    local x1 = torch.randn(2, 3, 4, 4)
    local conditional = nn.DiT { depth = 1, hidden = 16, heads = 2, patch = 2, image = 4, in_channels = 3, classes = 3 }
    expect_error(function() flow:likelihood(conditional, x1, { steps = 1 }) end,
      here(-1) .. "likelihood: the model is class-conditional (3 classes): give labels")
    local unconditional = nn.DiT { depth = 1, hidden = 16, heads = 2, patch = 2, image = 4, in_channels = 3,
      classes = 0 }
    expect_error(function() flow:likelihood(unconditional, x1, { steps = 1, labels = { 0, 1 } }) end,
      here(-1) .. "likelihood: labels were given but the model is unconditional (build it with classes = N to "
      .. "condition on them)")
  end)

  it("the ODE of a constant velocity field moves x_T by that velocity times the interval, with every sampler", function()
    for _, sampler in ipairs({ "euler", "heun", "dopri5" }) do
      local x = flow:sample(function(x) return torch.ones(x.shape) end, { x_T = x_T, sampler = sampler, steps = 3 })
      expect_close(x, x_T + 1, 1e-5, 0, sampler)
    end
  end)
end)

describe("sampling trajectories against the reference", function()
  local S, meta = reference.load("flow/sampling.safetensors")
  local models = {}
  local function model_for(name)
    models[name] = models[name] or (reference.model(name))
    return models[name]
  end
  local cases = literal(meta.cases)

  it("the reference holds the fourteen cases", function()
    expect_eq(#cases, 14)
  end)

  -- |runner - reference| <= 1e-4 + 1e-4 |reference| elementwise over the whole trajectory: the same float32 steps on
  -- both sides, the coefficients in float64 at float32 times (measured differences below 1e-5; a wrong coefficient,
  -- step or time differs by 1e-2 or more).
  for _, case in ipairs(cases) do
    it(case .. ": the whole trajectory matches", function()
      local s = literal(meta[case])
      local flow = runner.diffusion.flow { path = s.path, prediction = s.prediction, seed = 0 }
      local options = {
        x_T = S[s.x_T], labels = s.labels ~= "none" and S[s.labels] or nil, steps = s.steps, sampler = s.sampler,
        guidance = s.guidance, guidance_channels = s.guidance_channels > 0 and s.guidance_channels or nil,
        noise = s.noise ~= "none" and S[s.noise] or nil, trajectory = true,
      }
      if s.sampler == "dopri5" then options.rtol, options.atol = s.rtol, s.atol end
      if s.reverse then options.reverse = true end
      if s.sde then
        options.sde = true
        options.diffusion_form, options.diffusion_norm = s.diffusion_form, s.diffusion_norm
        options.last_step, options.last_step_size = s.last_step, s.last_step_size
      end
      local x, trajectory = flow:sample(model_for(s.model), options)
      local expected = S[case .. ".trajectory"]
      expect_eq(trajectory.shape[1], s.steps + 1, case .. ": steps + 1 entries")
      expect_true(not expected:isnan():any():item(), case .. ": the reference trajectory is finite")
      if s.sampler == "dopri5" then
        -- Adaptive steps: the error estimate of a step well inside the tolerance is float32 rounding noise, so the
        -- step sizes (and with them the solution) differ from torchdiffeq's within the tolerance. Each solution is
        -- within about one tolerance unit of the true one, so the two agree within a few, in the solver's own norm:
        -- RMS over the batch of |runner - torchdiffeq| / (atol + rtol |torchdiffeq|) <= 3 at every grid time
        -- (measured: at most 2.0, at the end of ode_dopri5, whose last steps overshoot t = 1 and interpolate back).
        for k = 1, expected.shape[1] do
          local units = ((trajectory[k] - expected[k]):abs() / (expected[k]:abs() * s.rtol + s.atol)):pow(2):mean()
            :sqrt():item()
          expect_true(units <= 3, string.format("%s: grid time %d differs by %.2f tolerance units", case, k, units))
        end
      else
        expect_close(trajectory, expected, 1e-4, 1e-4, case .. " trajectory")
      end
      expect_true(x:equal(trajectory[-1]), case .. ": the sample is the trajectory's last entry")
    end)
  end
end)

describe("likelihood against the reference", function()
  local S, meta = reference.load("flow/sampling.safetensors")
  local model = reference.model("unet_uncond")
  local cases = literal(meta.likelihoods)

  it("the reference holds three cases", function() expect_eq(#cases, 3) end)

  for _, case in ipairs(cases) do
    it(case .. ": log p(x) and z equal SiT's ODE likelihood with the same probes", function()
      local s = literal(meta[case])
      local flow = runner.diffusion.flow { path = s.path, prediction = s.prediction }
      local options = { sampler = s.sampler, steps = s.steps, probes = S["likelihood.probes"] }
      if s.sampler == "dopri5" then options.rtol, options.atol = s.rtol, s.atol end
      if s.reverse then options.reverse = true end
      local logp, z = flow:likelihood(model, S["likelihood.x"], options)
      expect_eq(logp.dtype, "float32")
      expect_eq(logp.shape[1], S["likelihood.x"].shape[1])
      local expected_z = S[case .. ".z"]
      if s.sampler == "dopri5" then
        -- Adaptive steps: z is compared in the solver's norm (its steps may differ from torchdiffeq's, see the
        -- trajectories above). log p integrates the divergence estimate over the same accepted steps here: measured
        -- within 7e-5 of SiT's (one float32 ulp at -870), held to 1e-4 relative as the fixed-step cases.
        local units = ((z - expected_z):abs() / (expected_z:abs() * s.rtol + s.atol)):pow(2):mean():sqrt():item()
        expect_true(units <= 3, string.format("z differs by %.2f tolerance units", units))
        expect_close(logp, S[case .. ".logp"], 0, 1e-4, case .. " logp")
      else
        -- Fixed steps, the same probes at the same evaluations: float32 rounding of sums over 768 elements
        -- (log p is about -700): 1e-4 relative.
        expect_close(z, expected_z, 1e-4, 1e-4, case .. " z")
        expect_close(logp, S[case .. ".logp"], 0, 1e-4, case .. " logp")
      end
    end)
  end

  it("draws its probes from the seed when none are given, and refuses guidance", function()
    local flow = runner.diffusion.flow {}
    local x = S["likelihood.x"]
    local a = flow:likelihood(model, x, { steps = 2, seed = 4 })
    local b = flow:likelihood(model, x, { steps = 2, seed = 4 })
    local c = flow:likelihood(model, x, { steps = 2, seed = 5 })
    expect_true(a:equal(b), "the same seed, the same estimate")
    expect_true(not a:equal(c), "another seed, other probes")
    expect_error(function() flow:likelihood(model, x, { guidance = 2 }) end,
      "unknown option 'guidance' to 'likelihood' (known: atol, autocast, labels, probes, rtol, sampler, seed, steps)", true)
  end)
end)
