---@meta
-- The training engine: runner.trainer, early stopping and the batch-size finder (stdlib/runner/train.lua;
-- natives in bindings/train_binding.cpp). Checkpoints and restore are the run's: stdlib/meta/run.lua.

---@class TrainerOptions
---@field model Module                 the module to train (its parameters that require grad)
---@field optimizer Optimizer|table|string  an optim object (optim.AdamW(model, {...})), or the same as a table:
---                                         {"adamw"|"adam"|"sgd", <the optimizer's options: AdamWOptions, AdamOptions,
---                                         SGDOptions>, groups = {{params = module_or_tensors, <overrides>}, ...}} (the
---                                         model's trainable parameters when there are no groups); PyTorch's defaults
---                                         (AdamW weight_decay 1e-2)
---@field objective? Objective|fun(micro: table): Tensor what train:step(batch) minimises: an objective such as
---                                       ddpm:objective(model) (the whole step runs in C++, no Lua call per
---                                       micro-batch), or a loss function of a micro-batch (called as with
---                                       train:step(batch, loss_fn))
---@field schedule? ScheduleOptions|string LR schedule, as "cosine", { "cosine", warmup_steps = 100 } or { kind =
---                                        "cosine", ... }: constant (default), linear, cosine, step, multistep,
---                                        exponential, plateau, with kind-specific options (total_steps, min_lr_factor,
---                                        step_size, gamma, milestones, mode, factor, patience, threshold,
---                                        threshold_mode, cooldown, eps) and warmup_steps / warmup_start_factor; linear
---                                        and cosine default total_steps to steps - warmup
---@field warmup? integer              linear warmup steps (schedule.warmup_steps)
---@field ema? number|EmaOptions|EmaOptions[]|false one decay, the options of one average, or a list of them (several
---                                                 averages); float32 averages updated with foreach ops after every
---                                                 optimizer step
---@field ema_model? Module|Module[]   other instances of the model that train.ema / train:ema_model(i) fill with the
---                                    averages
---@field amp? string                  "auto" (bf16 on CUDA, fp32 on the CPU), "bf16", "fp16" (with dynamic loss
---                                    scaling), "fp32", "fp8" (CUDA of compute capability 8.9 and later: the
---                                    Linear layers of nn.DiT's blocks multiply in FP8 with dynamic tensorwise
---                                    scaling, e4m3 forward and e5m2 gradients; everything else as bf16; the model
---                                    keeps its parameters and state dict)
---@field cast_weights_once? boolean    under bf16 or fp16 autocast, cast the float32 weights once per step in one
---                                    multi-tensor pass and let Linear layers multiply with the copies, instead of
---                                    autocast casting each weight at each use: the same numbers, fewer kernels
---                                    (default false)
---@field accumulate? integer          micro-batches per optimizer step (default 1); train:step splits each batch into
---                                    this many
---@field clip? number                 clip the gradients to this global L2 norm
---@field on_nonfinite? string         "skip" (default: skip the optimizer step and count it) or "stop" (raise a report
---                                    naming the non-finite loss, gradients, parameters and the inputs' ranges; decided
---                                    on the device and raised one step late, so nothing waits: the bad step's update
---                                    and the next one's are skipped, and the error comes at the end of the next step,
---                                    at the trainer's last step (`steps`), at the next run:checkpoint or at the end of
---                                    the run, whichever is first)
---@field steps? integer               total optimizer steps: shows the progress display and sizes linear/cosine
---                                    schedules
---@field batch? integer               images per step, for images/s in the progress display
---@field progress? boolean            false: no progress display (only rank 0 of a data-parallel job shows it)
---@field tf32? boolean                TF32 matmuls and convolutions on CUDA (default: on for CUDA unless deterministic)
---@field deterministic? boolean       deterministic algorithms (an error for ops without one), deterministic cuDNN
---@field scaler? ScalerOptions        fp16 loss scaling
---@field data_parallel? DataParallelOptions  gradient averaging when more than one rank trains (stdlib/meta/dist.lua)
---@field shard? string                sharded data parallel when more than one rank trains: "none" (default: every rank
---                                    holds everything), "optimizer" (ZeRO-1: each rank keeps the optimizer state and
---                                    the EMA of its rows of each weight; gradients are reduce-scattered to their rows
---                                    and the updated rows all-gathered back), "gradients" (ZeRO-2: the averaged
---                                    gradients too; the full gradients are freed as soon as they are reduced) or
---                                    "weights" (ZeRO-3, FSDP's full shard: the weights of nn.DiT's blocks and
---                                    nn.UNet's levels too, gathered for each block's forward and again for its
---                                    backward, and released between; read them with train:model_state()). Each
---                                    weight is split by rows as torch.chunk splits it; a numbered child of the model
---                                    (`blocks.3`, a DiT block; `down.1`, a UNet level) is one collective, the rest
---                                    another. The numbers equal unsharded data parallel's (README, "Sharded data
---                                    parallel"); the EMA (train.ema, sampling) is gathered when read, so every rank
---                                    must read it. Ignored by a single process
---@field shard_gather? string         the dtype shard = "weights" all-gathers the weights in: "fp32" (default: the
---                                    numbers of unsharded training) or "bf16" (FSDP's param_dtype: half the bytes
---                                    sent; every forward and backward sees the weights rounded to bf16, which changes
---                                    the numbers, while the optimizer and the EMA step the fp32 rows). Needs
---                                    shard = "weights"
---@field graph? boolean|string        CUDA graphs: true captures the whole step of an objective (zero_grad, forward,
---                                    backward, unscale, clipping, optimizer, loss scale, EMA) once per batch shape,
---                                    after 2 eager warm-up steps of that shape, and replays it with each batch copied
---                                    into the graph's buffers; a step that cannot be captured (a loss function, a
---                                    model with checkpoint = true, data parallel over several ranks, the CPU, a
---                                    non-capturable optimizer) is an error that says why. "auto" runs such steps
---                                    eagerly instead (train:graphs() says why). The strings "true" and "false"
---                                    (a config key declared "auto" set from the command line) are the booleans.
---                                    Default false
---@field profile? string|integer[]    steps to record with LibTorch's Kineto profiler, "A:B", "A" or {A, B} (default:
---                                    `runner --profile A:B`): CPU operators with shapes and memory, and CUDA kernels;
---                                    after step B the trace is written as profile-steps-A-B.json in the run directory
---                                    (the working directory without a run; "-rank<r>" added on each rank of a
---                                    data-parallel job), recorded as an artifact, and rank 0 prints the operators with
---                                    the most self time

---@class ScheduleOptions
---@field kind? string                 constant (default), linear, cosine, step, multistep, exponential, plateau
---@field warmup_steps? integer        linear warmup before the schedule (default 0)
---@field warmup_start_factor? number  the warmup's first factor (default 1/(warmup_steps+1): an even ramp whose first
---                                    step learns)
---@field total_steps? integer         linear, cosine: length after warmup (default: the trainer's steps - warmup)
---@field min_lr_factor? number        linear's end, cosine's eta_min, plateau's min_lr, as fractions of the LR (default
---                                    0)
---@field step_size? integer           step: steps between decays
---@field gamma? number                step, multistep (default 0.1), exponential: the decay multiplier
---@field milestones? integer[]        multistep: steps (after warmup) where the LR is multiplied by gamma
---@field mode? "min"|"max"            plateau: whether lower or higher metrics are better (default min)
---@field factor? number               plateau: multiplier of each reduction (default 0.1)
---@field patience? integer            plateau: bad observations tolerated (default 10)
---@field threshold? number            plateau: the margin to beat the best by (default 1e-4)
---@field threshold_mode? "rel"|"abs"  plateau (default rel)
---@field cooldown? integer            plateau: observations ignored after a reduction (default 0)
---@field eps? number                  plateau: smaller LR changes are ignored (default 1e-8)

---@class EmaOptions
---@field decay? number                default 0.9999
---@field min_decay? number            default 0
---@field update_after_step? integer   default 0
---@field warmup? boolean              diffusers' decay warmup 1 - (1 + step / inv_gamma)^-power (default false)
---@field inv_gamma? number            default 1
---@field power? number                default 2/3
---@field update_every? integer        update on steps that are multiples of this (default 1)

---@class DataParallelOptions
---@field bucket_mb? number            gradients averaged per all-reduce, in MiB (default 25, as PyTorch DDP's
---                                    bucket_cap_mb)
---@field overlap? boolean             start a bucket's all-reduce during the last micro-batch's backward, as soon as
---                                    all its gradients are in (default true); false: all after backward

---@class ScalerOptions
---@field init_scale? number           default 65536
---@field growth_factor? number        default 2
---@field backoff_factor? number       default 0.5
---@field growth_interval? integer     default 2000

---@class StepOutput
---@field loss Tensor          mean of the micro-batch losses (float32, on the device; reading it waits for the device)
---@field grad_norm Tensor     global L2 norm of the gradients before clipping
---@field lr number            the learning rate this step used (first group); with a run started, logged as the
---                            metric lr at every step
---@field loss_scale? Tensor   fp16 only
---@field skipped Tensor       optimizer steps skipped so far (non-finite values, fp16 overflow)
---@field step integer         optimizer steps done
---@field timing table         seconds: batch_wait (loader:next() handing over this step's batch, its wait_s),
---                            between_steps (the rest of the time outside the trainer since the previous step: the
---                            loop's own work, such as evaluation, sampling, logging and checkpoint copies),
---                            forward_backward, optimizer, ema (on CUDA: of the latest step whose device events
---                            completed). With a run started, their means over every 25 steps (and the last step)
---                            are logged as the metrics time/batch_wait_ms, time/between_steps_ms,
---                            time/forward_backward_ms, time/optimizer_ms and time/ema_ms

---@class Trainer
---@field step_count integer   optimizer steps done
---@field ema Module           the first EMA model holding the current average
local Trainer = {}

---One optimizer step. train:step(batch) minimises the trainer's objective (runner.trainer { objective = ... })
---over the batch. With a loss function, loss_fn(micro_batch) runs once per micro-batch of `batch`; without a
---batch, loss_fn(i, n) for i = 1..n. A batch is split into `accumulate` micro-batches: equal slices of every
---tensor whose first dimension is the batch size. The loss runs under autocast and is a scalar tensor (a loss
---function's further results are ignored). At the end of a step a pending stop signal saves a checkpoint and
---exits (see run:restore). Errors: "train:step(batch) needs runner.trainer { objective = ... } ..." without an
---objective.
---@param batch table|Tensor|nil a loader batch {data, label, index, epoch, ...} or an image tensor
---@param loss_fn? fun(micro: any, n?: integer): Tensor
---@return StepOutput
function Trainer:step(batch, loss_fn) end

---@param i? integer the average's number (default 1)
---@return Module
function Trainer:ema_model(i) end

---@return number lr the learning rate of the next step
function Trainer:lr(group) end

---Sets the learning rate that the schedule scales (warmup, decay) from the next step on: train:lr() afterwards
---is lr times the schedule's factor. A checkpoint does not keep it: a resumed run starts from the script's.
---Refused in `runner attach` on a data-parallel job (it would change rank 0 alone).
---@param lr number
---@param group? integer a parameter group (default: every group)
function Trainer:set_lr(lr, group) end

---Feeds a validation metric to a plateau schedule.
function Trainer:observe(metric) end

---@return string precision "fp32", "bf16", "fp16" or "fp8"
function Trainer:precision() end

---Bytes of model state this rank holds: the weights, the gradients kept between steps (the averaged shares under
---shard = "gradients"), the optimizer state (before the first step: what it will hold) and the EMA shadows. With
---shard, the optimizer state and the EMA are this rank's rows (TrainerOptions.shard).
---@return {weights: number, gradients: number, optimizer: number, ema: number, total: number}
function Trainer:state_bytes() end

---The trained model's weights and buffers as a state dict, whole. Under shard = "weights" the model holds only its
---rows of each block between steps (reading `model:state_dict()` then fails saying so): this gathers them, a
---collective that every rank calls (called on one rank only, it fails after the collective timeout naming it).
---@return table<string, Tensor>
function Trainer:model_state() end

---What CUDA graph capture (TrainerOptions.graph) has done: `captured` graphs (one per batch shape, again after a
---restore), steps `replayed` from them, and `eager_reason`, why steps run eagerly (nil when none did).
---@return {captured: integer, replayed: integer, eager_reason: string?}
function Trainer:graphs() end

---Prints the final line of the progress display.
function Trainer:finish_progress() end

--- The progress line's options (runner.trainer gives the native trainer its steps and batch).
---@class ProgressOptions
---@field total? integer          total steps (0: unknown, no percentage or ETA)
---@field batch? integer          images per step, for images/s (0: not shown)
---@field terminal? boolean       redraw one line in place (default: whether stdout is a terminal)
---@field line_seconds? number    plain lines at most this often (default 30)

---@param options TrainerOptions
---@return Trainer
function runner.trainer(options) end

---What runner.trainer's `amp` resolves to on `device` ("auto": the device runner.start would pick), or the error it
---would raise there (fp16 on the CPU, fp8 before compute capability 8.9), so that a script can refuse it as a usage
---error before runner.start records a run.
---@param amp string "auto", "bf16", "fp16", "fp32" or "fp8"
---@param device? string default "auto"
---@return string precision "fp32", "bf16", "fp16" or "fp8"
function runner.precision(amp, device) end

---@class EarlyStopping
---@field best number|nil
---@field bad integer        observations since the best
---@field stopped boolean
local EarlyStopping = {}
---@return boolean stop true once `patience` observations in a row did not beat the best by min_delta
function EarlyStopping:observe(value) end
function EarlyStopping:state() end
function EarlyStopping:load_state(state) end

---@param options? EarlyStoppingOptions
---@return EarlyStopping
function runner.early_stopping(options) end

---@class EarlyStoppingOptions
---@field patience? integer     observations in a row that may fail to beat the best (default 10)
---@field mode? "min"|"max"     default "min"
---@field min_delta? number     default 0

---The largest batch size for which try(batch_size) (a real forward and backward pass) fits in device memory:
---doubling from `start`, then a binary search; out-of-memory errors are caught, others re-raised. On the
---CPU it prints that it does not apply and returns nil.
---@param options FindBatchSizeOptions
---@return integer|nil
function runner.find_batch_size(options) end

---@class FindBatchSizeOptions
---@field try fun(batch_size: integer)
---@field device? Device   default: the run's device, else "auto"
---@field start? integer   default 1
---@field max? integer     default 65536
