---@meta
-- The `nn` namespace: built-in modules (LibTorch's), Lua-defined modules, module trees and state dicts.

---@class nn
nn = {}

---@class Module
--- Every module, built-in or Lua-defined, has these methods; calling a module runs its forward.
--- Parameters, buffers and child modules are fields, as in PyTorch: `nn.Linear(3, 2).weight` is the module's own
--- weight tensor (not a copy), `dit.blocks[1].attn.qkv.bias` is `dit:state_dict()["blocks.0.attn.qkv.bias"]`
--- (a number indexes children named "0", "1", ... from 1, as in Sequential). A built-in model's child of a type
--- that nn.* builds (Linear, Conv2d, norms, Embedding, activations) can be called; other parts cannot.
local Module = {}
---@return Tensor
function Module:forward(...) end
--- Iterator over (name, parameter): own parameters first, then each child's, PyTorch's order and names.
---@return fun(): string, Tensor
function Module:named_parameters() end
---@return Tensor[]
function Module:parameters() end
---@return fun(): string, Tensor
function Module:named_buffers() end
---@return fun(): string, Module
function Module:children() end
---@return integer
function Module:num_parameters() end
--- Sets training mode recursively (dropout active). Returns self.
---@param mode? boolean default true
---@return Module
function Module:train(mode) end
---@return Module
function Module:eval() end
---@return boolean
function Module:is_training() end
--- Moves or converts parameters and buffers in place (parameters keep their identity, so optimizers
--- made before stay valid): m:to("cuda"), m:to("bfloat16"). Returns self.
---@return Module
function Module:to(...) end
--- name -> detached tensor, parameters and buffers.
---@return table<string, Tensor>
function Module:state_dict() end
--- Copies values in place. With strict (default) missing or unexpected keys are errors; shape
--- mismatches always are. The error lists every problem.
---@param state table<string, Tensor>
---@param options? LoadStateOptions
---@return Module
function Module:load_state_dict(state, options) end
---@class LoadStateOptions
---@field strict? boolean  default true

--- Writes the state dict as a safetensors file (atomically).
---@param path string
---@param metadata? table<string, string>
function Module:save(path, metadata) end
--- Loads a state dict from a safetensors file or a torch.save file (.pt/.pth, e.g. the official
--- DiT-XL-2-256x256.pt; read without running any code, see torch.load). A file that holds several tables
--- (a training checkpoint with model, ema, opt, ...; the checkpoints of DiT's train.py, whose `args` is an
--- argparse.Namespace, too) needs `key` to pick one. Returns the file's metadata.
---@param path string
---@param options? ModuleLoadOptions
---@return table<string, string>
function Module:load(path, options) end
---@class ModuleLoadOptions
---@field strict? boolean  default true
---@field key? string      the entry of a file that holds several tables

--- Lua-defined modules: a tensor saved in the state dict and moved by :to(), but not trained.
function Module:register_buffer(name, tensor) end

--- A new module class. Assigning a module or nn.Parameter to a field of an instance registers it
--- (in assignment order); other values are plain fields.
---
--- Example:
---     local MLP = nn.Module("MLP")
---     function MLP:init(dim) self.fc = nn.Linear(dim, dim); self.scale = nn.Parameter(torch.ones(dim)) end
---     function MLP:forward(x) return self.fc(x) * self.scale end
---     local m = MLP(4)
---@param name string
---@param parent? table a class made by nn.Module to inherit from
---@return table class  # call it to make an instance; define init and forward on it
function nn.Module(name, parent) end
--- A leaf tensor that requires grad, registered as a parameter when assigned to a module field.
---@return Tensor
function nn.Parameter(tensor) end
---@return boolean
function nn.is_module(value) end

--- Applies children in order. Children are named "0", "1", ... as in PyTorch (state dicts match);
--- seq[1] is the first child.
---@return Module
function nn.Sequential(...) end

---@param options? LinearOptions
---@return Module
function nn.Linear(in_features, out_features, options) end
---@class LinearOptions
---@field bias? boolean  default true

---@param kernel_size integer|integer[]
---@param options? Conv2dOptions
---@return Module
function nn.Conv2d(in_channels, out_channels, kernel_size, options) end
---@class Conv2dOptions
---@field stride? integer|integer[]    default 1
---@field padding? integer|integer[]   default 0
---@field dilation? integer|integer[]  default 1
---@field groups? integer              default 1
---@field bias? boolean                default true
---@field padding_mode? "zeros"|"reflect"|"replicate"|"circular"  default "zeros"

---@param options? GroupNormOptions
---@return Module
function nn.GroupNorm(num_groups, num_channels, options) end
---@class GroupNormOptions
---@field eps? number      default 1e-5
---@field affine? boolean  default true

---@param normalized_shape integer|integer[]
---@param options? LayerNormOptions
---@return Module
function nn.LayerNorm(normalized_shape, options) end
---@class LayerNormOptions
---@field eps? number                  default 1e-5
---@field elementwise_affine? boolean  default true

--- ids are 0-based int64 contents.
---@param options? EmbeddingOptions
---@return Module
function nn.Embedding(num_embeddings, embedding_dim, options) end
---@class EmbeddingOptions
---@field padding_idx? integer  the id whose embedding stays zero and gets no gradient (default none)

---@param p? number default 0.5
---@return Module
function nn.Dropout(p) end
---@param options? GELUOptions
---@return Module
function nn.GELU(options) end
---@class GELUOptions
---@field approximate? "none"|"tanh"  default "none"

---@return Module
function nn.LeakyReLU(negative_slope) end
---@return Module
function nn.ReLU() end
---@return Module
function nn.SiLU() end
---@return Module
function nn.Tanh() end
---@return Module
function nn.Sigmoid() end
---@return Module
function nn.Mish() end
---@return Module
function nn.Identity() end

--- The DDPM UNet of Ho et al. (2020); names, layout and initialisation in docs/models-and-diffusion.md.
--- Called as `unet(x [B, C, H, W], t [B] int64 timesteps or one number, labels [B] int64 | nil)`.
--- Defaults are the paper's CIFAR-10 model (35.7M parameters). With `classes > 0` the model is
--- class-conditional and label id `classes` means "no label" (classifier-free guidance).
---@param options? UNetOptions
---@return Denoiser
function nn.UNet(options) end

---@class UNetOptions
---@field channels? integer         base channel count (default 128)
---@field mults? integer[]          channel multiplier per resolution level (default {1, 2, 2, 2})
---@field blocks? integer           residual blocks per level on the way down, one more up (default 2)
---@field attention? integer[]|integer  resolutions with self-attention (default {16})
---@field dropout? number           dropout in the residual blocks (default 0.1)
---@field image? integer            input side in pixels (default 32)
---@field in_channels? integer      input channels (default 3)
---@field out_channels? integer     output channels (default in_channels, twice that with learn_sigma)
---@field learn_sigma? boolean      also predict the variance interpolation (default false)
---@field classes? integer          0: unconditional (default); else label id `classes` is the null label
---@field class_dropout? number     label dropout for classifier-free guidance (default 0.1)
---@field groups? integer           GroupNorm groups (default 32)
---@field checkpoint? boolean       activation checkpointing (default false)

--- DiT (Peebles & Xie 2023) by size name ("DiT-S/2" ... "DiT-XL/8") or by depth, hidden and heads (explicit
--- fields override the size). Defaults: image 32, in_channels 4, classes 1000, class_dropout 0.1 (label id
--- `classes` is the null label), mlp_ratio 4, learn_sigma true (2 x in_channels outputs). Parameter counts
--- equal the official code's (DiT-XL/2: 675,129,632). Called as `dit(x, t, labels)`.
---@param options DiTOptions
---@return Denoiser
function nn.DiT(options) end

--- The depth, hidden width, heads and patch of a DiT size: `nn.dit_size("DiT-S/2")` is
--- `{ depth = 12, hidden = 384, heads = 6, patch = 2 }`. An unknown name returns nil and
--- "unknown DiT size 'DiT-Q/2' (known: DiT-S/2, ...)", so a script can check its config before it starts a run.
---@param name string
---@return { depth: integer, hidden: integer, heads: integer, patch: integer }|nil
---@return string? error
function nn.dit_size(name) end

---@class DiTOptions
---@field size? string              a preset, "DiT-S/2" ... "DiT-XL/8" (or give depth, hidden and heads)
---@field depth? integer            transformer blocks
---@field hidden? integer           hidden width
---@field heads? integer            attention heads
---@field patch? integer            patch side (default 2)
---@field image? integer            input side, the latent side for latent diffusion (default 32)
---@field in_channels? integer      input channels (default 4)
---@field classes? integer          0: unconditional; else label id `classes` is the null label (default 1000)
---@field class_dropout? number     label dropout for classifier-free guidance (default 0.1)
---@field mlp_ratio? number         MLP width / hidden (default 4)
---@field learn_sigma? boolean      2 x in_channels outputs (default true)
---@field checkpoint? boolean       activation checkpointing (default false)
---@field fused? boolean            the fused DiT block: LayerNorm with the adaLN modulation and the gated residuals as
---                                 runner's CUDA kernels (runtime/kernels), every block's adaLN projection in one
---                                 GEMM; the same parameters, and on the CPU the same numbers up to that GEMM's
---                                 rounding (default false until a GPU run has checked the kernels)

---@class Denoiser: Module
local Denoiser = {}
--- Activation checkpointing: each block's activations are recomputed in backward instead of kept
--- (dropout masks and autocast settings are restored for the recomputation). Returns self.
---@param enabled? boolean default true
---@return Denoiser
function Denoiser:set_checkpointing(enabled) end
--- {in_channels, out_channels, image, classes, class_dropout, null_label (nil without one), learned_sigma, checkpointing}
---@return table
function Denoiser:info() end

--- The KL autoencoder of latent diffusion with the architecture and parameter names of diffusers'
--- AutoencoderKL (the Stable Diffusion VAE family, e.g. sd-vae-ft-mse / sd-vae-ft-ema), random weights.
--- Load trained weights with nn.AutoencoderKL.load. Defaults are the Stable Diffusion VAE (83.7M parameters).
---@param options? AutoencoderKLOptions
---@return AutoencoderKL
function nn.AutoencoderKL(options) end

--- A diffusers VAE folder (config.json + diffusion_pytorch_model.safetensors; config.json sets the
--- architecture and the scaling factor) or one .safetensors file with diffusers' parameter names and the
--- architecture in `options`. Older checkpoints' attention names (query, key, value, proj_attn) are read too.
--- In eval mode, on the CPU in float32. Errors name the file and every missing, extra or misshapen tensor.
---@param path string
---@param options? AutoencoderKLOptions
---@return AutoencoderKL
function nn.AutoencoderKL.load(path, options) end

---@class AutoencoderKLOptions
---@field in_channels? integer              image channels (default 3)
---@field out_channels? integer             decoded channels (default 3)
---@field latent_channels? integer          latent channels (default 4)
---@field block_out_channels? integer[]     width per level; each level but the last halves the side (default {128, 256,
---                                         512, 512})
---@field layers_per_block? integer         residual blocks per encoder level, one more per decoder level (default 2)
---@field norm_num_groups? integer          GroupNorm groups (default 32)
---@field scaling_factor? number            latents for diffusion = scaling_factor * (z - shift_factor) (default
---                                         0.18215)
---@field shift_factor? number              (default none)
---@field use_quant_conv? boolean           1x1 convolution after the encoder (default true)
---@field use_post_quant_conv? boolean      1x1 convolution before the decoder (default true)
---@field mid_block_add_attention? boolean  self-attention in the middle blocks (default true)
---@field decode_batch? integer             decode at most this many latents at a time, to bound memory (default 0: all)

---@class AutoencoderKL: Module
local AutoencoderKL = {}
--- The posterior of images [N, in_channels, H, W] in [-1, 1] (H, W multiples of info().downsample):
--- mean and log-variance [N, latent_channels, H/f, W/f], the log-variance clamped to [-30, 20] as diffusers
--- does. A latent sample is mean + exp(logvar / 2) * noise; diffusion models train on it times scaling_factor.
---@param images Tensor
---@return Tensor mean
---@return Tensor logvar
function AutoencoderKL:encode(images) end
--- Images [N, out_channels, h*f, w*f] (about [-1, 1]) of unscaled latents [N, latent_channels, h, w]
--- (divide a diffusion model's sample by scaling_factor first).
---@param latents Tensor
---@return Tensor
function AutoencoderKL:decode(latents) end
--- {in_channels, out_channels, latent_channels, downsample (f), scaling_factor, shift_factor (nil without)}
---@return table
function AutoencoderKL:info() end

--- ema <- decay * ema + (1 - decay) * model for each parameter that requires grad (one foreach lerp, the
--- trainer's EMA rule); parameters that do not require grad and buffers are copied. A model parameter of another
--- dtype than its EMA twin is converted first. Both models must be built the same way (e.g. two calls of one
--- constructor): a different count or shape is an error naming the parameter.
---@param ema_model Module
---@param model Module
---@param decay number in [0, 1]
function nn.ema_update(ema_model, model, decay) end

--- Built-in modules also have:
---@return string  # "Linear", "Conv2d", ...
function Module:type_name() end

--- The options of mse_loss and l1_loss.
---@class LossOptions
---@field reduction? "mean"|"sum"|"none"  default "mean"

---@class CrossEntropyOptions
---@field reduction? "mean"|"sum"|"none"  default "mean"
---@field label_smoothing? number         default 0
---@field ignore_index? integer           target ids equal to this add nothing (default -100)
---@field weight? Tensor                  [C] per-class weights

nn.functional = {}
---@param options? LossOptions
---@return Tensor
function nn.functional.mse_loss(input, target, options) end
---@param options? LossOptions
---@return Tensor
function nn.functional.l1_loss(input, target, options) end
--- target: int64 class ids (0-based) of shape [N, ...], or class probabilities like logits.
---@param logits Tensor [N, C, ...]
---@param options? CrossEntropyOptions
---@return Tensor
function nn.functional.cross_entropy(logits, target, options) end
---@return Tensor
function nn.functional.linear(x, weight, bias) end
---@param training? boolean default true
---@return Tensor
function nn.functional.dropout(x, p, training) end
---@return Tensor
function nn.functional.group_norm(x, num_groups, weight, bias, eps) end
---@return Tensor
function nn.functional.layer_norm(x, normalized_shape, weight, bias, eps) end
