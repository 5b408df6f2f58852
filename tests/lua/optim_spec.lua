-- Spec: SGD, Adam and AdamW with parameter groups match torch.optim over 20 steps; clip_grad_norm.
local g = torch.load(test.golden("optimizers.safetensors"))
local F = nn.functional
local device = test.device
-- The losses go through a matmul, whose summation order depends on the machine's CPU kernels (and differs on
-- CUDA): they are compared to 1e-5 relative; the parameters to 1e-6.
local loss_rtol = 1e-5

local function train(kind, defaults, bias_group)
  local w = g.w0:clone():to(device):requires_grad_()
  local b = g.b0:clone():to(device):requires_grad_()
  bias_group.params = { b }
  local opt = optim[kind]({ { params = { w } }, bias_group }, defaults)
  local x, y = g.x:to(device), g.y:to(device)
  local losses = {}
  for step = 1, 20 do
    opt:zero_grad()
    local loss = F.mse_loss(F.linear(x, w, b), y)
    loss:backward()
    opt:step()
    losses[step] = loss:item()
  end
  return w, b, torch.tensor(losses, { dtype = "float64" }), opt
end

describe("optimizers against torch.optim", function()
  it("AdamW with two parameter groups matches to 1e-6 after 20 steps", function()
    local w, b, losses = train("AdamW", { lr = 1e-2, betas = { 0.9, 0.999 }, eps = 1e-8, weight_decay = 0.1 },
      { lr = 5e-2, weight_decay = 0 })
    expect_close(w, g["adamw.w"], 1e-6, 0, "weight")
    expect_close(b, g["adamw.b"], 1e-6, 0, "bias")
    expect_close(losses, g["adamw.losses"], 1e-6, loss_rtol, "losses")
  end)

  it("Adam matches to 1e-6", function()
    local w, b, losses = train("Adam", { lr = 1e-2, weight_decay = 0.01 }, { lr = 2e-2 })
    expect_close(w, g["adam.w"], 1e-6, 0, "weight")
    expect_close(b, g["adam.b"], 1e-6, 0, "bias")
    expect_close(losses, g["adam.losses"], 1e-6, loss_rtol, "losses")
  end)

  it("SGD with momentum matches to 1e-6", function()
    local w, b, losses = train("SGD", { lr = 0.1, momentum = 0.9, weight_decay = 1e-3 }, { lr = 0.05, momentum = 0.5 })
    expect_close(w, g["sgd.w"], 1e-6, 0, "weight")
    expect_close(b, g["sgd.b"], 1e-6, 0, "bias")
    expect_close(losses, g["sgd.losses"], 1e-6, loss_rtol, "losses")
  end)
end)

describe("optimizer API", function()
  it("takes a module, reads and sets learning rates per group", function()
    local model = nn.Linear(3, 2)
    local opt = optim.AdamW(model, { lr = 3e-4 })
    expect_eq(opt:group_count(), 1)
    expect_near(opt:lr(), 3e-4, 1e-12)
    opt:set_lr(1e-3)
    expect_near(opt:lr(1), 1e-3, 1e-12)
    expect_error(function() opt:lr(2) end, "bad argument #1 to 'lr' (group 2 out of range (the optimizer has 1 groups))", true)
  end)

  it("zero_grad clears gradients to nil", function()
    local model = nn.Linear(3, 2)
    local opt = optim.SGD(model, { lr = 0.1 })
    model(torch.ones(1, 3)):sum():backward()
    opt:zero_grad()
    expect_eq(model:parameters()[1].grad, nil)
  end)

  it("reports bad options and inputs", function()
    local model = nn.Linear(3, 2)
    expect_error(function() optim.AdamW(model, { learning_rate = 1 }) end,
      here(-1) .. "unknown option 'learning_rate' to 'AdamW' (known: amsgrad, betas, eps, lr, params, weight_decay)")
    expect_error(function() optim.SGD(model, {}) end, here() .. "SGD: option 'lr' is required")
    -- Every optimizer: no silent default learning rate.
    expect_error(function() optim.AdamW(model) end, here() .. "AdamW: option 'lr' is required")
    expect_error(function() optim.Adam({ { params = { model.weight }, lr = 1e-3 }, { params = { model.bias } } }) end,
      here(-1) .. "Adam: option 'lr' is required (in the options, or in parameter group 2)")
    expect_error(function() optim.Adam({ torch.ones(2) }, { lr = 1e-3 }) end,
      here(-1) .. "parameter group 1 holds a tensor that is not a leaf requiring grad")
  end)

  it("numbers groups and parameters from 1 in every message", function()
    local a, b = nn.Linear(3, 2), nn.Linear(2, 1)
    expect_error(function() optim.AdamW({ { params = a }, { params = b, eps = -1 } }, { lr = 1e-3 }) end,
      here(-1) .. "optimizer group 2: eps must be >= 0, got -1")
    expect_error(function() optim.AdamW({ { params = a }, { params = a } }, { lr = 1e-3 }) end,
      here(-1) .. "optimizer group 2: parameter 1 appears more than once")
    local opt = optim.SGD({ { params = a }, { params = b } }, { lr = 0.1 })
    expect_error(function() opt:set_lr(-1, 2) end, here() .. "optimizer group 2: lr must be a finite number >= 0, got -1")
    expect_error(function() opt:set_lr(1e39, 2) end, here() .. "optimizer group 2: lr 1e+39 is more than float32, "
      .. "the dtype the optimizer applies learning rates in, holds (at most 3.4028235e+38)")
    expect_error(function() optim.SGD(a, { lr = 1 / 0 }) end, here() .. "optimizer group 1: lr must be a finite number >= 0, got inf")
  end)

  it("clip_grad_norm returns the total norm and scales gradients down to max_norm", function()
    local p = torch.zeros(2, { requires_grad = true })
    p.grad = torch.tensor({ 3, 4 })
    local norm = optim.clip_grad_norm({ p }, 1.0)
    expect_near(norm, 5, 1e-6)
    expect_near(p.grad:norm():item(), 1, 1e-5)
    local model = nn.Linear(2, 1)
    model(torch.ones(1, 2)):sum():backward()
    expect_true(optim.clip_grad_norm(model, 100) > 0, "takes a module")
  end)
end)
