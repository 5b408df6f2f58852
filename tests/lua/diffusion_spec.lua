-- Spec: runner.diffusion against the independent Python reference (schedules, q_sample, losses, DDPM/DDIM sampling
-- trajectories), the keyed training streams, label dropout, the sampler's options and errors, sample grids
-- against torchvision and runner.eval.sliced_wasserstein against its definition.
-- Everything runs on the CPU in float32 (the reference cases are CPU float32), whatever test.device says.
local reference = dofile("tests/lua/reference_cases.lua")
local cases_dir = reference.dir
-- Small tensors: more threads only add overhead, and on a busy machine (ctest -j) spinning worker threads slow
-- each model call 5-10x. One thread also gives the reduction order the reference used (make_cases.py).
torch.set_num_threads(1)

-- A diffusion made before anything in this process calls torch.manual_seed: its default seed is the process's
-- random 64-bit default seed, usually above 2^53 (see "sampling works with the default seed" below).
local unseeded_diffusion = runner.diffusion.gaussian { timesteps = 100 }

local literal = reference.literal

local function int64(list)
  return torch.tensor(list, { dtype = "int64" })
end

local function count_keys(t)
  local n = 0
  for _ in pairs(t) do n = n + 1 end
  return n
end

-- A built-in model with the weights of DIR/models/<name>.safetensors, in eval mode.
local function load_model(name)
  return (reference.model(name))
end

local checks = dofile("tests/lua/objective_checks.lua")
local random_unet = checks.random_unet

-- A Lua-defined module around a built-in model that records every call (x, t, labels, training mode) and
-- reports the inner model's info, so d:loss and d:sample treat it as that model.
local Recorder = nn.Module("Recorder")
function Recorder:init(inner)
  self.inner = inner
  self.calls = {}
end
function Recorder:forward(x, t, labels)
  self.calls[#self.calls + 1] = { x = x, t = t, labels = labels, training = self:is_training() }
  return self.inner(x, t, labels)
end
function Recorder:info()
  return self.inner:info()
end

-- Runs `code` with the venv's Python (test.python) on tensors saved to a safetensors file: the script gets the
-- input and output paths as argv[1] and argv[2] (job_base(name) .. ".in.safetensors" and ".out.safetensors") and
-- writes its results with safetensors. Returns them.
local function job_base(name)
  return test.tmp .. "/diffusion_spec_" .. name
end

local function python_job(name, code, inputs)
  local base = job_base(name)
  torch.save(inputs, base .. ".in.safetensors")
  os.remove(base .. ".out.safetensors")
  local script = assert(io.open(base .. ".py", "w"))
  script:write(code)
  script:close()
  local command = string.format("'%s' '%s.py' '%s.in.safetensors' '%s.out.safetensors' 2>&1", test.python, base, base, base)
  local pipe = assert(io.popen(command))
  local output = pipe:read("*a")
  pipe:close()
  local file = io.open(base .. ".out.safetensors", "rb")
  if not file then error("the Python check wrote no results:\n" .. output, 2) end
  file:close()
  return (torch.load(base .. ".out.safetensors"))
end

local function skip_without_python(what)
  if not test.python then skip(what .. " needs RUNNER_PYTHON (the venv's python with torch and torchvision); it is not set") end
end

describe("schedules", function()
  local tables = torch.load(cases_dir .. "/diffusion/schedules.safetensors")
  local fields = { "betas", "alphas_cumprod", "alphas_cumprod_prev", "posterior_variance",
                   "posterior_log_variance_clipped", "posterior_mean_coef1", "posterior_mean_coef2" }

  -- Both sides compute in float64 with the same formulas; 1e-12 relative leaves room for a different order of
  -- the same operations (cumprod, log) but catches any float32 step (1e-7).
  it("every table of d:schedule() equals the float64 reference (linear, cosine, scaled_linear; T = 1000, 100, 50)", function()
    local compared = 0
    for key in pairs(tables) do
      local kind, T = key:match("^(.-)_(%d+)%.betas$")
      if kind then
        local schedule = runner.diffusion.gaussian { schedule = kind, timesteps = tonumber(T), seed = 0 }:schedule()
        expect_eq(count_keys(schedule), #fields, "number of schedule tables")
        for _, field in ipairs(fields) do
          local what = kind .. "_" .. T .. "." .. field
          expect_eq(schedule[field].dtype, "float64", what .. " dtype")
          expect_close(schedule[field], tables[kind .. "_" .. T .. "." .. field], 0, 1e-12, what)
          compared = compared + 1
        end
      end
    end
    expect_eq(compared, 5 * #fields, "schedule tables compared")
  end)

  it("sampling_timesteps(T, S) equals every reference list (descending, ties to even)", function()
    local compared = 0
    for key, expected in pairs(tables) do
      local T, S = key:match("^timesteps_(%d+)_(%d+)$")
      if T then
        expect_list(runner.diffusion.sampling_timesteps(tonumber(T), tonumber(S)), expected:tolist(), key)
        compared = compared + 1
      end
    end
    expect_eq(compared, 9, "timestep lists compared")
  end)

  it("d:info() reports the settings", function()
    local d = runner.diffusion.gaussian { schedule = "cosine", timesteps = 50, prediction = "v", min_snr = 5, seed = 12 }
    local info = d:info()
    expect_eq(info.schedule, "cosine")
    expect_eq(info.timesteps, 50)
    expect_eq(info.prediction, "v")
    expect_eq(info.min_snr, 5)
    expect_eq(info.seed, 12)
    expect_eq(runner.diffusion.gaussian { seed = 1 }:info().min_snr, nil, "min_snr unset")
  end)
end)

describe("training loss against the reference", function()
  local L = torch.load(cases_dir .. "/diffusion/losses.safetensors")

  -- Same float32 operations on both sides (schedule values gathered in float64, then float32): 1e-5 relative to
  -- each element (about 100 float32 ulps); x_t has elements near 0, so it also gets 1e-6 absolute.
  for _, sched in ipairs({ "linear_1000", "cosine_1000" }) do
    local kind, T = sched:match("^(.-)_(%d+)$")
    it(sched .. ": q_sample gives the reference x_t", function()
      local d = runner.diffusion.gaussian { schedule = kind, timesteps = tonumber(T), seed = 0 }
      expect_close(d:q_sample(L.x0, L.t, L.noise), L["x_t." .. sched], 1e-6, 1e-5, "x_t")
    end)

    it(sched .. ": eps, x0 and v losses, unweighted and min-SNR 5, equal the reference", function()
      for _, prediction in ipairs({ "eps", "x0", "v" }) do
        for _, snr in ipairs({ "none", "5" }) do
          local d = runner.diffusion.gaussian { schedule = kind, timesteps = tonumber(T), prediction = prediction,
                                                min_snr = snr == "5" and 5 or nil, seed = 0 }
          local seen
          local loss, mse, vb = d:training_loss(function(x, t, labels)
            seen = { x = x, t = t, labels = labels }
            return L.out
          end, L.x0, L.t, L.noise)
          local what = table.concat({ sched, prediction, snr }, ".")
          expect_close(seen.x, L["x_t." .. sched], 1e-6, 1e-5, what .. ": the model's input x_t")
          expect_true(seen.t:equal(L.t), what .. ": the model's timesteps")
          expect_eq(seen.labels, nil, what .. ": no labels")
          expect_eq(loss:dim(), 0, what .. ": loss is a scalar")
          expect_close(loss, L["loss." .. what], 0, 1e-5, "loss." .. what)
          expect_close(mse, L["mse." .. what], 0, 1e-5, "mse." .. what .. " (weighted per-sample)")
          expect_eq(vb, nil, what .. ": no vb without learned sigma")
        end
      end
    end)

    it(sched .. ": learned sigma adds the reference's vb term (KL for t > 0, decoder NLL at t = 0)", function()
      local d = runner.diffusion.gaussian { schedule = kind, timesteps = tonumber(T), seed = 0 }
      local loss, mse, vb = d:training_loss(function() return L.out_sigma end, L.x0, L.t, L.noise)
      expect_close(loss, L["loss_sigma." .. sched .. ".eps"], 0, 1e-5, "loss_sigma." .. sched)
      expect_close(mse, L["mse_sigma." .. sched .. ".eps"], 0, 1e-5, "mse_sigma." .. sched)
      expect_close(vb, L["vb." .. sched], 0, 1e-5, "vb." .. sched)
    end)
  end
end)

describe("sampling trajectories against the reference", function()
  local S, meta = torch.load(cases_dir .. "/diffusion/sampling.safetensors")
  local models = {}
  local function model_for(name)
    models[name] = models[name] or load_model(name)
    return models[name]
  end

  -- |runner - reference| <= atol + rtol |reference| elementwise over the whole trajectory [S + 1, B, C, H, W]
  -- (values of a few units; measured differences <= 1e-5). The reference computes the DDIM alpha-bar terms
  -- (sqrt(abar'), sigma, sqrt(1 - abar' - sigma^2)) in float32 where runner uses doubles (~1e-6 relative), and the
  -- first step scales the model output by sqrt(1/abar - 1), 157 at t = 999 of the linear schedule: 1e-4 absolute
  -- leaves a margin of 10 over what is measured, and a wrong coefficient or step differs by 1e-2 or more.
  local tolerances = {
    default = { atol = 1e-4, rtol = 0 },
    -- Cosine T = 100: abar at t = 99 is 2.4e-7, so sqrt(1/abar - 1) = 2029 multiplies the model's float32
    -- rounding in the first x0 prediction (measured 1e-4): 1e-3 absolute.
    ddpm = { atol = 1e-3, rtol = 0 },
    -- Without clipping the DiT's x0 predictions reach about 480, where float32 spacing is 3e-5: relative 1e-5
    -- (measured 5e-6 at worst, elementwise) on top of the default absolute bound.
    ddim_noclip = { atol = 1e-4, rtol = 1e-5 },
  }

  local function settings_of(case)
    local s = literal(meta[case])
    return s, {
      x_T = S[s.x_T], labels = s.labels ~= "none" and S[s.labels] or nil, steps = s.steps, sampler = s.sampler,
      eta = s.eta, variance = s.variance, clip = s.clip, guidance = s.guidance,
      noise = s.noise ~= "none" and S[s.noise] or nil, trajectory = true,
    }
  end

  local cases = literal(meta.cases)
  it("the reference holds the eight cases", function()
    expect_list(cases, { "ddim", "ddpm", "ddpm_large", "dit_cfg", "ddim_eta", "ddim_x0", "ddim_v", "ddim_noclip" })
  end)

  for _, case in ipairs(cases) do
    it(case .. ": the whole trajectory matches", function()
      local s, options = settings_of(case)
      local d = runner.diffusion.gaussian { schedule = s.schedule, timesteps = s.timesteps, prediction = s.prediction, seed = 0 }
      local x, trajectory = d:sample(model_for(s.model), options)
      local reference = S[case .. ".trajectory"]
      local tolerance = tolerances[case] or tolerances.default
      expect_close(trajectory, reference, tolerance.atol, tolerance.rtol, case .. " trajectory")
      expect_true(trajectory[1]:equal(options.x_T), case .. ": the trajectory starts at x_T")
      expect_true(x:equal(trajectory[-1]), case .. ": the sample is the trajectory's last entry")
    end)
  end

  -- The same cases through a Lua-defined model that records its calls: the timesteps it sees are the visited
  -- ones, one model call per step, and classifier-free guidance runs once on cat([x, x]) with labels
  -- cat([y, null]).
  for _, case in ipairs({ "ddpm", "dit_cfg" }) do
    it(case .. ": a Lua-defined model sees the visited timesteps (and the guidance batch) and gives the same trajectory", function()
      local s, options = settings_of(case)
      local d = runner.diffusion.gaussian { schedule = s.schedule, timesteps = s.timesteps, prediction = s.prediction, seed = 0 }
      local recorder = Recorder(model_for(s.model))
      local _, trajectory = d:sample(recorder, options)
      local tolerance = tolerances[case] or tolerances.default
      expect_close(trajectory, S[case .. ".trajectory"], tolerance.atol, tolerance.rtol, case .. " trajectory")
      local visited = S[case .. ".timesteps"]:tolist()
      expect_eq(#recorder.calls, #visited, "model calls")
      local batch = options.x_T.shape[1]
      for k, call in ipairs(recorder.calls) do
        local doubled = s.guidance ~= 1 and 2 or 1
        expect_eq(call.x.shape[1], doubled * batch, "batch of model call " .. k)
        expect_true(call.t:eq(visited[k]):all():item(), "call " .. k .. " runs at timestep " .. visited[k])
        expect_true(not call.training, "call " .. k .. " in eval mode")
        if s.guidance ~= 1 then
          local null = model_for(s.model):info().null_label
          local expected = torch.cat({ options.labels, torch.full({ batch }, null, { dtype = "int64" }) })
          expect_true(call.labels:equal(expected), "call " .. k .. " labels are cat(y, null)")
          expect_true(call.x[{ { 1, batch } }]:equal(call.x[{ { batch + 1, 2 * batch } }]), "call " .. k .. " x is cat(x, x)")
        end
      end
    end)
  end
end)

describe("keyed training streams", function()
  local unet_options = { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, dropout = 0,
                         classes = 3, class_dropout = 0.5 }
  local function loader_batch(data, labels, indices, epoch)
    return { data = data, label = labels, index = indices, epoch = epoch }
  end
  torch.manual_seed(21)
  local data = torch.randn(6, 3, 8, 8)
  local labels = int64({ 0, 1, 2, 0, 1, 2 })
  local indices = int64({ 17, 3, 250, 8, 1, 99 })
  local first, second = { 1, 3 }, { 4, 6 }

  -- Per-sample values computed in batches of 6 and of 3: a convolution may block the batch differently, so
  -- mse agrees to float32 rounding (1e-5 relative), the keyed draws exactly.
  it("a loader batch split in two gives every sample the same timestep, noise, label dropout and mse", function()
    local model = Recorder(random_unet(unet_options, 5))
    local d = runner.diffusion.gaussian { timesteps = 1000, seed = 7 }
    local loss, details = d:loss(model, loader_batch(data, labels, indices, 2))
    local whole = model.calls[1]
    local loss_a, details_a = d:loss(model, loader_batch(data[{ first }], labels[{ first }], indices[{ first }], 2))
    local loss_b, details_b = d:loss(model, loader_batch(data[{ second }], labels[{ second }], indices[{ second }], 2))
    local a, b = model.calls[2], model.calls[3]
    expect_eq(details.t.dtype, "int64", "t dtype")
    expect_true(details.t:equal(torch.cat({ details_a.t, details_b.t })), "timesteps equal across the split")
    expect_true(whole.t:equal(details.t), "the model ran at details.t")
    expect_close(torch.cat({ a.x, b.x }), whole.x, 1e-6, 1e-6, "x_t (same noise) across the split")
    expect_true(whole.labels:equal(torch.cat({ a.labels, b.labels })), "dropped labels equal across the split")
    local dropped = whole.labels:eq(3):sum():item()
    expect_true(dropped > 0 and dropped < 6, "some labels of this batch are dropped (class_dropout 0.5), some kept")
    expect_close(torch.cat({ details_a.mse, details_b.mse }), details.mse, 0, 1e-5, "per-sample mse across the split")
    expect_close((loss_a + loss_b) / 2, loss, 0, 1e-5, "loss = mean of the halves' losses")
    expect_eq(details.vb, nil, "no vb without learned sigma")
    expect_eq(d:stream_counter(), 0, "loader batches leave the running counter alone")
  end)

  it("refuses an out-of-range label that label dropout would have replaced", function()
    local model = Recorder(random_unet(unet_options, 5))
    local d = runner.diffusion.gaussian { timesteps = 1000, seed = 7 }
    d:loss(model, loader_batch(data, labels, indices, 2))
    local dropped = nil
    for i = 1, 6 do
      if model.calls[1].labels[i]:item() == 3 then dropped = i end
    end
    expect_true(dropped ~= nil, "a label of this batch is dropped")
    local bad = labels:clone()
    bad[dropped] = 7
    expect_error(function() d:loss(model, loader_batch(data, bad, indices, 2)) end,
      "loss: labels must be in 0..3 (3 classes, 3 = no label), got values in 0..7", true)
    -- One past the null label is refused too.
    bad[dropped] = 4
    expect_error(function() d:loss(model, loader_batch(data, bad, indices, 2)) end,
      "loss: labels must be in 0..3 (3 classes, 3 = no label), got values in 0..4", true)
  end)

  it("the draws depend on the seed and the epoch; the same seed gives identical losses", function()
    local unet = random_unet(unet_options, 5)
    local batch = loader_batch(data, labels, indices, 2)
    local loss_7, details_7 = runner.diffusion.gaussian { seed = 7 }:loss(unet, batch)
    local loss_7b, details_7b = runner.diffusion.gaussian { seed = 7 }:loss(unet, batch)
    expect_true(details_7.t:equal(details_7b.t), "same seed: same timesteps")
    expect_true(loss_7:equal(loss_7b) and details_7.mse:equal(details_7b.mse), "same seed: identical loss and mse")
    local _, details_8 = runner.diffusion.gaussian { seed = 8 }:loss(unet, batch)
    expect_true(not details_8.t:equal(details_7.t), "another seed draws other timesteps")
    local _, details_e3 = runner.diffusion.gaussian { seed = 7 }:loss(unet, loader_batch(data, labels, indices, 3))
    expect_true(not details_e3.t:equal(details_7.t), "another epoch draws other timesteps")
  end)

  it("tensor batches draw from a running counter that advances by B and can be set back", function()
    local function model(x, t) return x * 0.5 + t:float():view(-1, 1, 1, 1) * 1e-3 end
    local x = data[{ first }]
    local d = runner.diffusion.gaussian { timesteps = 1000, seed = 7 }
    local twin = runner.diffusion.gaussian { timesteps = 1000, seed = 7 }
    expect_eq(d:stream_counter(), 0)
    local loss_1, details_1 = d:loss(model, x)
    expect_eq(d:stream_counter(), 3, "counter after a batch of 3")
    local loss_2, details_2 = d:loss(model, x)
    expect_eq(d:stream_counter(), 6, "counter after two batches of 3")
    expect_true(not details_2.t:equal(details_1.t), "the next batch draws fresh timesteps")
    local twin_1 = twin:loss(model, x)
    local twin_2 = twin:loss(model, x)
    expect_true(twin_1:equal(loss_1) and twin_2:equal(loss_2), "two diffusions with the same seed give identical losses")
    expect_eq(d:stream_counter(0), 0, "stream_counter(value) sets and returns the counter")
    local again, details_again = d:loss(model, x)
    expect_true(again:equal(loss_1) and details_again.t:equal(details_1.t), "set back, the counter repeats its draws")
  end)

  it("state() records the counter and the generator version; loading another version's state warns", function()
    local function model(x, t) return x * 0.5 + t:float():view(-1, 1, 1, 1) * 1e-3 end
    local x = data[{ first }]
    local d = runner.diffusion.gaussian { timesteps = 1000, seed = 7 }
    d:loss(model, x)
    local state = d:state()
    expect_eq(state.stream_counter, 3)
    expect_eq(state.stream_generator, 2, "the generator of the draws")
    local warnings = {}
    local warn = runner.log.warn
    runner.log.warn = function(format, ...) warnings[#warnings + 1] = string.format(format, ...) end
    local ok, err = pcall(function()
      local resumed = runner.diffusion.gaussian { timesteps = 1000, seed = 7 }
      resumed:load_state(state)
      expect_eq(#warnings, 0, "a state of this version loads quietly")
      expect_eq(resumed:stream_counter(), 3)
      resumed:load_state { stream_counter = 6 }
      expect_eq(resumed:stream_counter(), 6, "an older state still sets the counter")
    end)
    runner.log.warn = warn
    assert(ok, err)
    expect_eq(#warnings, 1, "a state without a generator version (version 1) warns")
    expect_eq(warnings[1], "diffusion: the checkpoint's training draws (timesteps, noise, label dropout) came from "
      .. "generator version 1 and this runner draws with version 2, so the resumed run does not draw what the "
      .. "original run would have")
  end)

  -- 4000 draws: the mean of 4000 uniform timesteps in 0..9 has standard deviation 0.045, the mean square of 64000
  -- normal values 0.0056; the bounds are about 5 standard deviations.
  it("timesteps are uniform over 0..T-1 and the noise is standard normal", function()
    local d = runner.diffusion.gaussian { schedule = "cosine", timesteps = 10, seed = 3 }
    local loss, details = d:loss(function(x) return torch.zeros_like(x) end, torch.zeros(4000, 1, 4, 4))
    local t = details.t
    expect_eq(t:min():item(), 0, "smallest timestep")
    expect_eq(t:max():item(), 9, "largest timestep")
    for value = 0, 9 do expect_true(t:eq(value):sum():item() > 300, "timestep " .. value .. " drawn often") end
    expect_near(t:double():mean():item(), 4.5, 0.25, "mean timestep")
    -- Zero output with eps prediction: mse_i = mean(noise_i^2).
    expect_near(loss:item(), 1, 0.03, "mean square of the noise")
  end)

  -- Kolmogorov-Smirnov distance of 4000 draws to the exact CDF P(t <= k) = Phi((logit((k + 1) / T) - mean) / std):
  -- its 0.1% critical value is 1.95 / sqrt(4000) = 0.031.
  it("logit_normal timesteps follow floor(T sigmoid(mean + std n)) and stay keyed", function()
    local function normal_cdf(z) return 0.5 * (1 + torch.tensor(z / math.sqrt(2), { dtype = "float64" }):erf():item()) end
    for _, case in ipairs { { mean = 0, std = 1 }, { mean = -0.8, std = 0.6 } } do
      local d = runner.diffusion.gaussian { timesteps = 100, seed = 3, timestep_sampling = "logit_normal",
                                           logit_mean = case.mean, logit_std = case.std }
      local _, details = d:loss(function(x) return torch.zeros_like(x) end, torch.zeros(4000, 1, 2, 2))
      local t = details.t
      expect_true(t:min():item() >= 0 and t:max():item() <= 99, "timesteps within 0..99")
      local worst = 0
      for k = 0, 98 do
        local p = (k + 1) / 100
        local exact = normal_cdf((math.log(p / (1 - p)) - case.mean) / case.std)
        worst = math.max(worst, math.abs(t:le(k):sum():item() / 4000 - exact))
      end
      expect_true(worst < 0.031, string.format("KS distance %.4f to logit-normal(%g, %g) below 0.031", worst, case.mean, case.std))
      local info = d:info()
      expect_eq(info.timestep_sampling, "logit_normal")
      expect_eq(info.logit_mean, case.mean)
      expect_eq(info.logit_std, case.std)
    end
    local unet = random_unet(unet_options, 5)
    local sampling = { seed = 7, timestep_sampling = "logit_normal" }
    local _, whole = runner.diffusion.gaussian(sampling):loss(unet, loader_batch(data, labels, indices, 2))
    local _, part = runner.diffusion.gaussian(sampling):loss(unet, loader_batch(data[{ second }], labels[{ second }], indices[{ second }], 2))
    expect_true(whole.t[{ second }]:equal(part.t), "a sample's timestep does not depend on its batch")
    expect_eq(runner.diffusion.gaussian { seed = 1 }:info().timestep_sampling, "uniform", "uniform by default")
  end)
end)

describe("label dropout", function()
  local function conditional(class_dropout)
    return random_unet({ channels = 4, mults = { 1 }, blocks = 1, attention = {}, image = 4, groups = 2, dropout = 0,
                         classes = 4, class_dropout = class_dropout }, 9)
  end
  local n = 2000
  local labels = torch.arange(n) % 4
  local batch = { data = torch.zeros(n, 3, 4, 4), label = labels, index = torch.arange(n), epoch = 1 }

  -- 2000 labels dropped with probability 0.5: standard deviation of the rate 0.011; the bound is 4.5 of them.
  it("a UNet's class_dropout 0.5 drops about half of the labels to the null label; the rest are kept", function()
    local model = Recorder(conditional(0.5))
    local function last_labels() return model.calls[#model.calls].labels end
    local d = runner.diffusion.gaussian { timesteps = 1000, seed = 4 }
    d:loss(model, batch)
    local seen = last_labels()
    local dropped = seen:eq(4)
    local rate = dropped:sum():item() / n
    expect_near(rate, 0.5, 0.05, "share of null labels")
    expect_true(seen:eq(labels):logical_or(dropped):all():item(), "labels are either kept or the null label")
    d:loss(model, batch, { label_dropout = 0 })
    expect_true(last_labels():equal(labels), "label_dropout = 0 keeps every label")
    d:loss(model, batch, { label_dropout = 1 })
    expect_true(last_labels():eq(4):all():item(), "label_dropout = 1 drops every label")
    d:loss(model, batch.data, { labels = labels, label_dropout = 0 })
    expect_true(last_labels():equal(labels), "options.labels gives the labels of a tensor batch")
  end)

  it("an unconditional model gets no labels even when the batch has them", function()
    local model = Recorder(random_unet({ channels = 4, mults = { 1 }, blocks = 1, attention = {}, image = 4, groups = 2 }, 9))
    runner.diffusion.gaussian { seed = 1 }:loss(model, { data = torch.zeros(4, 3, 4, 4), label = int64({ 0, 1, 2, 3 }),
                                                         index = int64({ 0, 1, 2, 3 }), epoch = 1 })
    expect_eq(model.calls[1].labels, nil)
    local unet = random_unet({ channels = 4, mults = { 1 }, blocks = 1, attention = {}, image = 4, groups = 2 }, 9)
    expect_error(function() runner.diffusion.gaussian { seed = 1 }:loss(unet, torch.zeros(2, 3, 4, 4), { labels = int64({ 0, 1 }) }) end,
      here(-1) .. "loss: labels were given but the model is unconditional (build it with classes = N to condition on them)")
  end)

  it("errors: a conditional model without labels, label dropout without a null label", function()
    local d = runner.diffusion.gaussian { seed = 1 }
    local x = torch.zeros(2, 3, 4, 4)
    expect_error(function() d:loss(conditional(0.5), x) end,
      here(-1) .. "loss: the model is class-conditional (4 classes) but the batch has no labels")
    local no_null = conditional(0)
    expect_eq(no_null:info().null_label, nil, "class_dropout 0: no null label")
    expect_error(function() d:loss(no_null, x, { labels = int64({ 0, 1 }), label_dropout = 0.5 }) end,
      here(-1) .. "loss: label_dropout needs a model with a null label (class_dropout > 0)")
    expect_error(function() d:loss(no_null, x, { labels = int64({ 0, 1 }), droput = 0.5 }) end,
      here(-1) .. "unknown option 'droput' to 'loss' (known: label_dropout, labels)")
    expect_error(function() d:loss(no_null, { data = x, label = int64({ 0, 1 }), index = int64({ 0, 1, 2 }), epoch = 1 }) end,
      here(-1) .. "loss: batch.index must hold 2 dataset indices, got 3")
  end)
end)

describe("the diffusion objective", function()
  local options = { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, dropout = 0,
                    classes = 3, class_dropout = 0.3 }
  torch.manual_seed(22)
  local data = torch.randn(8, 3, 8, 8)
  local labels = int64({ 0, 1, 2, 0, 1, 2, 0, 1 })
  local indices = int64({ 5, 9, 2, 44, 7, 1, 30, 12 })

  it("train:step(batch) gives the loss function form's losses and weights bit for bit (accumulate 2, labels dropped)", function()
    local losses = checks.objective_steps_as_its_loss_function(function()
      return runner.diffusion.gaussian { timesteps = 100, seed = 9, min_snr = 5 }
    end, options, { data = data, label = labels, index = indices })
    expect_true(losses[1] ~= losses[2], "another epoch draws other timesteps")
  end)

  it("says what it computes and refuses what it cannot run", function()
    local d = runner.diffusion.gaussian { timesteps = 100, prediction = "v", timestep_sampling = "logit_normal" }
    local unet = nn.UNet(options)
    expect_eq(tostring(d:objective(unet)),
      "Objective(diffusion loss (v prediction, logit_normal timesteps, 3 classes, label dropout 0.3))")
    expect_eq(tostring(d:objective(unet, { label_dropout = 0 })),
      "Objective(diffusion loss (v prediction, logit_normal timesteps, 3 classes, label dropout 0))")
    expect_error(function() d:objective(function(x) return x end) end,
      here(-1) .. "objective: the model must be a built-in denoiser (nn.UNet, nn.DiT); for another model give the "
      .. "trainer a loss function: train:step(batch, function(micro) return d:loss(model, micro) end)")
    expect_error(function() d:objective(unet, { dropout = 0.1 }) end, "unknown option 'dropout' to 'objective'", true)
    local no_null = nn.UNet { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, classes = 3,
                              class_dropout = 0 }
    expect_error(function() d:objective(no_null, { label_dropout = 0.2 }) end,
      here(-1) .. "loss: label_dropout needs a model with a null label (class_dropout > 0)")
    local train = runner.trainer { model = unet, optimizer = { "sgd", lr = 0.1 }, objective = d:objective(unet),
                                   progress = false }
    expect_error(function() train:step({ data = data }) end,
      here(-1) .. "loss: the model is class-conditional (3 classes) but the batch has no labels")
    local plain = runner.trainer { model = unet, optimizer = { "sgd", lr = 0.1 }, progress = false }
    expect_error(function() plain:step({ data = data }) end,
      here(-1) .. "train:step(batch) needs runner.trainer { objective = ... } (e.g. ddpm:objective(model)); or pass a "
      .. "loss function: train:step(batch, function(micro) ... end)")
    expect_error(function() runner.trainer { model = unet, optimizer = { "sgd", lr = 0.1 }, objective = 3 } end,
      here(-1) .. "runner.trainer: 'objective' must be an objective (e.g. ddpm:objective(model)) or a loss function, got a number")
  end)

  it("takes a Lua loss function as the objective", function()
    local model = random_unet(options, 6)
    local d = runner.diffusion.gaussian { timesteps = 100, seed = 9 }
    local calls = 0
    local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, accumulate = 2, progress = false,
                                   objective = function(micro)
                                     calls = calls + 1
                                     expect_eq(micro.data.shape[1], 4, "micro-batch size")
                                     return d:loss(model, micro)
                                   end }
    local out = train:step { data = data, label = labels, index = indices, epoch = 1 }
    expect_eq(calls, 2)
    expect_eq(out.step, 1)
  end)
end)

describe("sampler API", function()
  local options = { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, dropout = 0 }

  it("clips x0 by default for the UNet (pixel space), not for the DiT (latents, as the official DiT)", function()
    local d = runner.diffusion.gaussian { timesteps = 100, seed = 1 }
    torch.manual_seed(6)
    local dit = nn.DiT { depth = 1, hidden = 32, heads = 2, patch = 2, image = 8, in_channels = 4, classes = 0 }
    local state = {}
    for key, value in pairs(dit:state_dict()) do state[key] = torch.randn(value.shape) * 0.5 end
    dit:load_state_dict(state)
    for _, case in ipairs { { random_unet(options, 5), true }, { dit, false } } do
      local model, clip = case[1], case[2]
      local default = d:sample(model, { n = 2, steps = 5, seed = 3 })
      expect_true(default:equal(d:sample(model, { n = 2, steps = 5, seed = 3, clip = clip })), "default clip")
      expect_true(not default:equal(d:sample(model, { n = 2, steps = 5, seed = 3, clip = not clip })), "other clip")
    end
  end)

  it("d:sample(model, {n = 4}) gives [4, C, H, W] in [-1, 1] and restores the training mode", function()
    local model = Recorder(random_unet(options, 31))
    model:train()
    local d = runner.diffusion.gaussian { timesteps = 100, seed = 1 }
    local x = d:sample(model, { n = 4, steps = 5 })
    expect_list(x.shape, { 4, 3, 8, 8 })
    expect_eq(x.dtype, "float32")
    expect_true(x:ge(-1):logical_and(x:le(1)):all():item(), "samples within [-1, 1] (clip on)")
    expect_true(x:abs():max():item() > 0.5, "samples are not all zero")
    expect_eq(#model.calls, 5, "one model call per step")
    for _, call in ipairs(model.calls) do expect_true(not call.training, "the model runs in eval mode") end
    expect_true(model:is_training(), "training mode restored")
    model:eval()
    d:sample(model, { n = 2, steps = 2 })
    expect_true(not model:is_training(), "eval mode kept")
    model:train()
    pcall(function() d:sample(model, { n = 2, sampler = "foo" }) end)
    expect_true(model:is_training(), "training mode restored after an error")
  end)

  it("is deterministic for a seed and differs for another (ddim and ddpm)", function()
    local unet = random_unet(options, 31)
    local d = runner.diffusion.gaussian { timesteps = 100, seed = 1 }
    for _, sampler in ipairs({ "ddim", "ddpm" }) do
      local a = d:sample(unet, { n = 3, steps = 4, sampler = sampler, seed = 5 })
      local b = d:sample(unet, { n = 3, steps = 4, sampler = sampler, seed = 5 })
      local c = d:sample(unet, { n = 3, steps = 4, sampler = sampler, seed = 6 })
      expect_true(a:equal(b), sampler .. ": same seed, same samples")
      expect_true(not a:equal(c), sampler .. ": another seed, other samples")
      local default = d:sample(unet, { n = 3, steps = 4, sampler = sampler })
      local seed_1 = d:sample(unet, { n = 3, steps = 4, sampler = sampler, seed = 1 })
      expect_true(default:equal(seed_1), sampler .. ": the default seed is the diffusion's")
    end
    local x, trajectory = d:sample(unet, { n = 2, steps = 3, trajectory = true })
    expect_list(trajectory.shape, { 4, 2, 3, 8, 8 }, "trajectory [steps + 1, n, C, H, W]")
    expect_true(trajectory[-1]:equal(x), "trajectory ends at the sample")
  end)

  -- torch.initial_seed() of a process that never called torch.manual_seed is a random 64-bit value; it used to
  -- be refused as "integer expected" because Lua numbers above 2^53 failed the integer check.
  it("sampling works with the default seed of an unseeded process and with 64-bit seeds", function()
    local unet = random_unet(options, 31)
    local a = unseeded_diffusion:sample(unet, { n = 2, steps = 2 })
    expect_true(a:equal(unseeded_diffusion:sample(unet, { n = 2, steps = 2 })), "deterministic with the default seed")
    local big = 2 ^ 63 + 2 ^ 12
    local d = runner.diffusion.gaussian { timesteps = 100, seed = big }
    expect_eq(d:info().seed, big, "a 64-bit seed is kept")
    local b = d:sample(unet, { n = 2, steps = 2, sampler = "ddpm" })
    expect_true(b:equal(d:sample(unet, { n = 2, steps = 2, sampler = "ddpm", seed = big })), "64-bit seed option")
    expect_error(function() runner.diffusion.gaussian { seed = -1 } end, here() .. "seed must be an integer in [0, 2^64), got -1")
  end)

  it("reports bad options with exact texts", function()
    local unet = random_unet(options, 31)
    local conditional = nn.UNet { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, classes = 3 }
    local d = runner.diffusion.gaussian { timesteps = 100, seed = 1 }
    expect_error(function() d:sample(unet, { n = 4, stpes = 3 }) end, here() .. "unknown option 'stpes' to 'sample' (known: "
      .. "autocast, clip, device, eta, guidance, labels, n, noise, null_label, sampler, seed, shape, steps, trajectory, variance, x_T); "
      .. "did you mean 'steps'?")
    expect_error(function() d:sample(unet, { n = 4, sampler = "foo" }) end, here() .. "sampler must be ddim or ddpm, got 'foo'")
    expect_error(function() d:sample(unet, { n = 4, steps = 0 }) end,
      here(-1) .. "sampling steps must be between 1 and the schedule's 100 timesteps, got 0")
    expect_error(function() d:sample(unet, { n = 4, steps = 101 }) end,
      here(-1) .. "sampling steps must be between 1 and the schedule's 100 timesteps, got 101")
    expect_error(function() d:sample(conditional, { n = 4, guidance = 3 }) end,
      here(-1) .. "sample: the model is class-conditional (3 classes): give labels")
    expect_error(function() d:sample(unet, { n = 4, guidance = 3 }) end,
      here(-1) .. "sample: guidance 3 needs a class-conditional model; this one is unconditional")
    expect_error(function() d:sample(unet, { labels = { 1, 2 }, guidance = 3, null_label = 0 }) end,
      here(-1) .. "sample: labels were given but the model is unconditional (build it with classes = N to condition on them)")
    expect_error(function() d:sample(unet, { n = 2, sampler = "ddpm", eta = 0.5 }) end,
      here(-1) .. "eta applies to the ddim sampler only, got eta 0.5 with ddpm")
    expect_error(function() d:sample(unet, { n = 2, variance = "small" }) end,
      here(-1) .. "variance applies to the ddpm sampler only (ddim takes eta), got 'small' with ddim")
    expect_error(function() d:sample(function(x) return x end, { n = 2 }) end,
      here(-1) .. "sample: a model that is not a built-in UNet or DiT needs shape = {C, H, W} (one sample's shape; "
        .. "the start noise is drawn from the seed) or x_T (the start noise)")
    expect_error(function() d:sample(function(x) return x end, { n = 2, shape = { 3, 8 } }) end,
      here(-1) .. "sample: shape must be {C, H, W}, the shape of one sample")
    expect_error(function() d:sample(function(x) return x end, { n = 2, shape = { 3, 0, 8 } }) end,
      here(-1) .. "sample: shape must be {C, H, W} of whole numbers >= 1, got 0 at 2")
    expect_error(function() d:sample(function(x) return x end, { n = 2, shape = { 3, 8, 2.5 } }) end,
      here(-1) .. "sample: shape must be {C, H, W} of whole numbers >= 1, got 2.5 at 3")
    -- A Lua-defined model with shape: the start noise is drawn from the seed, the same for the same seed.
    local identity = function(x) return x * 0.5 end
    local drawn, trajectory = d:sample(identity, { n = 2, shape = { 3, 8, 4 }, seed = 5, steps = 2, trajectory = true })
    expect_eq(table.concat(drawn.shape, "x"), "2x3x8x4", "n samples of the given shape")
    expect_true(drawn:equal(d:sample(identity, { n = 2, shape = { 3, 8, 4 }, seed = 5, steps = 2 })), "the same seed")
    expect_true(drawn:equal(d:sample(identity, { x_T = trajectory[1], seed = 5, steps = 2 })), "x_T as drawn")
    expect_true(not drawn:equal(d:sample(identity, { n = 2, shape = { 3, 8, 4 }, seed = 6, steps = 2 })),
      "another seed, another start")
    expect_error(function() runner.diffusion.gaussian { timestep = 10 } end, here() .. "unknown option 'timestep' to "
      .. "'diffusion.gaussian' (known: beta_end, beta_start, logit_mean, logit_std, min_snr, prediction, schedule, seed, "
      .. "timestep_sampling, timesteps); did you mean 'timesteps'?")
    expect_error(function() runner.diffusion.gaussian { timestep_sampling = "lognormal" } end,
      here(-1) .. 'timestep sampling must be "uniform" or "logit_normal", got "lognormal"')
    expect_error(function() runner.diffusion.gaussian { logit_mean = -0.5 } end,
      here(-1) .. 'logit_mean and logit_std shape timestep_sampling = "logit_normal"; it is "uniform"')
    expect_error(function() runner.diffusion.gaussian { timestep_sampling = "logit_normal", logit_std = 0 } end,
      here(-1) .. "logit_std must be a positive number, got 0")
  end)
end)

describe("sample grids", function()
  torch.manual_seed(41)
  -- Values outside [-1, 1] test the clamp; H != W tests the layout.
  local rgb = torch.randn(7, 3, 5, 6) * 0.8
  local gray = torch.randn(5, 1, 4, 3) * 0.8

  it("make_grid: shape, padding and pad value for 3- and 1-channel images", function()
    local grid = runner.make_grid(rgb, { columns = 3 })
    expect_list(grid.shape, { 3 * (5 + 2) + 2, 3 * (6 + 2) + 2, 3 }, "7 RGB images in 3 columns, padding 2")
    expect_eq(grid.dtype, "uint8")
    expect_eq(grid[{ { 1, 2 } }]:max():item(), 0, "top border is pad_value 0")
    expect_eq(grid[{ {}, { 1, 2 } }]:max():item(), 0, "left border is pad_value 0")
    expect_eq(grid[{ { 17, 23 }, { 10, 26 } }]:max():item(), 0, "the missing cells of the last row are padding")
    expect_list(runner.make_grid(rgb, { columns = 3, padding = 0 }).shape, { 15, 18, 3 }, "padding 0")
    expect_list(runner.make_grid(rgb).shape, { 5 + 4, 7 * 8 + 2, 3 }, "default 8 columns: one row of 7")
    local one = runner.make_grid(gray, { columns = 2, padding = 1, pad_value = 0.5 })
    expect_list(one.shape, { 3 * (4 + 1) + 1, 2 * (3 + 1) + 1, 1 }, "5 gray images in 2 columns, padding 1")
    expect_eq(one[{ 1, 1, 1 }]:item(), 128, "pad_value 0.5 is 128")
    expect_list(runner.make_grid(rgb[{ { 1 } }]).shape, { 5, 6, 3 }, "a single image has no padding")
    -- Pixel values: round(255 * (v + 1) / 2) of the clamped image; uint8 images are taken as they are.
    local expected = ((rgb[1]:clamp(-1, 1) + 1) / 2 * 255 + 0.5):clamp(0, 255):byte():permute(2, 3, 1)
    expect_true(grid[{ { 3, 7 }, { 3, 8 } }]:equal(expected), "first cell holds the first image")
    local bytes = torch.randint(0, 256, { 2, 3, 4, 4 }, { dtype = "uint8" })
    expect_true(runner.make_grid(bytes, { padding = 0 })[{ {}, { 1, 4 } }]:equal(bytes[1]:permute(2, 3, 1)), "uint8 input kept")
  end)

  it("make_grid and save_grid reject what is not [N, 1 or 3, H, W]", function()
    expect_error(function() runner.make_grid(torch.zeros(3, 8, 8)) end,
      here(-1) .. "image grid: images must be [N, 1 or 3, H, W] with N >= 1, got [3, 8, 8]")
    expect_error(function() runner.save_grid(test.tmp .. "/never.png", torch.zeros(2, 2, 8, 8)) end,
      here(-1) .. "image grid: images must be [N, 1 or 3, H, W] with N >= 1, got [2, 2, 8, 8]")
    expect_error(function() runner.make_grid(rgb, { colums = 3 }) end, "unknown option 'colums' to 'make_grid'", true)
  end)

  it("save_grid writes the PNG torchvision's save_image writes, pixel for pixel", function()
    skip_without_python("comparing with torchvision")
    local rgb_path, gray_path = job_base("grid") .. "_runner_rgb.png", job_base("grid") .. "_runner_gray.png"
    os.remove(rgb_path)
    os.remove(gray_path)
    runner.save_grid(rgb_path, rgb, { columns = 3 })
    runner.save_grid(gray_path, gray, { columns = 2, padding = 1, pad_value = 0.5 })
    local out = python_job("grid", [[
import sys
import numpy as np
import torch
import torchvision.utils
from PIL import Image
from safetensors.torch import load_file, save_file

inputs = load_file(sys.argv[1])
base = sys.argv[1][: -len(".in.safetensors")]
results = {}
for name, options in (("rgb", dict(nrow=3)), ("gray", dict(nrow=2, padding=1, pad_value=0.5))):
    path, reference = base + "_runner_" + name + ".png", base + "_torchvision_" + name + ".png"
    torchvision.utils.save_image(inputs[name], reference, normalize=True, value_range=(-1, 1), **options)
    results[name + ".torchvision"] = torch.from_numpy(np.asarray(Image.open(reference).convert("RGB")).copy())
    results[name + ".runner"] = torch.from_numpy(np.asarray(Image.open(path).convert("RGB")).copy())
save_file(results, sys.argv[2])
]], { rgb = rgb, gray = gray })
    for _, name in ipairs({ "rgb", "gray" }) do
      local mine, theirs = out[name .. ".runner"], out[name .. ".torchvision"]
      expect_list(mine.shape, theirs.shape, name .. " PNG size")
      local differing = mine:ne(theirs):sum():item()
      expect_eq(differing, 0, name .. ": pixels that differ from torchvision")
    end
    expect_true(out["rgb.runner"]:equal(runner.make_grid(rgb, { columns = 3 })), "make_grid is the saved picture")
    expect_true(out["gray.runner"][{ {}, {}, { 1 } }]:equal(runner.make_grid(gray, { columns = 2, padding = 1, pad_value = 0.5 })),
      "gray make_grid is the saved picture")
  end)
end)

describe("sliced Wasserstein distance", function()
  torch.manual_seed(51)
  local a = torch.randn(64, 3, 32, 32) * 0.5
  local same = torch.randn(64, 3, 32, 32) * 0.5
  local shifted = {}
  for _, shift in ipairs({ 0.25, 0.5, 1 }) do shifted[shift] = torch.randn(64, 3, 32, 32) * 0.5 + shift end
  local sw = runner.eval.sliced_wasserstein

  it("is 0 for identical sets, symmetric, and grows as the sets drift apart", function()
    expect_eq(sw(a, a:clone()), 0, "identical sets")
    expect_eq(sw(a, same), sw(same, a), "symmetric")
    local near, d1, d2, d3 = sw(a, same), sw(a, shifted[0.25]), sw(a, shifted[0.5]), sw(a, shifted[1])
    expect_true(near < d1 and d1 < d2 and d2 < d3,
      string.format("increasing with the shift: %.4g < %.4g < %.4g < %.4g", near, d1, d2, d3))
    expect_true(near > 0, "two samples of one distribution are not at distance 0")
    -- A blurred copy (2x2 means spread back) is equal to the set once pooled to 16 px, but at 32 px the finest
    -- detail level sees the lost edges.
    local down = a:reshape(64, 3, 16, 2, 16, 2):mean({ 4, 6 })
    local blurred = down:reshape(64, 3, 16, 1, 16, 1):expand(64, 3, 16, 2, 16, 2):reshape(64, 3, 32, 32)
    expect_near(sw(a, blurred, { resolution = 16 }), 0, 1e-6, "blurred copy at 16 px (float32 pooling)")
    expect_true(sw(a, blurred, { resolution = 32 }) > 0.2, string.format("blurred copy at 32 px: %.4g > 0.2",
      sw(a, blurred, { resolution = 32 })))
    expect_error(function() sw(a, a[{ { 1, 10 } }]) end,
      here(-1) .. "sliced Wasserstein: both image sets must be [N, C, H, W] of the same shape, got [64, 3, 32, 32] and [10, 3, 32, 32]")
    expect_error(function() sw(a, a, { resolution = 64 }) end, here() .. "sliced Wasserstein: resolution must be in 1..32, got 64")
  end)

  -- Float64 on both sides after the same float32 pooling and float32 directions: 1e-6 relative.
  it("equals the definition computed with torch in Python", function()
    skip_without_python("the Python computation")
    local settings = { { 16, 512, 0 }, { 8, 64, 5 }, { 32, 100, 123 } }
    local got = {}
    for i, s in ipairs(settings) do got[i] = sw(a, shifted[0.5], { resolution = s[1], projections = s[2], seed = s[3] }) end
    local out = python_job("sliced_wasserstein", [[
import sys
import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file

inputs = load_file(sys.argv[1])

def pooled(images, resolution):
    x = images.float()
    if x.shape[-1] != resolution or x.shape[-2] != resolution:
        x = F.adaptive_avg_pool2d(x, resolution)
    return x.double()

def levels(x):
    out = []
    while x.shape[-1] >= 8 and x.shape[-2] >= 8:
        down = F.avg_pool2d(x, 2)
        out.append(x - F.interpolate(down, size=x.shape[-2:], mode="nearest"))
        x = down
    out.append(x)
    return out

def sliced_wasserstein(a, b, resolution, projections, seed):
    generator = torch.Generator().manual_seed(seed)
    distances = []
    for la, lb in zip(levels(pooled(a, resolution)), levels(pooled(b, resolution))):
        ra, rb = la.reshape(la.shape[0], -1), lb.reshape(lb.shape[0], -1)
        scale = torch.cat([ra, rb]).std(unbiased=False)
        ra, rb = ra / scale, rb / scale
        directions = torch.randn(projections, ra.shape[1], generator=generator).double()
        directions = directions / directions.norm(dim=1, keepdim=True)
        pa = (ra @ directions.T).sort(dim=0).values
        pb = (rb @ directions.T).sort(dim=0).values
        distances.append((pa - pb).abs().mean().item())
    return sum(distances) / len(distances)

values = [sliced_wasserstein(inputs["a"], inputs["b"], int(r), int(p), int(s)) for r, p, s in inputs["settings"].tolist()]
save_file({"values": torch.tensor(values, dtype=torch.float64)}, sys.argv[2])
]], { a = a, b = shifted[0.5], settings = torch.tensor(settings, { dtype = "int64" }) })
    local expected = out.values:tolist()
    for i, s in ipairs(settings) do
      expect_near(got[i], expected[i], 1e-6 * math.abs(expected[i]),
        string.format("resolution %d, %d projections, seed %d", s[1], s[2], s[3]))
    end
  end)
end)
