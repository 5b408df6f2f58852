-- What diffusion_spec and flow_spec check alike of a training objective: `local checks = dofile("tests/lua/objective_checks.lua")`.
local checks = {}

--- A small UNet whose weights are all random (a fresh UNet's zero conv_out makes its output 0 whatever the input).
function checks.random_unet(options, seed)
  torch.manual_seed(seed)
  local unet = nn.UNet(options)
  local state = {}
  for key, value in pairs(unet:state_dict()) do state[key] = torch.randn(value.shape) * 0.2 end
  unet:load_state_dict(state)
  return unet
end

-- Three epochs of one indexed batch, then the batch without indices (it takes the running keys of the objective's
-- streams), with accumulation 2: stepping the objective in C++, or calling obj:loss from a Lua function.
local function train_steps(make_objective, options, batch, use_objective)
  local model = checks.random_unet(options, 6)
  local objective = make_objective()
  local train = runner.trainer { model = model, optimizer = { "adamw", lr = 1e-2 }, accumulate = 2, progress = false,
                                 objective = use_objective and objective:objective(model) or nil }
  local function step(micro_batch)
    local out = use_objective and train:step(micro_batch)
                or train:step(micro_batch, function(micro) return objective:loss(model, micro) end)
    return out.loss:item()
  end
  local losses = {}
  for epoch = 1, 3 do
    losses[epoch] = step { data = batch.data, label = batch.label, index = batch.index, epoch = epoch }
  end
  losses[4] = step { data = batch.data, label = batch.label }
  return losses, model:state_dict(), objective:stream_counter()
end

--- Two trainers from the same weights and seeds, one stepping make_objective():objective(model) in C++, one calling
--- its loss from a Lua function, give the same losses and weights bit for bit (the same draws and the same float32
--- operations) and use the same running keys (one batch of 8 without indices). Returns the losses.
function checks.objective_steps_as_its_loss_function(make_objective, options, batch)
  local losses, weights, counter = train_steps(make_objective, options, batch, true)
  local expected_losses, expected_weights, expected_counter = train_steps(make_objective, options, batch, false)
  expect_list(losses, expected_losses, "losses")
  expect_eq(counter, expected_counter, "running keys used")
  expect_eq(counter, 8, "one batch of 8 without indices")
  for name, tensor in pairs(expected_weights) do expect_true(weights[name]:equal(tensor), name .. " bit for bit") end
  return losses
end

return checks
