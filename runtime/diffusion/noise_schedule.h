// Noise schedules of Gaussian diffusion (linear, cosine, scaled_linear) and the per-sample gather of their values.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/diffusion/sampling.h"  // kMaxSteps: the most timesteps too

namespace runner::diffusion {

struct ScheduleOptions {
  std::string kind = "linear";  // linear, cosine or scaled_linear
  std::int64_t timesteps = 1000;
  // Override the ends of linear (1e-4, 0.02, both scaled by 1000 / timesteps) and scaled_linear
  // (0.00085, 0.012); cosine takes neither.
  std::optional<double> beta_start;
  std::optional<double> beta_end;
};

// Every table is a float64 CPU tensor [T], indexed by timestep 0..T-1.
struct NoiseSchedule {
  at::Tensor betas;
  at::Tensor alphas_cumprod;
  at::Tensor alphas_cumprod_prev;  // [1, alphas_cumprod[:-1]]
  at::Tensor posterior_variance;
  at::Tensor posterior_log_variance_clipped;  // log of posterior_variance with entry 0 replaced by entry 1
  at::Tensor posterior_mean_coef1;            // multiplies x0 in the posterior mean
  at::Tensor posterior_mean_coef2;            // multiplies x_t in the posterior mean
  at::Tensor sqrt_alphas_cumprod;
  at::Tensor sqrt_one_minus_alphas_cumprod;
  at::Tensor sqrt_recip_alphas_cumprod;    // sqrt(1 / abar)
  at::Tensor sqrt_recipm1_alphas_cumprod;  // sqrt(1 / abar - 1)
  at::Tensor log_betas;

  std::int64_t timesteps() const { return betas.size(0); }
  // The same tables on `device` (copied once there, so that a step reads no host memory).
  NoiseSchedule on(c10::Device device) const;
};

// Throws std::invalid_argument for an unknown kind, fewer than 2 timesteps, overrides that are not
// positive or that give betas outside (0, 1), and overrides given to cosine.
NoiseSchedule make_schedule(const ScheduleOptions& options);

// values[t] for each sample, converted from float64 to float32, on like's device and shaped [B, 1, 1, ...]
// to broadcast against like. t: int64 [B] on any device (ranges are checked when t is on the CPU).
at::Tensor extract(const at::Tensor& values, const at::Tensor& t, const at::Tensor& like);

}  // namespace runner::diffusion
