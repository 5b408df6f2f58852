// The trainer step: forward under autocast, backward with gradient accumulation and loss scaling, the
// non-finite guard, clipping, the optimizer step, the LR schedule and EMA. The files a checkpoint makes of
// its state are in runtime/run/checkpoint_format.h.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dist/gradient_averager.h"
#include "runtime/dist/parameter_shards.h"
#include "runtime/nn/parameter_group_hooks.h"
#include "runtime/nn/weight_casts.h"
#include "runtime/train/device_scalars.h"
#include "runtime/train/ema.h"
#include "runtime/train/step_graph_policy.h"
#include "runtime/train/loss_scaler.h"
#include "runtime/train/lr_schedule.h"
#include "runtime/train/objective.h"
#include "runtime/train/optimizer.h"
#include "runtime/train/step_observer.h"

namespace runner::train {

// fp8: the layers set to FP8 (nn::set_matmul_precision) multiply in FP8, everything else runs as under bf16.
enum class Precision { fp32, bf16, fp16, fp8 };

// "auto" (bf16 on a CUDA device that supports it, fp32 elsewhere), "bf16", "fp16", "fp32" (also "none"), "fp8".
// fp16 is refused on the CPU, fp8 everywhere but CUDA devices of compute capability 8.9 and later. Throws
// std::invalid_argument listing the accepted names, or naming the device that cannot.
Precision resolve_precision(const std::string& amp, const c10::Device& device);
std::string precision_name(Precision precision);

// What happens when the loss or a gradient is inf or NaN: skip the optimizer step and count it, or stop
// with a NonFiniteError that names the non-finite tensors. With fp16 a gradient overflow is the loss
// scaler's business (the step is skipped and the scale backed off, as GradScaler does); only a non-finite
// loss triggers the policy there.
enum class NonFinitePolicy { skip, stop };
NonFinitePolicy parse_nonfinite_policy(const std::string& name);  // "skip" or "stop"

struct NonFiniteError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// How each step runs: runner.trainer's keys amp, accumulate, clip, on_nonfinite, scaler, data_parallel and graph
// (the binding reads the whole TrainerOptions table into bindings::TrainerOptions, whose `step` this is).
struct StepOptions {
  std::string amp = "auto";
  std::int64_t accumulate = 1;  // micro-batches per optimizer step
  std::optional<double> clip;   // max global L2 norm of the gradients
  NonFinitePolicy on_nonfinite = NonFinitePolicy::skip;
  LossScalerOptions scaler;                      // fp16 only
  dist::GradientAveragingOptions data_parallel;  // with more than one rank
  // With more than one rank: what each rank keeps only its share of (dist/parameter_shards.h).
  dist::ShardMode shard = dist::ShardMode::none;
  dist::WeightGather shard_gather = dist::WeightGather::fp32;  // the dtype shard = weights gathers the weights in
  GraphMode graph = GraphMode::off;
  // Under bf16 or fp16 autocast, the float32 trainable weights are cast once per step by one multi-tensor pass
  // and Linear layers multiply with those copies (nn/weight_casts.h), instead of autocast casting each weight at
  // each use: the same numbers.
  bool cast_weights_once = false;
  // runner.trainer's `steps`, the last step: on_nonfinite = "stop" raises a non-finite last step at once (other
  // steps' stops come one step late), and a training run logs the last step's timings.
  std::optional<std::int64_t> steps;
};

// The model as the trainer sees it: every parameter and buffer under its state-dict name.
struct TrainerModel {
  NamedTensorList parameters;  // all of them; the optimizer's groups hold those that train
  NamedTensorList buffers;
  // A model whose forward brackets its parameter groups (nn::Denoiser): sharding over the weights needs one.
  std::shared_ptr<nn::GroupedForward> grouped;
};

// The loss of micro-batch `micro` (0-based) of `count`; must return a floating scalar that requires grad.
using LossFunction = std::function<at::Tensor(std::int64_t micro, std::int64_t count)>;

class Trainer {
 public:
  // The model's tensors are used in place (not copied); the optimizer is shared with whoever made it (its
  // groups must hold parameters of the model; their lr is the base of the schedule). Each EmaOptions adds an
  // average of the parameters (one per decay). Throws std::invalid_argument for bad options (accumulate < 1,
  // clip <= 0, fp16 on CPU, a parameter not in the model). With a `group` of several ranks (data parallel) the
  // trainer starts from rank 0's weights and averages the gradients over the group at every step; the group
  // outlives the trainer. nullptr: one process.
  Trainer(TrainerModel model, std::shared_ptr<Optimizer> optimizer, LrScheduleOptions schedule,
          std::vector<EmaOptions> emas, StepOptions options, c10::Device device, dist::ProcessGroup* group = nullptr);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  // One optimizer step: zero the gradients, then for each micro-batch run `loss_of` under autocast and
  // backpropagate loss / count (scaled for fp16); unscale, measure the global norm, apply the non-finite
  // policy, clip, set the scheduled LR, step the optimizer (skipped when non-finite), update the loss scale
  // and the EMAs. `inputs` (the batch's tensors, optional) are described in a NonFiniteError report.
  // While the current stream is being captured into a CUDA graph the step records no timing events and leaves
  // the stop latch of on_nonfinite = "stop" on the device (raise_pending_stop reads nothing of a captured step).
  // `batch_wait_seconds`: how long the loop waited for the batch these inputs came from (StepTiming::batch_wait).
  StepResult step(const LossFunction& loss_of, const NamedTensorList& inputs = {}, double batch_wait_seconds = 0);
  // The same step with the loss of `objective` for each of the `accumulate` equal micro-batches of the batch it
  // prepared (Objective::prepare, then split_batch), or of the trainer's own objective (set_objective;
  // std::logic_error without one). With graph on or automatic, StepGraphPolicy decides whether it runs as a CUDA
  // graph (step_graph_policy.h): the first StepGraphPolicy::kWarmupSteps steps of each batch signature run eagerly on
  // the graphs' side stream, the next one is captured with the batch copied into buffers of its own, and later ones
  // copy their batch into those buffers and replay it. A restore (restore_counters) or a new objective drops the
  // graphs. What the step returns is the same as eager's.
  StepResult step(Objective& objective, const StepBatch& batch);
  StepResult step(const StepBatch& batch);
  void set_objective(std::shared_ptr<Objective> objective);
  GraphStatus graph_status() const { return graph_policy_->status(); }
  const std::shared_ptr<Objective>& objective() const { return objective_; }

  std::int64_t step_count() const { return step_; }
  // Changes with every step and restore: what a copy of the averages into a model was taken at.
  std::int64_t state_version() const { return state_version_; }
  Precision precision() const { return precision_; }
  const c10::Device& device() const { return device_; }
  const StepOptions& step_options() const { return options_; }
  Optimizer& optimizer() { return *optimizer_; }
  LrSchedule& schedule() { return *schedule_; }
  std::vector<Ema>& emas() { return emas_; }
  const TrainerModel& model() const { return model_; }
  StepTiming timing();  // see StepTiming
  double base_lr(std::size_t group) const { return base_lrs_.at(group); }
  // The learning rate of the next step: base_lr(group) scaled by the schedule. Throws std::out_of_range for a group
  // that does not exist.
  double next_lr(std::size_t group) const;
  // The learning rate the schedule scales (warmup, decay) from the next step on: train:set_lr. A checkpoint does
  // not keep it: a resumed run starts from the optimizer's groups as the script made them. Throws
  // std::out_of_range for a group that does not exist, std::invalid_argument for a negative or non-finite lr.
  void set_base_lr(std::size_t group, double lr);

  // Observers of every step (step_observer.h), called in the order they were added: before_step before any work
  // of a step (before its objective prepares the batch), after_step once it is complete. The trainer shares each
  // until it is removed.
  void add_observer(std::shared_ptr<StepObserver> observer);
  void remove_observer(const StepObserver* observer);
  const std::vector<std::shared_ptr<StepObserver>>& observers() const { return observers_; }
  // The group the gradients are averaged over; nullptr for one process (or a group of one).
  dist::ProcessGroup* process_group() const { return group_; }

  // The state a checkpoint holds beyond the model, optimizer, EMAs and schedule (checkpoint_format.h).
  const LossScaler* loss_scaler() const { return scaler_.get(); }
  LossScaler* loss_scaler() { return scaler_.get(); }
  const at::Tensor& skipped() const { return skipped_; }  // int64 scalar on the device
  const Optimizer& optimizer() const { return *optimizer_; }
  const LrSchedule& schedule() const { return *schedule_; }
  const std::vector<Ema>& emas() const { return emas_; }
  // What the latest step read on the device: each group's scheduled learning rate (given to the optimizer with
  // set_lr(group, lr, element(group))), then each EMA's update weight 1 - decay; undefined before the first step.
  const DeviceScalars& step_scalars() const { return step_scalars_; }
  // Data parallel: throws when the ranks' weights differ (dist::check_ranks_agree); nothing in a single process.
  // Every rank must call it at the same step.
  void check_ranks_agree();

  // Sharded data parallel (StepOptions::shard over several ranks): the rank's rows of each trainable parameter,
  // which the optimizer steps and the EMAs average; nullptr otherwise.
  const dist::ParameterShards* shards() const { return shards_.get(); }
  // The optimizer's state tensors (Optimizer::state_tensors) and EMA `index`'s shadow weights (one per model
  // parameter) as unsharded training holds them: with sharding gathered over the ranks, a collective that every
  // rank calls; otherwise the tensors themselves.
  NamedTensorList full_optimizer_state();
  std::vector<at::Tensor> full_ema_shadow(std::size_t index);
  // Which of shards()'s parameters a tensor of the saved state is split as: optimizer state `name` (as
  // Optimizer::state_tensors names it), EMA parameter `parameter`; nullopt for a tensor each rank holds whole
  // (unsharded training, a step count, a parameter that is not trained).
  std::optional<std::size_t> optimizer_state_shard(const std::string& name) const;
  std::optional<std::size_t> ema_shard(std::size_t parameter) const;
  // Sharding over the weights: model parameter `parameter`'s index among shards()'s, whose local() rows are its
  // values (its full tensor is whole only during the step); nullopt otherwise.
  std::optional<std::size_t> weight_shard(std::size_t parameter) const;
  // The model's parameters by name, each sharded over the weights as this rank's rows (local()).
  NamedTensorList readable_parameters() const;
  // The model's parameters and buffers by name, whole: sharded over the weights, gathered (a collective that every
  // rank calls); otherwise the tensors themselves.
  NamedTensorList full_model_state();
  // For a restore: full tensors as full_optimizer_state gives them, reduced to what this rank keeps (its rows of
  // the sharded ones). The names and counts are checked by the optimizer's load.
  NamedTensorList local_optimizer_state(const NamedTensorList& full) const;
  // Writes EMA `index` into `params` and `buffers` (Ema::copy_to), gathering a sharded one first (a collective).
  void copy_ema(std::size_t index, std::vector<at::Tensor> params, std::vector<at::Tensor> buffers);
  // Bytes this rank holds of the model state: weights, gradients, optimizer state and EMA shadows.
  struct StateBytes {
    std::int64_t weights = 0, gradients = 0, optimizer = 0, ema = 0;
    std::int64_t total() const { return weights + gradients + optimizer + ema; }
  };
  StateBytes state_bytes() const;
  // Sharded: `shard gradients (ZeRO-2), model state 52.1 MB per rank` (the progress line, the log, runner show);
  // nullopt otherwise.
  std::optional<std::string> sharding_text() const;
  // on_nonfinite = "stop" is decided one step late, so that nothing waits for the device: a non-finite step
  // sets a latch on the device that skips its update and every later one; at the end of the next step (or
  // here) the latch is read on the host and the stop raised. Throws the NonFiniteError of a step whose latch
  // was set and not yet read (waiting for that step on the device); nothing otherwise. A training run calls
  // it before each checkpoint and at its end.
  void raise_pending_stop();
  // Continues counting from a checkpoint: `step` optimizer steps done, `skipped` of them skipped. Drops the CUDA
  // graphs (a checkpoint's optimizer state comes in new tensors).
  void restore_counters(std::int64_t step, const at::Tensor& skipped);

 private:
  struct Events;
  struct PendingStop;
  struct DeviceStep;
  // The parts of a step: the host's numbers for the device (learning rates, EMA weights; returns the schedule's
  // factor), the device work (zero_grad to the EMAs; `mark(i)` at the timing points 1 to 3), and the host's
  // bookkeeping after it.
  // Before any work of a step: its host timing (batch_wait, between_steps), then the observers.
  void begin_step(std::optional<std::int64_t> batch_size, double batch_wait_seconds);
  double write_step_scalars();
  DeviceStep device_step(const LossFunction& loss_of, const std::function<void(int)>& mark);
  // `stream_capturing`: the step is being recorded into a CUDA graph by its caller (nothing is read on the host).
  StepResult finish_step(const DeviceStep& done, double factor, const NamedTensorList& inputs, bool stream_capturing);
  StepResult eager_step(const LossFunction& loss_of, const NamedTensorList& inputs);
  // A step captured into `graph` (capture) or replayed from it, as StepGraphPolicy decided.
  StepResult graph_step(Objective& objective, StepGraphPolicy::Graph& graph, bool capture, const StepBatch& prepared,
                        const NamedTensorList& inputs);
  std::optional<std::string> device_graph_blocker() const;  // what stops graphs whatever the objective
  void check_ranks_agree_at(std::int64_t step);             // check_ranks_agree, naming `step` in its error
  std::vector<at::Tensor> trainable_grads() const;
  // float32, 0 without gradients; each gradient's norm into per_tensor when given.
  at::Tensor global_norm(const std::vector<at::Tensor>& grads, std::vector<at::Tensor>* per_tensor = nullptr) const;
  void watch_for_stop(const std::vector<at::Tensor>& micro_losses, const std::vector<at::Tensor>& grad_norms,
                      const NamedTensorList& inputs);
  std::string nonfinite_report(const PendingStop& pending) const;

  TrainerModel model_;
  std::vector<std::pair<std::string, at::Tensor>> trainable_;  // parameters of the optimizer's groups, by name
  std::shared_ptr<Optimizer> optimizer_;
  std::shared_ptr<Objective> objective_;
  std::unique_ptr<LrSchedule> schedule_;
  std::vector<Ema> emas_;
  std::unique_ptr<LossScaler> scaler_;
  std::unique_ptr<nn::WeightCasts> weight_casts_;      // cast_weights_once under autocast
  std::unique_ptr<dist::GradientAverager> gradients_;  // data parallel (world size > 1), unsharded
  std::unique_ptr<dist::ParameterShards> shards_;      // sharded data parallel
  // Per model parameter: its index among the sharded (trainable) parameters, or -1 (kept whole by the EMAs).
  std::vector<std::int64_t> sharded_index_;
  // Per optimizer group: the index of its first parameter among the trainable ones.
  std::vector<std::size_t> group_start_;
  StepOptions options_;
  c10::Device device_;
  Precision precision_;
  std::vector<double> base_lrs_;
  DeviceScalars step_scalars_;  // see step_scalars()
  std::int64_t step_ = 0;
  std::int64_t state_version_ = 0;
  at::Tensor skipped_;
  std::unique_ptr<Events> events_;
  at::Tensor stop_latch_;  // float [1] on the device: a step under on_nonfinite = "stop" failed
  std::unique_ptr<PendingStop> pending_stop_;
  StepTiming timing_;
  dist::ProcessGroup* group_;  // several ranks, or nullptr
  std::vector<std::shared_ptr<StepObserver>> observers_;
  std::optional<double> returned_at_;  // when the previous step returned (steady clock)
  bool announced_ = false;             // the data-parallel split, said at the first step in this process
  std::unique_ptr<StepGraphPolicy> graph_policy_;
};

// Deterministic algorithms (errors for ops without one), deterministic cuDNN without autotuning, and the
// cuBLAS workspace setting that deterministic matmuls need.
void set_deterministic(bool enabled);

}  // namespace runner::train
