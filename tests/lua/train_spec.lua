-- runner.trainer from Lua: options, micro-batch splitting, schedules and EMA models, the non-finite guard
-- (skip and stop), errors from the loss function, early stopping and the batch-size finder on the CPU.
local home = runner.home()
os.execute("rm -rf '" .. home .. "'")

local function mlp()
  return nn.Sequential(nn.Linear(4, 8), nn.SiLU(), nn.Linear(8, 2))
end

local function regression(model, batch)
  local diff = model:forward(batch.data) - batch.target
  return (diff * diff):mean()
end

local function batch_of(n)
  return { data = torch.linspace(-1, 1, n * 4):reshape(n, 4), target = torch.zeros(n, 2), step = 1 }
end

describe("runner.trainer", function()
  it("steps, splits batches into micro-batches and reports lr, norm and steps", function()
    torch.manual_seed(1)
    local model = mlp()
    local train = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, warmup = 2, accumulate = 2,
                                   progress = false }
    local sizes = {}
    local out = train:step(batch_of(6), function(micro)
      sizes[#sizes + 1] = micro.data.shape[1]
      expect_eq(micro.step, 1, "other fields are shared")
      return regression(model, micro)
    end)
    expect_list(sizes, { 3, 3 })
    expect_eq(out.step, 1)
    expect_near(out.lr, 0.1 / 3, 1e-12, "the warmup's first step at lr / (warmup + 1)")
    expect_near(train:lr(), 0.2 / 3, 1e-12, "the warmup's second step")
    expect_true(out.grad_norm:item() > 0, "grad norm")
    expect_eq(out.skipped:item(), 0)
    expect_eq(train.step_count, 1)
    expect_true(out.timing.forward_backward >= 0 and out.timing.optimizer >= 0 and out.timing.ema >= 0, "timing")
    expect_eq(train:precision(), "fp32", "auto is fp32 on the CPU")
    expect_error(function() train:step(batch_of(5), function(m) return regression(model, m) end) end,
      "train:step: a batch of 5 does not split into 2 equal micro-batches (accumulate)", true)
  end)

  it("sets the learning rate the schedule scales from the next step on", function()
    local model = mlp()
    local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.1 }, warmup = 3, progress = false }
    local function step() return train:step(batch_of(2), function(b) return regression(model, b) end) end
    expect_near(step().lr, 0.1 / 4, 1e-12, "the warmup's first step")
    train:set_lr(0.02)
    expect_near(train:lr(), 0.02 * 2 / 4, 1e-12, "the warmup's second step of the new LR")
    expect_near(step().lr, 0.02 * 2 / 4, 1e-12, "the step uses it")
    train:set_lr(0.5, 1)
    expect_near(step().lr, 0.5 * 3 / 4, 1e-12, "group 1")
    expect_error(function() train:set_lr(0.1, 2) end, "parameter group 2 does not exist (the optimizer has 1)", true)
    expect_error(function() train:set_lr(-1) end, "train:set_lr: lr must be a finite number >= 0, got -1", true)
    -- What float32 does not hold is refused at once, and the run goes on with the LR it had.
    expect_error(function() train:set_lr(1e308) end,
      "train:set_lr: lr 1e+308 is more than float32, the dtype the optimizer applies learning rates in, holds "
      .. "(at most 3.4028235e+38)", true)
    expect_error(function() train:set_lr(0 / 0) end, "train:set_lr: lr must be a finite number >= 0, got nan", true)
    expect_near(step().lr, 0.5, 1e-12, "the step after the refused LRs uses the last one set")
  end)

  it("takes the schedule as a name, {kind, options} or {kind = ..., options}", function()
    local function lr_after_two(schedule)
      local model = mlp()
      local train = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, schedule = schedule, steps = 4,
                                     progress = false }
      for _ = 1, 2 do train:step(batch_of(2), function(b) return regression(model, b) end) end
      return train:lr()
    end
    -- After a 1-step warmup and 1 of 3 cosine steps: 0.1 * (1 + cos(pi / 3)) / 2.
    expect_near(lr_after_two { "cosine", warmup_steps = 1 }, 0.075, 1e-12)
    expect_near(lr_after_two { kind = "cosine", warmup_steps = 1 }, 0.075, 1e-12)
    expect_near(lr_after_two "cosine", 0.1 * (1 + math.cos(math.pi / 2)) / 2, 1e-12)
    expect_error(function() runner.trainer { model = mlp(), optimizer = { "adamw", lr = 1 }, schedule = { "cosine", kind = "linear" } } end,
      "runner.trainer: schedule names its kind twice (first entry and kind)", true)
    expect_error(function() runner.trainer { model = mlp(), optimizer = { "adamw", lr = 1 }, schedule = { kind = "cosine", 30 } } end,
      "'schedule' takes named options only, not the entry [1] = number (known: cooldown, eps, factor, gamma, kind, ", true)
    expect_error(function() runner.trainer { model = mlp(), optimizer = { "adamw", lr = 1 }, schedule = 5 } end,
      "schedule: expected an options table, got number", true)
  end)

  it("fills the EMA model with the average", function()
    torch.manual_seed(2)
    local model, average = mlp(), mlp()
    local train = runner.trainer { model = model, optimizer = { "sgd", lr = 0.5 }, ema = 0.5, ema_model = average,
                                   progress = false }
    local before = model:state_dict()["0.weight"]:clone()
    train:step(batch_of(4), function(b) return regression(model, b) end)
    -- the first update copies the weights (diffusers' decay is 0 at the first step)
    expect_close(train.ema:state_dict()["0.weight"], model:state_dict()["0.weight"], 0, 0, "copy at step 1")
    local after_one = model:state_dict()["0.weight"]:clone()
    train:step(batch_of(4), function(b) return regression(model, b) end)
    local expected = after_one * 0.5 + model:state_dict()["0.weight"] * 0.5
    expect_close(train.ema:state_dict()["0.weight"], expected, 1e-6, 1e-6, "decay 0.5 at step 2")
    expect_true(not torch.equal(before, after_one), "the model trained")
    local plain = runner.trainer { model = mlp(), optimizer = { "sgd", lr = 0.5 }, progress = false }
    expect_error(function() return plain.ema end, "pass ema_model = <another instance of the model>", true)
  end)

  -- A NaN step that were applied would leave NaN weights, so the weights are compared bit for bit (torch.equal is
  -- false for NaN), every parameter of the model.
  local function parameters_of(model)
    local copy = {}
    for name, p in model:named_parameters() do copy[name] = p:detach():clone() end
    return copy
  end
  local function expect_parameters_equal(model, expected, what)
    local compared = 0
    for name, p in model:named_parameters() do
      expect_true(p:detach():equal(expected[name]), what .. ": " .. name .. " bit for bit")
      compared = compared + 1
    end
    expect_eq(compared, 4, what .. ": parameters compared")
  end

  it("skips non-finite steps and counts them, leaving the weights bit for bit as they were", function()
    torch.manual_seed(3)
    local model = mlp()
    local skip = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, progress = false }
    local before = parameters_of(model)
    local out = skip:step(batch_of(4), function(b) return regression(model, b) * (0 / 0) end)
    expect_eq(out.skipped:item(), 1)
    expect_eq(skip.step_count, 1, "a skipped step still counts as a step")
    expect_parameters_equal(model, before, "after a NaN loss")
    out = skip:step(batch_of(4), function(b) return regression(model, b) * (1 / 0) end)
    expect_eq(out.skipped:item(), 2)
    expect_parameters_equal(model, before, "after an inf loss")
    -- A NaN added to the loss leaves its gradients finite: the loss alone says the step is bad.
    out = skip:step(batch_of(4), function(b) return regression(model, b) + (0 / 0) end)
    expect_eq(out.skipped:item(), 3)
    expect_parameters_equal(model, before, "after a NaN loss with finite gradients")
    -- The control: a finite step moves every parameter.
    out = skip:step(batch_of(4), function(b) return regression(model, b) end)
    expect_eq(out.skipped:item(), 3)
    for name, p in model:named_parameters() do
      expect_true(not p:detach():equal(before[name]), name .. " moved on a finite step")
      expect_eq(p:isfinite():logical_not():sum():item(), 0, name .. " finite")
    end
  end)

  it("with the fp16 loss scaler, skips a non-finite step bit for bit and backs off the scale", function()
    if test.device == "cpu" then skip("the loss scaler works with fp16, which needs a CUDA device (device=cuda runs this)") end
    torch.manual_seed(3)
    local model = mlp():to(test.device)
    local train = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, amp = "fp16", progress = false }
    local before = parameters_of(model)
    local batch = batch_of(4)
    batch.data, batch.target = batch.data:to(test.device), batch.target:to(test.device)
    local out = train:step(batch, function(b) return regression(model, b) * (0 / 0) end)
    expect_eq(out.skipped:item(), 1)
    expect_eq(out.loss_scale:item(), 32768, "backed off from 2^16")
    expect_parameters_equal(model, before, "after a NaN loss with the loss scaler")
    out = train:step(batch, function(b) return regression(model, b) end)
    expect_eq(out.skipped:item(), 1)
    for name, p in model:named_parameters() do
      expect_true(not p:detach():equal(before[name]), name .. " moved on a finite step")
    end
  end)

  it("stops one step after a non-finite step, with a report, both updates skipped", function()
    torch.manual_seed(3)
    local model = mlp()
    local stop = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, on_nonfinite = "stop",
                                  progress = false }
    stop:step(batch_of(4), function(b) return regression(model, b) end)
    local before = parameters_of(model)
    local out = stop:step(batch_of(4), function(b) return regression(model, b) * (1 / 0) end)
    expect_eq(out.step, 2, "the bad step returns: its stop is decided on the device")
    local ok, message = pcall(stop.step, stop, batch_of(4), function(b) return regression(model, b) end)
    expect_true(not ok, "stopped at the end of the next step")
    expect_true(message:find("non-finite values at step 2: loss per micro-batch [inf]; gradients: ", 1, true), message)
    expect_true(message:find("0.weight (norm ", 1, true), "names the gradients: " .. message)
    expect_true(message:find("parameters: none; inputs: ", 1, true), message)
    expect_true(message:find("data [4, 4] Float range [-1, 1]", 1, true), message)
    expect_true(message:find("stopped after step 3)", 1, true), message)
    expect_parameters_equal(model, before, "after the stop")
    -- Raised once: a script that catches it trains again.
    local again = stop:step(batch_of(4), function(b) return regression(model, b) end)
    expect_eq(again.skipped:item(), 2, "the bad step and the next one were skipped")
    for name, p in model:named_parameters() do
      expect_true(not p:detach():equal(before[name]), name .. " moved after the stop was raised")
    end
  end)

  it("raises a stop at the trainer's last step, before a checkpoint and when the run ends", function()
    local model = mlp()
    local last = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, on_nonfinite = "stop",
                                  progress = false, steps = 2 }
    last:step(batch_of(4), function(b) return regression(model, b) end)
    expect_error(function() last:step(batch_of(4), function(b) return regression(model, b) * (0 / 0) end) end,
      "non-finite values at step 2: loss per micro-batch [nan]", true)

    local run = runner.start({}, { seed = 5, name = "spec-nonfinite-stop" })
    local train = runner.trainer { model = model, optimizer = { "adamw", lr = 0.1 }, on_nonfinite = "stop",
                                   progress = false }
    run:restore { trainer = train }
    train:step(batch_of(4), function(b) return regression(model, b) * (1 / 0) end)
    expect_error(function() run:checkpoint() end, "non-finite values at step 1: loss per micro-batch [inf]", true)
    expect_eq(#runner.query("SELECT c.step FROM checkpoints c JOIN runs r ON r.run = c.run WHERE r.id = ?", run.id), 0, "no checkpoint of the stopped step")
    train:step(batch_of(4), function(b) return regression(model, b) * (1 / 0) end)
    expect_error(function() run:finish() end, "non-finite values at step 2", true)
    local rows = runner.query("SELECT status, error FROM runs WHERE id = ?", run.id)
    expect_eq(rows[1].status, "failed", "the run ends failed")
    expect_true(rows[1].error:find("non-finite values at step 2", 1, true), rows[1].error)
  end)

  it("reports bad options and bad losses where the script is", function()
    local model = mlp()
    expect_error(function() runner.trainer { model = model } end, "'optimizer' is required", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw" } } end,
      "the optimizer needs a learning rate", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "lion", lr = 1 } } end, "lion", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, amp = "fp16" } end,
      "amp 'fp16' needs a CUDA device", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, amp = "fp8" } end,
      "amp 'fp8' needs a CUDA device of compute capability 8.9 or later (FP8 tensor cores); this "
        .. "device is the CPU (use 'bf16' or 'fp32')", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, amp = "fp4" } end,
      "amp must be auto, bf16, fp16, fp32 or fp8, got 'fp4'", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, schedule = "cosine" } end,
      "a cosine schedule needs schedule.total_steps or the trainer's 'steps'", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, graph = "yes" } end,
      "runner.trainer: 'graph' must be true, false or \"auto\", got \"yes\"", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, graph = 1 } end,
      "runner.trainer: 'graph' must be true, false or \"auto\", got a number", true)
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, graph = true } end,
      "runner.trainer: graph = true, but CUDA graphs need a CUDA device; the model is on cpu", true)
    -- A config key declared graph = "auto" gets graph=true from the command line as the string "true".
    expect_error(function() runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, graph = "true" } end,
      "runner.trainer: graph = true, but CUDA graphs need a CUDA device; the model is on cpu", true)
    expect_eq(runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, graph = "false", progress = false }
      :graphs().captured, 0, "graph = \"false\" is off")
    local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1 }, progress = false }
    expect_error(function() train:step(function() return 3 end) end, "the loss function must return the loss tensor, got a number", true)
    expect_error(function() train:step(function() return torch.ones(2, { requires_grad = true }) end) end,
      "must return a floating-point scalar tensor, got [2] Float", true)
    expect_error(function() train:step(function() error("broken batch") end) end, "train_spec.lua:", true)
    expect_error(function() train:step(function() error("broken batch") end) end, "broken batch", true)
  end)
end)

describe("runner.trainer { graph = ... }", function()
  -- On the CPU every step runs eagerly and train:graphs() says why; on CUDA (device=cuda) the objective's steps are
  -- replayed from a graph after the warm-up steps, with the eager steps' losses.
  local function losses(graph, objective, device)
    torch.manual_seed(5)
    local model = nn.UNet { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4, dropout = 0,
                            classes = 3, class_dropout = 0.3 }:to(device)
    local d = objective == "flow" and runner.diffusion.flow { seed = 9, time = "logit_normal" }
      or runner.diffusion.gaussian { timesteps = 100, seed = 9 }
    local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-3 }, objective = d:objective(model),
                                   amp = "fp32", tf32 = false, ema = 0.99, accumulate = 2, graph = graph,
                                   progress = false }
    local out = {}
    for step = 1, 8 do
      torch.manual_seed(step)
      local batch = { data = torch.randn(8, 3, 8, 8):to(device), label = torch.randint(0, 3, { 8 }):to(device),
                      index = torch.arange(8 * step, 8 * step + 8), epoch = 1 }
      out[step] = train:step(batch).loss:item()
    end
    return out, train:graphs()
  end

  for _, objective in ipairs({ "ddpm", "flow" }) do
    it("on the CPU runs every step eagerly and says why (" .. objective .. ")", function()
      local eager = losses(false, objective, "cpu")
      local automatic, status = losses("auto", objective, "cpu")
      for i = 1, #eager do expect_eq(automatic[i], eager[i], "step " .. i) end
      expect_eq(status.captured, 0)
      expect_eq(status.replayed, 0)
      expect_eq(status.eager_reason, "CUDA graphs need a CUDA device; the model is on cpu")
    end)

    it("says that a model recomputing its activations is not captured, on any device (" .. objective .. ")", function()
      local model = nn.UNet { channels = 8, mults = { 1 }, blocks = 1, attention = {}, image = 8, groups = 4,
                              dropout = 0, checkpoint = true }:to(test.device)
      local d = objective == "flow" and runner.diffusion.flow { seed = 9 } or runner.diffusion.gaussian { seed = 9 }
      local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-3 }, objective = d:objective(model),
                                     amp = "fp32", graph = "auto", progress = false }
      for _ = 1, 4 do train:step({ data = torch.randn(4, 3, 8, 8):to(test.device) }) end
      local status = train:graphs()
      expect_eq(status.captured, 0)
      expect_eq(status.eager_reason, "the model recomputes activations (checkpoint = true), whose random-state swaps "
        .. "a CUDA graph cannot hold")
    end)

    it("replays the objective's steps from a CUDA graph with the eager steps' losses (" .. objective .. ")", function()
      if test.device == "cpu" then
        skip("needs a CUDA device (device=cuda): on the CPU both runs are eager, so nothing replayed is compared")
      end
      local eager = losses(false, objective, test.device)
      local replayed, status = losses("auto", objective, test.device)
      for i = 1, #eager do expect_near(replayed[i], eager[i], 1e-5 * math.abs(eager[i]), "step " .. i) end
      expect_eq(status.captured, 1, "one batch shape (after the EMA's first step and two warm-up steps)")
      expect_eq(status.replayed, 5, "steps 4 to 8")
      expect_eq(status.eager_reason, nil)
    end)
  end
end)

describe("runner.early_stopping", function()
  it("stops after patience observations without improvement", function()
    local stopper = runner.early_stopping { patience = 2, mode = "min", min_delta = 0.01 }
    local decisions = {}
    for _, value in ipairs({ 1.0, 0.9, 0.895, 0.95, 0.9 }) do decisions[#decisions + 1] = stopper:observe(value) end
    expect_list(decisions, { false, false, false, false, true })
    expect_eq(stopper.best, 0.9)
    local copy = runner.early_stopping { patience = 2 }
    copy:load_state(stopper:state())
    expect_eq(copy.bad, 3)
    expect_error(function() runner.early_stopping { mode = "lowest" } end, "mode must be 'min' or 'max'", true)
  end)
end)

describe("runner.find_batch_size", function()
  it("says that it does not apply on the CPU", function()
    local tried = false
    expect_eq(runner.find_batch_size { try = function() tried = true end, device = "cpu" }, nil)
    expect_true(not tried, "nothing was tried")
  end)
end)
