// The exponential moving average of a model's weights (diffusers' EMAModel rule), updated with multi-tensor ops.
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace runner::train {

// The decay of the update after optimizer step `step` is diffusers' EMAModel.get_decay(step)
// (diffusers/training_utils.py):
//   s = max(0, step - update_after_step - 1); s == 0 gives 0 (the shadow becomes a copy of the weights);
//   otherwise warmup ? 1 - (1 + s / inv_gamma)^-power : decay, then clamped to [min_decay, decay].
// With warmup, inv_gamma = 1 and power = 2/3 the decay reaches 0.999 at about 31.6k steps and 0.9999
// at about 1M (3/4: 10k and 215k).
// update_every = N updates on the optimizer steps that are multiples of N, each with the decay of that step as
// above (not decay^N or any other correction): with N > 1 the average spans N times as many steps.
// With update_every = 1 and update(step) called after every optimizer step this is exactly diffusers'
// EMAModel.step called after every optimizer step.
struct EmaOptions {
  double decay = 0.9999;
  double min_decay = 0.0;
  std::int64_t update_after_step = 0;
  bool warmup = false;
  double inv_gamma = 1.0;
  double power = 2.0 / 3.0;  // the warmup's exponent; saved as "warmup_power" in the hyperparameters
  std::int64_t update_every = 1;
};

// One EMA update of `shadow` towards `sources` (equal counts and shapes; std::invalid_argument otherwise):
// shadow <- lerp(shadow, source, 1 - decay) in one _foreach_lerp_ for sources that require grad, shadow <- source
// for the others (frozen weights are copied, as diffusers does), and shadow_buffers <- buffers. A source whose
// dtype differs from its shadow's is converted first (one _foreach_copy_ into temporaries). Under NoGradGuard.
// This is the rule behind both Ema::update and the Lua nn.ema_update.
void ema_update(const std::vector<at::Tensor>& shadow, const std::vector<at::Tensor>& sources,
                const std::vector<at::Tensor>& shadow_buffers, const std::vector<at::Tensor>& buffers, double decay);
// The same update with the weight 1 - decay read on the device from `one_minus_decay` (a one-element floating
// tensor, best 0-dim float32 on the shadows' device), so that no number is fixed in a kernel launch:
// shadow -= w * (shadow - source), diffusers' EMAModel.step op for op, in three multi-tensor launches (sub, mul
// by the tensor, sub) per (device, dtype) of the shadows. It differs from the lerp above by at most one ulp of
// the result per update (a few ulps for 1 - decay >= 0.5), as lerp rounds once where this rounds the product too.
void ema_update(const std::vector<at::Tensor>& shadow, const std::vector<at::Tensor>& sources,
                const std::vector<at::Tensor>& shadow_buffers, const std::vector<at::Tensor>& buffers,
                const at::Tensor& one_minus_decay);

// Shadow weights, one per parameter: float32 for float32, float16 and bfloat16 parameters (so a model trained
// in reduced precision is averaged in float32), float64 for float64 ones, on the parameter's device.
// Parameters that do not require grad at an update are copied, not averaged (as diffusers does). Buffers
// (e.g. normalisation statistics) are copied, not averaged, and kept in their own dtype.
// The Ema holds the model's tensors (sharing their storage) and reads them at every update.
class Ema {
 public:
  // Throws std::invalid_argument for invalid options (decay or min_decay outside [0, 1], min_decay > decay,
  // inv_gamma or power <= 0, update_every < 1, update_after_step < 0) or an undefined or
  // non-floating parameter.
  Ema(std::vector<at::Tensor> parameters, std::vector<at::Tensor> buffers = {}, EmaOptions options = {});

  // diffusers' get_decay(step) as described above.
  double current_decay(std::int64_t step) const;
  // Whether update(step) changes the shadow: step % update_every == 0.
  bool due(std::int64_t step) const;
  // After optimizer step `step` (1, 2, ...): when due, shadow = lerp(shadow, param, 1 - decay) for every
  // averaged parameter in one _foreach_lerp_ (reduced-precision parameters are converted to float32
  // temporaries first, in one _foreach_copy_), and copies of frozen parameters and buffers.
  // Throws std::invalid_argument for step < 1.
  void update(std::int64_t step);
  // The same with the decay on the device: `one_minus_decay` holds 1 - current_decay(step) by the time the update
  // runs on the stream (the trainer writes it once per step with its learning rates), and the update is the
  // tensor form of ema_update above. An update with decay 0 (which the step tells on the host) is the host form,
  // an exact copy of the weights. std::invalid_argument for step < 1 or a weight that is not a one-element
  // floating tensor.
  void update(std::int64_t step, const at::Tensor& one_minus_decay);
  // Counts update(step, ...) of a step that a CUDA graph replayed (the graph holds its device work): what
  // update_count() and last_update_step() say.
  void count_replayed_update(std::int64_t step);

  const std::vector<at::Tensor>& shadow() const { return shadow_; }
  const std::vector<at::Tensor>& shadow_buffers() const { return shadow_buffers_; }
  const EmaOptions& options() const { return options_; }
  std::int64_t update_count() const { return update_count_; }          // updates applied
  std::int64_t last_update_step() const { return last_update_step_; }  // 0 before the first

  // Writes the shadow into `params` (and the shadow buffers into `buffers`, when given), cast to each target's
  // dtype, under NoGradGuard. The counts and shapes must match; std::invalid_argument otherwise.
  void copy_to(std::vector<at::Tensor> params, std::vector<at::Tensor> buffers = {}) const;

  // The shadow tensors (not copies): "param<I>" for each parameter, then "buffer<I>" for each buffer.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Copies every named tensor into the shadow; all names must be present, once, with the shadow's shapes and
  // dtypes. Validated before anything changes; std::invalid_argument with messages that start with
  // "ema state: ".
  void load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

  // {"decay", "min_decay", "update_after_step", "warmup", "inv_gamma", "warmup_power", "update_every",
  //  "update_count", "last_update_step", "params", "buffers"}.
  nlohmann::json hyperparameters() const;
  // Restores the options and counters; the numbers of parameters and buffers must match. std::invalid_argument
  // with messages that start with "ema hyperparameters: ".
  void load_hyperparameters(const nlohmann::json& hyperparameters);

 private:
  std::vector<at::Tensor> params_, buffers_;
  std::vector<at::Tensor> shadow_, shadow_buffers_;
  EmaOptions options_;
  std::int64_t update_count_ = 0;
  std::int64_t last_update_step_ = 0;
};

}  // namespace runner::train
