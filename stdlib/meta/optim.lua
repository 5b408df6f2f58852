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

--- SGD; lr is required.
---@param params ParamsOrGroups
---@param options {lr: number, momentum?: number, dampening?: number, weight_decay?: number, nesterov?: boolean}
---@return Optimizer
function optim.SGD(params, options) end
--- Adam (defaults lr 1e-3, betas {0.9, 0.999}, eps 1e-8, weight_decay 0, amsgrad false).
---@param params ParamsOrGroups
---@param options? {lr?: number, betas?: number[], eps?: number, weight_decay?: number, amsgrad?: boolean}
---@return Optimizer
function optim.Adam(params, options) end
--- AdamW, decoupled weight decay (defaults lr 1e-3, betas {0.9, 0.999}, eps 1e-8, weight_decay 1e-2).
---@param params ParamsOrGroups
---@param options? {lr?: number, betas?: number[], eps?: number, weight_decay?: number, amsgrad?: boolean}
---@return Optimizer
function optim.AdamW(params, options) end

--- Scales gradients so their total norm is at most max_norm; returns the norm before clipping.
---@param params Module|Tensor[]
---@param max_norm number
---@param norm_type? number default 2
---@return number
function optim.clip_grad_norm(params, max_norm, norm_type) end
