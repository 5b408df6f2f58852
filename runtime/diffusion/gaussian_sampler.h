// DDPM (ancestral) and DDIM samplers over respaced timesteps, with classifier-free guidance (sampling.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "runtime/diffusion/gaussian_diffusion.h"
#include "runtime/diffusion/noise_schedule.h"
#include "runtime/diffusion/sampling.h"

namespace runner::diffusion {

// The timesteps visited by `steps` sampling steps of a T-step schedule: round(linspace(0, T - 1, steps))
// with ties to even, in descending order. Throws std::invalid_argument unless 1 <= steps <= T.
std::vector<std::int64_t> sampling_timesteps(std::int64_t timesteps, std::int64_t steps);

struct SampleOptions {
  std::string sampler = "ddim";  // ddim or ddpm
  std::int64_t steps = 50;
  double eta = 0.0;                        // ddim only: 0 is deterministic, 1 matches DDPM's posterior variance
  std::string variance = "auto";           // ddpm only: auto (learned with 2C output channels, else large), small,
                                           // large or learned
  bool clip = true;                        // clip the predicted x0 to [-1, 1] (the bindings default it from the model)
  double guidance = 1.0;                   // classifier-free guidance scale; 1 runs the conditional model alone
  std::optional<std::int64_t> null_label;  // the unconditional label, required when guidance != 1
  Prediction prediction = Prediction::eps;
  bool keep_trajectory = false;
  bool autocast = false;  // true: the model runs under the caller's autocast state (the sampler math
                          // stays float32); false: autocast is off for the sample's device
};

// Runs the chain from x_T [B, C, ...] (converted to float32) without gradients. labels: int64 [B] class
// ids for a conditional model. Checks Ctrl-C between steps (throws core::Interrupted, the request left
// pending). Throws std::invalid_argument for bad options and for model outputs that are not C or 2C
// channels of x's shape.
SampleResult sample(const NoiseSchedule& schedule, const ModelFunction& model, at::Tensor x_T,
                    const std::optional<at::Tensor>& labels, const SampleOptions& options,
                    const NoiseSource& noise = {});

}  // namespace runner::diffusion
