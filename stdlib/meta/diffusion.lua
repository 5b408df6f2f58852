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
---@field timesteps? integer        diffusion steps T (default 1000, at most 1000000)
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
---@field n? integer                samples to draw (default: the number of labels, else 16; with x_T, its count)
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

---@class Flow
--- Flow matching as SiT trains and samples it (willisma/SiT transport/), beside the Gaussian diffusion: the same
--- models, loaders, trainer (objective, EMA, CUDA graphs, data parallel), checkpoints and sweeps. Time runs as in
--- SiT: t = 0 is noise, t = 1 data, x_t = alpha_t x1 + sigma_t x0 (x1 the data, x0 standard normal noise); the model
--- gets t in [0, 1] as it is (no x1000). docs/models-and-diffusion.md has the paths, targets and samplers.
local Flow = {}

--- A flow-matching objective and its samplers.
---@param options? FlowOptions
---@return Flow
function runner.diffusion.flow(options) end

---@class FlowOptions
---@field path? string         "linear" (default: alpha = t, sigma = 1 - t; rectified flow), "gvp" (sin, cos) or "vp"
---@field prediction? string   what the model predicts: "velocity" (default), "noise" or "score"
---@field loss_weight? string  noise and score predictions only: "none" (default), "velocity" or "likelihood"
---@field time? string         training times: "uniform" (default) over the training interval, or "logit_normal":
---                            t = 1 - sigmoid(logit_mean + logit_std n), n standard normal (SD3's density of the noise
---                            level, turned into SiT's time; logit_mean > 0 trains at more noise)
---@field logit_mean? number   logit_normal's mean (default 0)
---@field logit_std? number    logit_normal's spread (default 1)
---@field train_eps? number    training times stay train_eps from the ends where the path needs it (default SiT's:
---                            vp 1e-5; noise and score on linear and gvp 1e-3; velocity on linear and gvp 0)
---@field sample_eps? number   the same for sampling (default SiT's: 1e-3, velocity on linear and gvp 0)
---@field seed? integer        keys the training streams (default torch.initial_seed())

--- The training loss of a batch, as d:loss: times (drawn as `time` says), noise and label dropout from the streams
--- keyed by each sample's (epoch, dataset index) for loader batches, or a running count for a plain tensor. SiT's
--- loss: velocity |v - (d_alpha x1 + d_sigma x0)|^2, noise w |eps - x0|^2, score w |sigma s + x0|^2, each the mean
--- over a sample, then over the batch; on the model's first C channels (a learned-sigma DiT's others are ignored).
---@param model Module|function  a built-in UNet/DiT or any callable model(x, t, labels)
---@param batch Tensor|{data: Tensor, label?: Tensor, index?: Tensor, epoch?: integer}
---@param options? FlowLossOptions
---@return Tensor loss, {t: Tensor, mse: Tensor} details  t: the float64 times drawn; mse: per-sample weighted errors
function Flow:loss(model, batch, options) end

---@class FlowLossOptions
---@field labels? Tensor          [B] int64 labels instead of the batch's
---@field label_dropout? number   default: the model's class_dropout

--- flow:loss(model, batch) as the trainer's objective (runner.trainer { objective = flow:objective(model) }), as
--- d:objective.
---@param model Module a built-in nn.UNet or nn.DiT
---@param options? FlowObjectiveOptions
---@return Objective
function Flow:objective(model, options) end

---@class FlowObjectiveOptions
---@field label_dropout? number  default: the model's class_dropout

--- The loss at given float times t [B] (in [0, 1]) and noise x0.
---@return Tensor loss, Tensor mse
function Flow:training_loss(model, x1, t, noise, labels) end

--- The path's coefficients at float64 times t: {alpha, d_alpha, sigma, d_sigma}.
---@return table<string, Tensor>
function Flow:path(t) end

--- Draws samples (float32) from noise at t0 to data at t1 (SiT's Sampler). The ODE (default) integrates the
--- probability flow with fixed steps over linspace(t0, t1, steps + 1) (sampler "euler" or "heun", torchdiffeq's euler
--- and heun2; SiT's num_sampling_steps is steps + 1). sde = true integrates SiT's SDE: steps - 1 steps of
--- Euler-Maruyama or Heun over linspace(t0, t1, steps) with the diffusion coefficient diffusion_form x diffusion_norm,
--- then the last step (SiT's num_sampling_steps is steps). guidance > 1 is classifier-free guidance as SiT's
--- forward_with_cfg (guidance_channels = 3 reproduces SiT's default of guiding the first 3 channels only). n, labels,
--- seed, shape, x_T, device, null_label, trajectory and autocast as d:sample; noise: the SDE's step noise
--- [steps, n, C, H, W] (the last unused).
---@param options? FlowSampleOptions
---@return Tensor samples, Tensor|nil trajectory
function Flow:sample(model, options) end

---@class FlowSampleOptions
---@field n? integer                samples to draw (default: the number of labels, else 16; with x_T, its count)
---@field labels? Tensor|integer[]|integer  class ids, one per sample or one for all
---@field steps? integer            steps (default 50, at most 1000000; the SDE's include its last step)
---@field sampler? string           "euler" (default), "heun" or (the ODE's) "dopri5": torchdiffeq's adaptive
---                                 Dormand-Prince, its solution interpolated at the steps + 1 grid times
---@field rtol? number              dopri5's relative tolerance (default 1e-3, SiT's)
---@field atol? number              dopri5's absolute tolerance (default 1e-6, SiT's)
---@field sde? boolean              true: SiT's SDE sampler (default false: the ODE)
---@field reverse? boolean          the ODE backwards, x_T being data, to the noise it comes from (SiT's --reverse)
---@field diffusion_form? string    SDE: "sigma" (default), "sbdm", "constant", "linear", "decreasing" or
---                                 "increasing-decreasing" (SiT's diffusion_form, SBDM written in lower case)
---@field diffusion_norm? number    SDE: the diffusion coefficient's scale (default 1)
---@field last_step? string         SDE: "mean" (default), "tweedie", "euler" or "none"
---@field last_step_size? number    SDE: the last step's size (default 0.04; the steps end at 1 - last_step_size)
---@field guidance? number          classifier-free guidance scale (default 1: conditional model alone)
---@field guidance_channels? integer  the output channels guided (default all; SiT's forward_with_cfg: 3)
---@field seed? integer             seeds the start and step noise (default: the flow's seed)
---@field shape? integer[]          one sample's shape {C, H, W} (for a model that is not a built-in UNet or DiT)
---@field x_T? Tensor               the start noise [n, C, H, W]
---@field noise? Tensor             the SDE's step noise [steps, n, C, H, W]
---@field trajectory? boolean       also return x_T and every step's x: [steps + 1, n, C, H, W] (default false)
---@field device? string            where to sample (default: the model's device)
---@field null_label? integer       the unconditional label (default: the model's)
---@field autocast? boolean         keep the caller's autocast (default false: autocast off)

--- The log-likelihood of data x as SiT's sample_ode_likelihood computes it: the probability-flow ODE run backwards
--- from x to noise z (the model at time 1 - s) with the Hutchinson estimate of its divergence (a Rademacher probe per
--- model evaluation), log p(x) = log N(z; 0, I) - the integrated divergence, in nats summed over a sample. No
--- guidance (SiT refuses it). The model runs in eval mode.
---@param x Tensor  data [B, C, H, W]
---@param options? FlowLikelihoodOptions
---@return Tensor logp, Tensor z  logp float32 [B]; z the noise x maps to
function Flow:likelihood(model, x, options) end

---@class FlowLikelihoodOptions
---@field labels? Tensor|integer[]|integer  class ids for a class-conditional model
---@field steps? integer      steps of the grid linspace(t0, t1, steps + 1) (default 50, at most 1000000)
---@field sampler? string     "euler" (default), "heun" or "dopri5"
---@field rtol? number        dopri5's relative tolerance (default 1e-3)
---@field atol? number        dopri5's absolute tolerance (default 1e-6)
---@field seed? integer       seeds the probes (default: the flow's seed)
---@field probes? Tensor      the probes instead, [evaluations, B, C, H, W] of +-1, evaluation k taking the k-th
---@field autocast? boolean   keep the caller's autocast (default false: autocast off)

--- {objective = "flow", path, prediction, loss_weight, time, logit_mean, logit_std, train_eps, sample_eps, seed}
---@return table
function Flow:info() end

--- The running key counter of plain-tensor batches, as d:stream_counter.
---@return integer
function Flow:stream_counter(value) end

--- What a checkpoint keeps of the flow, as d:state(): {stream_counter, stream_generator}.
---@return {stream_counter: integer, stream_generator: integer}
function Flow:state() end

--- Continues the training streams where state() left them, as d:load_state.
---@param state {stream_counter: integer, stream_generator?: integer}
function Flow:load_state(state) end
