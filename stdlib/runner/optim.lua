-- Optimizers over modules, parameter lists or parameter groups (the trainer's optimizers: PyTorch's foreach
-- math, fused kernels on CUDA; runner.trainer takes them). Extends the global `optim`.
local new_optimizer = optim._new
optim._new = nil

-- A module's parameters that train (fixed ones such as DiT's pos_embed, which do not require grad, are left
-- out, as PyTorch's optimizers skip them).
local function parameter_list(value, where)
  if nn.is_module(value) then
    local trainable = {}
    for _, p in ipairs(value:parameters()) do
      if p.requires_grad then trainable[#trainable + 1] = p end
    end
    return trainable
  end
  if type(value) == "table" then return value end
  error(string.format("%s: expected a module, a list of tensors or a list of parameter groups", where), 3)
end

-- A module, a list of tensors, or a list of groups {params = module_or_list, lr = ..., ...}.
local function param_groups(target, kind)
  if type(target) == "table" and not nn.is_module(target) and type(target[1]) == "table"
      and not torch.is_tensor(target[1]) and not nn.is_module(target[1]) then
    local groups = {}
    for i, group in ipairs(target) do
      local copy = {}
      for k, v in pairs(group) do copy[k] = v end
      if group.params == nil then error(string.format("%s: parameter group %d has no params", kind, i), 3) end
      copy.params = parameter_list(group.params, kind)
      groups[i] = copy
    end
    return groups
  end
  return { { params = parameter_list(target, kind) } }
end

for _, kind in ipairs({ "SGD", "Adam", "AdamW" }) do
  optim[kind] = function(target, options)
    return new_optimizer(string.lower(kind), param_groups(target, kind), options or {})
  end
end

local clip = optim.clip_grad_norm
--- optim.clip_grad_norm(module_or_params, max_norm [, norm_type = 2]) -> total norm before clipping
function optim.clip_grad_norm(target, max_norm, norm_type)
  return clip(parameter_list(target, "clip_grad_norm"), max_norm, norm_type)
end

return optim
