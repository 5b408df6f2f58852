// Dynamic loss scaling for float16 training, as torch.amp.GradScaler: scale the loss, unscale the gradients
// while checking them for inf/NaN (one fused kernel), skip the step and back off on overflow, grow after
// a run of good steps. Never used with bfloat16 or float32.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace runner::train {

struct LossScalerOptions {
  double init_scale = 65536.0;  // 2^16, GradScaler's default
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
};

class LossScaler {
 public:
  // The scale and the growth tracker live on `device`, so no step needs a host synchronisation.
  LossScaler(const LossScalerOptions& options, const at::Device& device);

  at::Tensor scale_loss(const at::Tensor& loss) const;
  // Divides every gradient by the scale in place and records whether any value is inf or NaN (on device).
  // Returns the found-inf flag (a one-element float tensor, 1 when non-finite values were found).
  at::Tensor unscale(const std::vector<at::Tensor>& gradients);
  // After the optimizer step (taken or skipped): backs off on found_inf, else grows every growth_interval
  // good steps. `found_inf` is what unscale() returned.
  void update(const at::Tensor& found_inf);

  double scale() const;  // reads the device value (synchronises)
  const at::Tensor& scale_tensor() const { return scale_; }
  int64_t growth_tracker() const;

  // {"scale", "growth_tracker"} for checkpoints.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  void load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

 private:
  LossScalerOptions options_;
  at::Tensor scale_;           // float32 [1]
  at::Tensor growth_tracker_;  // int32 [1]
};

}  // namespace runner::train
