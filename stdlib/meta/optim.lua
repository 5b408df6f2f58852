---@meta
-- The `optim` namespace: optimizers with parameter groups, and gradient clipping.

---@class optim
optim = {}

--- What an optimizer optimizes: a module, a list of tensors, or a list of parameter groups
--- {params = module_or_tensors, <options overriding the defaults for this group>}.
---@alias ParamsOrGroups Module|Tensor[]|table[]

---@class Optimizer
local Optimizer = {}
function Optimizer:step() end
--- Clears gradients (to nil by default, as PyTorch's set_to_none=True).
---@param set_to_none? boolean default true
function Optimizer:zero_grad(set_to_none) end
--- Learning rate of a group (1-based, default 1).
---@return number
function Optimizer:lr(group) end
--- Sets the learning rate of one group, or of all groups when none is named.
function Optimizer:set_lr(lr, group) end
---@return integer
function Optimizer:group_count() end
---@return string kind "sgd", "adam" or "adamw"
function Optimizer:kind() end

---@class SGDOptions
---@field params? ParamsOrGroups  in a group table: the group's parameters
---@field lr number               required
---@field momentum? number        default 0
---@field dampening? number       default 0
---@field weight_decay? number    L2 term added to the gradient (default 0)
---@field nesterov? boolean       default false

---@class AdamOptions
---@field params? ParamsOrGroups  in a group table: the group's parameters
---@field lr number               required (here or in every group table)
---@field betas? number[]         default {0.9, 0.999}
---@field eps? number             default 1e-8
---@field weight_decay? number    L2 term added to the gradient (default 0)
---@field amsgrad? boolean        default false

---@class AdamWOptions
---@field params? ParamsOrGroups  in a group table: the group's parameters
---@field lr number               required (here or in every group table)
---@field betas? number[]         default {0.9, 0.999}
---@field eps? number             default 1e-8
---@field weight_decay? number    decoupled weight decay (default 1e-2, as torch.optim.AdamW)
---@field amsgrad? boolean        default false

--- The optimizers are PyTorch's (torch.optim with foreach=True off CUDA, fused=True on CUDA: the same results,
--- bit for bit on the CPU), and they are the trainer's: runner.trainer{optimizer = optim.AdamW(model, ...)}.
--- Group tables override the defaults given in `options` for their parameters. Every optimizer needs its learning
--- rate (`lr` in `options`, or in every group table): runner takes no default learning rate in silence.

--- SGD; lr is required.
---@param params ParamsOrGroups
---@param options SGDOptions
---@return Optimizer
function optim.SGD(params, options) end
--- Adam; lr is required.
---@param params ParamsOrGroups
---@param options AdamOptions
---@return Optimizer
function optim.Adam(params, options) end
--- AdamW, decoupled weight decay; lr is required.
---@param params ParamsOrGroups
---@param options AdamWOptions
---@return Optimizer
function optim.AdamW(params, options) end

--- Scales gradients so their total norm is at most max_norm; returns the norm before clipping.
---@param params Module|Tensor[]
---@param max_norm number
---@param norm_type? number default 2
---@return number
function optim.clip_grad_norm(params, max_norm, norm_type) end
