---@meta
-- The `torch` namespace: tensors, constructors, autograd, seeding and safetensors files.
-- Positions written as Lua numbers are 1-based (dims, indices, slices; negatives count from the end).
-- Tensor contents are never shifted: argmax results, class targets and embedding ids are 0-based, as in
-- PyTorch, so data files and checkpoints mean the same in both.

---@alias Dtype "float32"|"float64"|"float16"|"bfloat16"|"int64"|"int32"|"int16"|"int8"|"uint8"|"bool"
---@alias Device string  # "cpu", "cuda", "cuda:N" or "auto" (first GPU if any, else cpu)
---@alias Sizes integer[]|integer  # a table of sizes, or the sizes as separate arguments
---@alias Operand Tensor|number|boolean

---@class TensorOptions
---@field dtype? Dtype     # default float32 (int64 for randint and integral arange)
---@field device? Device   # default cpu
---@field requires_grad? boolean

---@class torch
---@field float32 Dtype
---@field float64 Dtype
---@field float16 Dtype
---@field bfloat16 Dtype
---@field int64 Dtype
---@field int32 Dtype
---@field int16 Dtype
---@field int8 Dtype
---@field uint8 Dtype
---@field bool Dtype
torch = {}

--- Tensor of zeros. `torch.zeros(2, 3)`, `torch.zeros({2, 3}, {dtype = "float64"})`.
---@param ... Sizes|TensorOptions
---@return Tensor
function torch.zeros(...) end
---@return Tensor
function torch.ones(...) end
--- Uninitialized memory.
---@return Tensor
function torch.empty(...) end
--- Uniform on [0, 1).
---@return Tensor
function torch.rand(...) end
--- Standard normal.
---@return Tensor
function torch.randn(...) end
---@param sizes Sizes
---@param value number
---@param options? TensorOptions
---@return Tensor
function torch.full(sizes, value, options) end
--- Integers in [low, high), int64 unless options.dtype says otherwise.
---@return Tensor
function torch.randint(low, high, sizes, options) end
--- Half-open [start, stop) with step, as PyTorch: `torch.arange(5)` is 0..4.
---@return Tensor
function torch.arange(start_or_stop, stop, step, options) end
---@return Tensor
function torch.linspace(start, stop, steps, options) end
---@return Tensor
function torch.eye(rows, columns, options) end
--- From nested tables of numbers (float32 unless dtype is given) or booleans (bool).
---@param data table|number|boolean|Tensor
---@param options? TensorOptions
---@return Tensor
function torch.tensor(data, options) end
---@return Tensor
function torch.zeros_like(t, options) end
---@return Tensor
function torch.ones_like(t, options) end
---@return Tensor
function torch.empty_like(t, options) end
---@return Tensor
function torch.rand_like(t, options) end
---@return Tensor
function torch.randn_like(t, options) end
---@return Tensor
function torch.full_like(t, value) end

--- Concatenates along an existing dim (default 1).
---@param tensors Tensor[]
---@param dim? integer
---@return Tensor
function torch.cat(tensors, dim) end
--- Stacks along a new dim (default 1).
---@return Tensor
function torch.stack(tensors, dim) end
--- Elementwise choice: condition ? a : b; a and b may be numbers.
---@return Tensor
function torch.where(condition, a, b) end

--- Calls fn(...) with gradient recording off and returns its results; grad mode is restored on errors.
---@param fn function
---@return any ...
function torch.no_grad(fn, ...) end
--- Calls fn(...) with gradient recording on.
function torch.enable_grad(fn, ...) end
---@return boolean
function torch.is_grad_enabled() end

--- Seeds the CPU and every CUDA generator.
---@param seed integer
function torch.manual_seed(seed) end
--- The CPU generator's seed: the last torch.manual_seed, or LibTorch's default.
---@return integer
function torch.initial_seed() end
---@return boolean
function torch.is_tensor(value) end
--- Resolves a device name: torch.device("auto") is "cuda:0" or "cpu".
---@param name Device
---@return string
function torch.device(name) end
function torch.set_num_threads(n) end
---@return integer
function torch.get_num_threads() end
--- Bytes of tensor storage held by Lua-owned tensors (the Lua GC is driven by this count).
---@return number
function torch.held_bytes() end

--- Writes tensors to a safetensors file (readable by Python's safetensors), atomically: a temporary
--- file, fsync, rename. Tensors are written in name order; any device, any layout. A path ending in .npz writes a
--- NumPy archive instead (as np.savez; np.load reads it), without metadata.
---@param tensors table<string, Tensor>
---@param path string
---@param metadata? table<string, string|number>
function torch.save(tensors, path, metadata) end
--- Reads a safetensors file into CPU tensors, or a torch.save file (.pt, .pth, .ckpt; PyTorch's zip format
--- and the legacy format before 1.6) through runner's own restricted unpickler, which runs no code: its dicts become tables (string or
--- integer keys), lists and tuples arrays, tensors CPU tensors, numbers, strings and booleans themselves, None
--- nil, an argparse.Namespace (the `args` of DiT's train.py checkpoints) a table of its attributes; metadata is
--- then {format = "pytorch"}. Any other Python object is refused with its class name. An .npz (np.savez) gives
--- its arrays by name, metadata {format = "npz"}.
--- Malformed files raise an error naming the path.
---@param path string
---@return table tensors
---@return table<string, string> metadata
function torch.load(path) end

torch.cuda = {}
---@return boolean
function torch.cuda.is_available() end
---@return integer
function torch.cuda.device_count() end
function torch.cuda.synchronize(device_index) end
--- With an argument, allows or forbids TF32 in float32 matrix multiplications and convolutions on CUDA (cuBLAS
--- and cuDNN: about 3 decimal digits instead of 7, several times faster); returns whether both use it. Like
--- PyTorch, convolutions start with TF32 on and matmuls off; `runner.trainer` sets both from its `tf32` option.
---@param enabled? boolean
---@return boolean
function torch.cuda.tf32(enabled) end
--- Bytes held by tensors on CUDA device `device_index` (default 0), as torch.cuda.memory_allocated.
---@param device_index? integer
---@return number
function torch.cuda.memory_allocated(device_index) end
--- The most bytes held by tensors on the device since the start or the last reset_peak_memory_stats.
---@param device_index? integer
---@return number
function torch.cuda.max_memory_allocated(device_index) end
---@param device_index? integer
function torch.cuda.reset_peak_memory_stats(device_index) end

--- Every Tensor method below is also a torch function taking the tensor first: torch.exp(t) == t:exp().

---@class Tensor
---@field shape integer[]   # sizes, a new table each read; tostring gives [2, 3]
---@field dtype Dtype
---@field device string     # "cpu", "cuda:0", ...
---@field grad Tensor|nil   # assignable; nil clears it
---@field requires_grad boolean  # assignable
---@field is_leaf boolean
---@field ndim integer
--- Indexing: t[i] selects along dim 1; t[{i, j}] selects several dims; an element may be a number,
--- {first, last [, step]} (inclusive, 1-based, negatives from the end), {} or ":" (whole dim), {i}
--- (just i, keeping the dim), "..." (the remaining dims), or a bool mask / int64 index tensor.
--- Assignment t[...] = number|Tensor writes in place.
--- Operators: + - * / ^ % and unary -, numbers on either side; # is the size of dim 1.
--- Comparisons are methods (Lua's < cannot be elementwise): eq ne lt le gt ge.
local Tensor = {}

---@return number|boolean
function Tensor:item() end
--- Nested tables of numbers (booleans for bool tensors).
---@return table|number|boolean
function Tensor:tolist() end
--- Moves or converts: t:to("cuda"), t:to("float16"), t:to(other), t:to(ToOptions).
---@return Tensor
function Tensor:to(...) end

---@class ToOptions
---@field dtype? Dtype            default: the tensor's
---@field device? Device          default: the tensor's
---@field non_blocking? boolean   default false
---@field copy? boolean           default false

---@return Tensor
function Tensor:float() end
---@return Tensor
function Tensor:double() end
---@return Tensor
function Tensor:half() end
---@return Tensor
function Tensor:bfloat16() end
---@return Tensor
function Tensor:long() end
---@return Tensor
function Tensor:int() end
---@return Tensor
function Tensor:byte() end
---@return Tensor
function Tensor:bool() end
---@return Tensor
function Tensor:cpu() end
---@param device? Device default "cuda"
---@return Tensor
function Tensor:cuda(device) end
---@return Tensor
function Tensor:clone() end
--- Shares storage, no graph.
---@return Tensor
function Tensor:detach() end
---@return Tensor
function Tensor:contiguous() end

--- Backpropagates from this tensor. gradient is needed for non-scalar tensors.
---@param gradient? Tensor
---@param options? BackwardOptions
function Tensor:backward(gradient, options) end

---@class BackwardOptions
---@field retain_graph? boolean  default: create_graph
---@field create_graph? boolean  default false

---@param flag? boolean default true
---@return Tensor self
function Tensor:requires_grad_(flag) end
---@return Tensor self
function Tensor:retain_grad() end
--- Replaces the data behind this tensor (shape, dtype, device may change) keeping its identity.
---@return Tensor self
function Tensor:set_data(other) end

---@param other Operand
---@param alpha? number
---@return Tensor
function Tensor:add(other, alpha) end
---@return Tensor
function Tensor:sub(other, alpha) end
---@return Tensor
function Tensor:mul(other) end
---@return Tensor
function Tensor:div(other) end
---@return Tensor
function Tensor:pow(other) end
---@return Tensor
function Tensor:remainder(other) end
---@return Tensor
function Tensor:fmod(other) end
---@return Tensor
function Tensor:maximum(other) end
---@return Tensor
function Tensor:minimum(other) end
---@return Tensor
function Tensor:atan2(other) end
---@return Tensor
function Tensor:matmul(other) end
---@return Tensor
function Tensor:mm(other) end
---@return Tensor
function Tensor:bmm(other) end
---@return Tensor
function Tensor:dot(other) end
---@return Tensor
function Tensor:outer(other) end
---@return Tensor
function Tensor:lerp(finish, weight) end
--- In place, returning self: add_ sub_ mul_ div_ pow_ copy_ fill_ zero_ clamp_ lerp_ normal_(mean, std)
--- uniform_(low, high) relu_ neg_ exp_ sqrt_ detach_.
---@return Tensor self
function Tensor:add_(other, alpha) end
---@return Tensor self
function Tensor:copy_(source) end
---@return Tensor self
function Tensor:fill_(value) end
---@return Tensor self
function Tensor:normal_(mean, std) end
---@return Tensor self
function Tensor:uniform_(low, high) end

--- Elementwise comparisons returning bool tensors; other may be a number.
---@return Tensor
function Tensor:eq(other) end
---@return Tensor
function Tensor:ne(other) end
---@return Tensor
function Tensor:lt(other) end
---@return Tensor
function Tensor:le(other) end
---@return Tensor
function Tensor:gt(other) end
---@return Tensor
function Tensor:ge(other) end
---@return Tensor
function Tensor:logical_and(other) end
---@return Tensor
function Tensor:logical_or(other) end
---@return Tensor
function Tensor:logical_not() end
--- Same shape and values.
---@return boolean
function Tensor:equal(other) end
--- |a - b| <= atol + rtol * |b| everywhere (defaults 1e-5, 1e-8).
---@return boolean
function Tensor:allclose(other, rtol, atol) end

--- Elementwise math: abs neg exp log log2 log10 log1p expm1 sqrt rsqrt square reciprocal sin cos tan
--- asin acos atan sinh cosh tanh sigmoid relu silu mish softplus erf floor ceil round trunc frac sign
--- isnan isinf isfinite.
---@return Tensor
function Tensor:exp() end
---@param approximate? "none"|"tanh"
---@return Tensor
function Tensor:gelu(approximate) end
---@return Tensor
function Tensor:leaky_relu(negative_slope) end
--- Either bound may be nil.
---@return Tensor
function Tensor:clamp(min, max) end
--- Along dim (default -1, the last).
---@return Tensor
function Tensor:softmax(dim) end
---@return Tensor
function Tensor:log_softmax(dim) end
---@return Tensor
function Tensor:masked_fill(mask, value) end
---@return Tensor
function Tensor:tril(diagonal) end
---@return Tensor
function Tensor:triu(diagonal) end

--- Reductions over all dims, one dim or a table of dims: sum nansum mean amax amin var std logsumexp
--- count_nonzero take (dims, keepdim); prod all any take (dim, keepdim).
---@param dims? integer|integer[]
---@param keepdim? boolean
---@return Tensor
function Tensor:sum(dims, keepdim) end
---@return Tensor
function Tensor:mean(dims, keepdim) end
--- t:max() is a 0-dim tensor; t:max(dim [, keepdim]) returns values and 0-based indices;
--- t:max(other) is the elementwise maximum. Same for min.
---@return Tensor values
---@return Tensor? indices
function Tensor:max(dim_or_other, keepdim) end
---@return Tensor values
---@return Tensor? indices
function Tensor:min(dim_or_other, keepdim) end
--- 0-based index contents.
---@return Tensor
function Tensor:argmax(dim, keepdim) end
---@return Tensor
function Tensor:argmin(dim, keepdim) end
---@param p? number default 2
---@return Tensor
function Tensor:norm(p, dims, keepdim) end
---@return Tensor
function Tensor:cumsum(dim) end
---@return Tensor
function Tensor:cumprod(dim) end
--- Sorted along dim (default last): values and 0-based indices.
---@return Tensor, Tensor
function Tensor:sort(dim, descending) end
---@return Tensor, Tensor
function Tensor:topk(k, dim, largest) end

--- Sizes as a table (tostring gives [2, 3]), or one size.
---@param dim? integer
---@return integer[]|integer
function Tensor:size(dim) end
---@return integer
function Tensor:dim() end
---@return integer
function Tensor:numel() end
---@return integer
function Tensor:element_size() end
---@return boolean
function Tensor:is_contiguous() end
--- Sizes (not dims): -1 infers one size.
---@return Tensor
function Tensor:view(...) end
---@return Tensor
function Tensor:reshape(...) end
--- -1 keeps a size.
---@return Tensor
function Tensor:expand(...) end
---@return Tensor
function Tensor:tile(...) end
---@return Tensor
function Tensor:expand_as(other) end
---@return Tensor
function Tensor:view_as(other) end
---@return Tensor
function Tensor:type_as(other) end
--- 1-based dims: t:permute(3, 1, 2).
---@return Tensor
function Tensor:permute(...) end
---@return Tensor
function Tensor:transpose(dim1, dim2) end
--- 2-D transpose.
---@return Tensor
function Tensor:t() end
---@return Tensor
function Tensor:flip(...) end
--- Inclusive 1-based range of dims, defaults 1 and -1.
---@return Tensor
function Tensor:flatten(start_dim, end_dim) end
---@return Tensor
function Tensor:unflatten(dim, sizes) end
--- dim in 1..ndim+1, or negative (-1 appends).
---@return Tensor
function Tensor:unsqueeze(dim) end
---@return Tensor
function Tensor:squeeze(dim) end
--- start is 1-based.
---@return Tensor
function Tensor:narrow(dim, start, length) end
--- index is 1-based.
---@return Tensor
function Tensor:select(dim, index) end
---@return Tensor[]
function Tensor:chunk(n, dim) end
---@param size integer|integer[]
---@return Tensor[]
function Tensor:split(size, dim) end
--- index holds 0-based contents.
---@return Tensor
function Tensor:index_select(dim, index) end
---@return Tensor
function Tensor:gather(dim, index) end
