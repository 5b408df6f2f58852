---@meta
-- `runner.diffusion` (also `require("runner.diffusion")`): Gaussian diffusion for training and sampling.
-- The exact definitions (schedules, targets, min-SNR, learned-sigma VB term, samplers, CFG, random streams)
-- are in docs/models-and-diffusion.md.

runner.diffusion = {}

---@class Diffusion
local Diffusion = {}

--- A Gaussian diffusion process.
--- schedule: "linear" (1e-4..0.02 at 1000 steps, scaled by 1000/T otherwise), "cosine" (Nichol & Dhariwal) or
--- "scaled_linear" (latent diffusion); prediction: what the model predicts, "eps", "x0" or "v"; min_snr: the
--- gamma of min-SNR loss weighting (off when nil); seed (default torch.initial_seed()) keys the training
--- streams of timesteps, noise and label dropout.
---@param options? DiffusionOptions
---@return Diffusion
function runner.diffusion.gaussian(options) end

---@class DiffusionOptions
---@field timesteps? integer        diffusion steps T (default 1000)
---@field schedule? string          "linear" (default), "cosine" or "scaled_linear"
---@field beta_start? number        first beta of linear / scaled_linear (default 1e-4 x 1000/T, 0.00085)
---@field beta_end? number          last beta of linear / scaled_linear (default 0.02 x 1000/T, 0.012)
---@field prediction? string        what the model predicts: "eps" (default), "x0" or "v"
---@field min_snr? number           gamma of min-SNR loss weighting (off when nil)
---@field timestep_sampling? string "uniform" (default) or "logit_normal": training timesteps floor(T sigmoid(logit_mean
---                                 + logit_std n)), n standard normal (SD3's density, diffusers' weighting_scheme
---                                 "logit_normal"): more training where noise and image are of about equal strength,
---                                 which short runs learn most from
---@field logit_mean? number        logit_normal's mean (default 0; negative: less noise)
---@field logit_std? number         logit_normal's spread (default 1)
---@field seed? integer             keys the training streams (default torch.initial_seed())
--- The same as gaussian.
function runner.diffusion.ddpm(options) end

--- The training loss of a batch: timesteps (drawn as timestep_sampling says), noise and label dropout from streams keyed by each
--- sample's (epoch, dataset index) for loader batches, or by a running count for a plain tensor, so the
--- result does not depend on how a batch is split. Labels come from batch.label when the model is
--- class-conditional (an unconditional model ignores batch.label; options.labels given to it are an error); label dropout (default: the model's class_dropout) replaces a label with the null
--- label. MSE on the model's first C channels (min-SNR weighted if set) plus, when the model outputs 2C
--- channels (learned sigma), the variational term of improved DDPM.
---@param model Module|function  a built-in UNet/DiT (called directly in C++) or any callable model(x, t, labels)
---@param batch Tensor|{data: Tensor, label?: Tensor, index?: Tensor, epoch?: integer}
---@param options? DiffusionLossOptions
---@return Tensor loss, {t: Tensor, mse: Tensor, vb: Tensor|nil} details
function Diffusion:loss(model, batch, options) end

---@class DiffusionLossOptions
---@field labels? Tensor          [B] int64 labels instead of the batch's
---@field label_dropout? number   default: the model's class_dropout

---@class Objective
--- What a trainer minimises (runner.trainer { objective = ... }); tostring() says what it computes, e.g.
--- "Objective(diffusion loss (eps prediction, uniform timesteps))".

--- d:loss(model, batch) as the trainer's objective: runner.trainer { objective = ddpm:objective(model) }, then
--- train:step(batch) runs the whole step (forward, loss, backward, optimizer, EMA) in C++ with the same numbers
--- as train:step(batch, function(micro) return ddpm:loss(model, micro) end), sharing the diffusion's streams.
--- The model must be a built-in UNet or DiT (a Lua-defined model keeps the loss-function form); labels come from
--- batch.label with the rules of d:loss.
---@param model Module a built-in nn.UNet or nn.DiT
---@param options? ObjectiveOptions
---@return Objective
function Diffusion:objective(model, options) end

---@class ObjectiveOptions
---@field label_dropout? number  default: the model's class_dropout

--- The loss for given timesteps t (int64 [B]) and noise.
---@return Tensor loss, Tensor mse, Tensor|nil vb
function Diffusion:training_loss(model, x0, t, noise, labels) end

--- x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise
---@return Tensor
function Diffusion:q_sample(x0, t, noise) end

--- Draws samples (float32; predicted x0 clipped to [-1, 1] for pixel-space models, see clip) with DDIM (default; eta 0 is
--- deterministic) or DDPM ancestral sampling over `steps` timesteps round(linspace(0, T-1, steps)). variance
--- (ddpm): auto (learned for 2C-channel models, else large), small, large or learned. guidance > 1 runs
--- classifier-free guidance (labels required; the null label is the model's). The start noise and step
--- noise come from `seed` (default: the diffusion's seed) unless x_T and noise [steps, B, ...] are given. The
--- model runs in eval mode without gradients and autocast off (autocast = true keeps the caller's).
--- n defaults to the number of labels given, else 16.
--- With trajectory = true, also returns x_T and every step's x stacked: [steps + 1, B, C, H, W].
---@param options? SampleOptions
---@return Tensor samples, Tensor|nil trajectory
function Diffusion:sample(model, options) end

---@class SampleOptions
---@field n? integer                samples to draw (default: the number of labels, else 16)
---@field labels? Tensor|integer[]|integer  class ids, one per sample or one for all
---@field steps? integer            sampling steps (default 50, at most T)
---@field sampler? "ddim"|"ddpm"    default "ddim"
---@field eta? number               DDIM noise: 0 deterministic (default), 1 the DDPM posterior variance
---@field guidance? number          classifier-free guidance scale (default 1: conditional model alone)
---@field variance? string          DDPM variance: "auto" (default), "small", "large" or "learned"
---@field clip? boolean             clip the predicted x0 to [-1, 1] (default: true for pixel-space models, nn.UNet and
---                                 Lua callables; false for nn.DiT, a latent model, as the official DiT samples)
---@field seed? integer             seeds the start and step noise (default: the diffusion's seed)
---@field shape? integer[]          one sample's shape {C, H, W}: the start noise is drawn from the seed (needed for
---                                 a model that is not a built-in UNet or DiT, unless x_T is given)
---@field x_T? Tensor               the start noise [n, C, H, W]
---@field noise? Tensor             every step's noise [steps, n, C, H, W]
---@field trajectory? boolean       also return x_T and every step's x (default false)
---@field device? string            where to sample (default: the model's device)
---@field null_label? integer       the unconditional label (default: the model's)
---@field autocast? boolean         keep the caller's autocast (default false: autocast off)

--- The schedule's float64 tables [T]: betas, alphas_cumprod, alphas_cumprod_prev, posterior_variance,
--- posterior_log_variance_clipped, posterior_mean_coef1, posterior_mean_coef2.
---@return table<string, Tensor>
function Diffusion:schedule() end

--- {timesteps, schedule, prediction, min_snr, timestep_sampling, logit_mean, logit_std, seed} (logit_mean and logit_std with "logit_normal" only)
---@return table
function Diffusion:info() end

--- The running key counter of plain-tensor batches (read, or set when a value is given): part of a
--- resumable training state.
---@return integer
function Diffusion:stream_counter(value) end

--- What a checkpoint keeps of the diffusion (run:restore{state = {ddpm = d}}): the running key counter and the
--- version of the generator that made the training draws (docs/models-and-diffusion.md, "Random streams").
---@return {stream_counter: integer, stream_generator: integer}
function Diffusion:state() end

--- Continues the training streams where state() left them; warns when the state comes from another generator
--- version (a state without stream_generator is version 1).
---@param state {stream_counter: integer, stream_generator?: integer}
function Diffusion:load_state(state) end

--- The timesteps `steps` sampling steps visit, descending.
---@return integer[]
function runner.diffusion.sampling_timesteps(timesteps, steps) end
