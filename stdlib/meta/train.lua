---@meta
-- The training engine: runner.trainer, checkpoints (run:checkpoint, run:restore), early stopping and the
-- batch-size finder (stdlib/runner/train.lua; natives in bindings/train_binding.cpp, bindings/runs_binding.cpp).

---@class TrainerOptions
---@field model Module                 the module to train (its parameters that require grad)
---@field optimizer table|string       {"adamw"|"adam"|"sgd", lr = ..., weight_decay = 0, betas = {0.9, 0.999}, eps = 1e-8, momentum = 0, dampening = 0, nesterov = false, groups = {{params = module_or_tensors, <overrides>}, ...}}; fused AdamW/Adam/SGD kernels on CUDA, foreach ops elsewhere
---@field schedule? table|string       LR schedule: constant (default), linear, cosine, step, multistep, exponential, plateau, with kind-specific options (total_steps, min_lr_factor, step_size, gamma, milestones, mode, factor, patience, threshold, threshold_mode, cooldown, eps) and warmup_steps / warmup_start_factor; linear and cosine default total_steps to steps - warmup
---@field warmup? integer              linear warmup steps (schedule.warmup_steps)
---@field ema? number|table            one decay, {decay, warmup = false, inv_gamma = 1, power = 2/3, min_decay = 0, update_after_step = 0, update_every = 1}, or a list of them (several averages); float32 averages updated with foreach ops after every optimizer step
---@field ema_model? Module|Module[]   other instances of the model that train.ema / train:ema_model(i) fill with the averages
---@field amp? string                  "auto" (bf16 on CUDA, fp32 on the CPU), "bf16", "fp16" (with dynamic loss scaling), "fp32"
---@field accumulate? integer          micro-batches per optimizer step (default 1); train:step splits each batch into this many
---@field clip? number                 clip the gradients to this global L2 norm
---@field on_nonfinite? string         "skip" (default: skip the optimizer step and count it) or "stop" (raise a report naming the non-finite loss, gradients, parameters and the inputs' ranges; reads one flag per step)
---@field steps? integer               total optimizer steps: shows the progress display and sizes linear/cosine schedules
---@field batch? integer               images per step, for images/s in the progress display
---@field progress? boolean            false: no progress display
---@field tf32? boolean                TF32 matmuls and convolutions on CUDA (default: on for CUDA unless deterministic)
---@field deterministic? boolean       deterministic algorithms (an error for ops without one), deterministic cuDNN
---@field scaler? table                fp16 loss scaling: {init_scale = 65536, growth_factor = 2, backoff_factor = 0.5, growth_interval = 2000}

---@class StepOutput
---@field loss Tensor          mean of the micro-batch losses (float32, on the device; reading it waits for the device)
---@field grad_norm Tensor     global L2 norm of the gradients before clipping
---@field lr number            the learning rate this step used (first group)
---@field loss_scale? Tensor   fp16 only
---@field skipped Tensor       optimizer steps skipped so far (non-finite values, fp16 overflow)
---@field step integer         optimizer steps done
---@field timing table         seconds: data (outside the trainer since the previous step: loading the batch), forward_backward, optimizer, ema (on CUDA: of the latest step whose device events completed)

---@class Trainer
---@field step_count integer   optimizer steps done
---@field ema Module           the first EMA model holding the current average
local Trainer = {}

---One optimizer step. With a batch, loss_fn(micro_batch) runs once per micro-batch (equal slices of every
---tensor whose first dimension is the batch size); without one, loss_fn(i, n) for i = 1..n. loss_fn runs
---under autocast and returns the loss tensor (further results are ignored). At the end of a step a pending
---stop signal saves a checkpoint and exits (see run:restore).
---@param batch table|Tensor|nil
---@param loss_fn fun(micro: any, n?: integer): Tensor
---@return StepOutput
function Trainer:step(batch, loss_fn) end

---@param i? integer the average's number (default 1)
---@return Module
function Trainer:ema_model(i) end

---@return number lr the learning rate of the next step
function Trainer:lr(group) end

---Feeds a validation metric to a plateau schedule.
function Trainer:observe(metric) end

---@return string precision "fp32", "bf16" or "fp16"
function Trainer:precision() end

---Prints the final line of the progress display.
function Trainer:finish_progress() end

---@param options TrainerOptions
---@return Trainer
function runner.trainer(options) end

---Attaches what a checkpoint holds to the run and continues from the newest good checkpoint of this run (or,
---for runner.start{fork = RUN}, of that run): weights, EMA, optimizer moments, loss scale, LR schedule, step,
---every RNG stream (CPU and each CUDA device), the loader's position and each state object's state().
---Checkpoints whose files do not match their recorded sha256 are reported and skipped. From now on the
---first SIGINT/SIGTERM/SIGUSR1/SIGHUP finishes the step, saves a checkpoint, marks the run interrupted and
---exits 0 (130 for SIGINT).
---@param options {trainer: Trainer, loader?: Loader, state?: table<string, {state: fun(self): table, load_state: fun(self, s: table)}>, keep_last?: integer, keep_best?: integer, metric?: string, mode?: "min"|"max", on_error?: "stop"|"continue"}
---@return integer step the step restored (0 when starting from scratch)
function Run:restore(options) end

---Saves a checkpoint of step run.step as checkpoints/step-NNNNNNN/ (model.safetensors, ema.safetensors,
---optimizer.safetensors, trainer.safetensors, manifest.json): the tensors are copied (the stall, returned
---and logged as checkpoint_stall_ms) and written, verified, indexed and rotated by a background thread.
---A failed save raises at the next step (on_error = "stop") or is logged (on_error = "continue"); the
---previous checkpoint is intact either way.
---@param options? {metric?: string, value?: number, wait?: boolean}
---@return number stall_seconds
function Run:checkpoint(options) end

---@class EarlyStopping
---@field best number|nil
---@field bad integer        observations since the best
---@field stopped boolean
local EarlyStopping = {}
---@return boolean stop true once `patience` observations in a row did not beat the best by min_delta
function EarlyStopping:observe(value) end
function EarlyStopping:state() end
function EarlyStopping:load_state(state) end

---@param options? {patience?: integer, mode?: "min"|"max", min_delta?: number}
---@return EarlyStopping
function runner.early_stopping(options) end

---The largest batch size for which try(batch_size) (a real forward and backward pass) fits in device memory:
---doubling from `start`, then a binary search; out-of-memory errors are caught, others re-raised. On the
---CPU it prints that it does not apply and returns nil.
---@param options {try: fun(batch_size: integer), device?: string, start?: integer, max?: integer}
---@return integer|nil
function runner.find_batch_size(options) end
