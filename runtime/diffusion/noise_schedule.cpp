// Noise schedules computed in float64 and the float32 per-sample gather of their values.
#include "runtime/diffusion/noise_schedule.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/shape_text.h"

namespace runner::diffusion {
namespace {

at::TensorOptions float64() { return at::TensorOptions().dtype(at::kDouble); }

// Nichol & Dhariwal's abar(u) for u in [0, 1].
double cosine_alpha_bar(double u) {
  const double angle = (u + 0.008) / 1.008 * std::numbers::pi / 2;
  return std::cos(angle) * std::cos(angle);
}

at::Tensor cosine_betas(std::int64_t timesteps) {
  at::Tensor betas = at::empty({timesteps}, float64());
  double* out = betas.data_ptr<double>();
  const double T = static_cast<double>(timesteps);
  for (std::int64_t i = 0; i < timesteps; ++i) {
    const double beta = 1 - cosine_alpha_bar((i + 1) / T) / cosine_alpha_bar(i / T);
    out[i] = std::min(beta, 0.999);
  }
  return betas;
}

double positive_override(const std::optional<double>& value, double fallback, const char* name) {
  if (!value) return fallback;
  if (!(*value > 0) || !std::isfinite(*value)) {
    throw std::invalid_argument(fmt::format("{} must be a positive number, got {}", name, *value));
  }
  return *value;
}

}  // namespace

NoiseSchedule make_schedule(const ScheduleOptions& options) {
  const std::int64_t T = options.timesteps;
  if (T < 2) throw std::invalid_argument(fmt::format("timesteps must be at least 2, got {}", T));
  if (T > kMaxSteps) throw std::invalid_argument(fmt::format("timesteps must be at most {}, got {}", kMaxSteps, T));
  at::Tensor betas;
  if (options.kind == "linear") {
    const double scale = 1000.0 / static_cast<double>(T);
    const double start = positive_override(options.beta_start, 1e-4, "beta_start");
    const double end = positive_override(options.beta_end, 0.02, "beta_end");
    betas = at::linspace(scale * start, scale * end, T, float64());
  } else if (options.kind == "scaled_linear") {
    const double start = positive_override(options.beta_start, 0.00085, "beta_start");
    const double end = positive_override(options.beta_end, 0.012, "beta_end");
    betas = at::linspace(std::sqrt(start), std::sqrt(end), T, float64()).pow(2);
  } else if (options.kind == "cosine") {
    if (options.beta_start || options.beta_end) {
      throw std::invalid_argument(
          "beta_start and beta_end apply to the linear and scaled_linear schedules, not cosine");
    }
    betas = cosine_betas(T);
  } else {
    throw std::invalid_argument(
        fmt::format("schedule must be linear, cosine or scaled_linear, got '{}'", options.kind));
  }
  const double largest = betas.max().item<double>();
  if (!(largest < 1)) {
    throw std::invalid_argument(
        fmt::format("{} schedule over {} timesteps gives betas outside (0, 1): the largest is {}{}", options.kind, T,
                    largest, options.kind == "linear" ? " (linear betas are scaled by 1000 / timesteps)" : ""));
  }

  NoiseSchedule schedule;
  schedule.betas = betas;
  const at::Tensor alphas = 1 - betas;
  schedule.alphas_cumprod = at::cumprod(alphas, 0);
  schedule.alphas_cumprod_prev = at::cat({at::ones({1}, float64()), schedule.alphas_cumprod.narrow(0, 0, T - 1)});
  const at::Tensor& abar = schedule.alphas_cumprod;
  const at::Tensor& abar_prev = schedule.alphas_cumprod_prev;
  schedule.posterior_variance = betas * (1 - abar_prev) / (1 - abar);
  schedule.posterior_log_variance_clipped =
      at::log(at::cat({schedule.posterior_variance.narrow(0, 1, 1), schedule.posterior_variance.narrow(0, 1, T - 1)}));
  schedule.posterior_mean_coef1 = betas * at::sqrt(abar_prev) / (1 - abar);
  schedule.posterior_mean_coef2 = (1 - abar_prev) * at::sqrt(alphas) / (1 - abar);
  schedule.sqrt_alphas_cumprod = at::sqrt(abar);
  schedule.sqrt_one_minus_alphas_cumprod = at::sqrt(1 - abar);
  schedule.sqrt_recip_alphas_cumprod = at::sqrt(1 / abar);
  schedule.sqrt_recipm1_alphas_cumprod = at::sqrt(1 / abar - 1);
  schedule.log_betas = at::log(betas);
  return schedule;
}

NoiseSchedule NoiseSchedule::on(c10::Device device) const {
  if (betas.device() == device) return *this;
  const auto move = [device](const at::Tensor& table) { return table.to(device); };
  return {move(betas),
          move(alphas_cumprod),
          move(alphas_cumprod_prev),
          move(posterior_variance),
          move(posterior_log_variance_clipped),
          move(posterior_mean_coef1),
          move(posterior_mean_coef2),
          move(sqrt_alphas_cumprod),
          move(sqrt_one_minus_alphas_cumprod),
          move(sqrt_recip_alphas_cumprod),
          move(sqrt_recipm1_alphas_cumprod),
          move(log_betas)};
}

at::Tensor extract(const at::Tensor& values, const at::Tensor& t, const at::Tensor& like) {
  if (!values.defined() || values.dim() != 1) throw std::invalid_argument("schedule values must be a 1-D tensor");
  if (!t.defined() || t.dim() != 1 || t.scalar_type() != at::kLong) {
    throw std::invalid_argument(fmt::format("timesteps must be an int64 tensor of shape [B], got {}",
                                            t.defined()
                                                ? core::dtype_name(t.scalar_type()) + " " + core::shape_text(t.sizes())
                                                : std::string("an undefined tensor")));
  }
  if (!like.defined() || like.dim() < 1 || like.size(0) != t.size(0)) {
    throw std::invalid_argument(
        fmt::format("{} timesteps for a batch of shape {}", t.size(0),
                    like.defined() ? core::shape_text(like.sizes()) : std::string("(undefined)")));
  }
  if (t.is_cpu() && t.numel() > 0) {
    const std::int64_t lowest = t.min().item<std::int64_t>();
    const std::int64_t highest = t.max().item<std::int64_t>();
    if (lowest < 0 || highest >= values.size(0)) {
      throw std::invalid_argument(
          fmt::format("timesteps must lie in 0..{}, got {}", values.size(0) - 1, lowest < 0 ? lowest : highest));
    }
  }
  at::Tensor table = values;
  // The table is a few kilobytes of pageable memory: CUDA stages it before returning, so the copy
  // need not wait for the stream.
  if (table.device() != t.device()) table = table.to(at::TensorOptions().device(t.device()), /*non_blocking=*/true);
  at::Tensor gathered = table.index_select(0, t).to(at::kFloat);
  if (gathered.device() != like.device()) gathered = gathered.to(like.device());
  std::vector<std::int64_t> shape(static_cast<std::size_t>(like.dim()), 1);
  shape[0] = t.size(0);
  return gathered.view(shape);
}

}  // namespace runner::diffusion
