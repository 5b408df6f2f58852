// DDPM and DDIM sampling over respaced timesteps, with classifier-free guidance, in float32.
#include "runtime/diffusion/gaussian_sampler.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "runtime/core/dtype.h"
#include "runtime/core/interrupt.h"

namespace runner::diffusion {
namespace {

// One step of the respaced chain, from timestep t to the previously visited one (abar_prev = 1 after
// the last), with the respaced beta and log variances.
struct Step {
  std::int64_t t = 0;
  double abar = 0;
  double abar_prev = 0;
  double beta = 0;
  double log_variance_small = 0;  // clipped posterior log variance
  double log_variance_large = 0;  // log beta (the second step's posterior variance on the last step)
};

// Steps in the order they run (descending t).
std::vector<Step> respaced_steps(const NoiseSchedule& schedule, std::int64_t steps) {
  const std::vector<std::int64_t> visited = sampling_timesteps(schedule.timesteps(), steps);
  const at::Tensor abar_table = schedule.alphas_cumprod.contiguous();
  const double* abar = abar_table.data_ptr<double>();
  const std::size_t count = visited.size();
  // chain[k] is the k-th visited timestep in ascending order.
  std::vector<Step> chain(count);
  std::vector<double> posterior_variance(count);
  for (std::size_t k = 0; k < count; ++k) {
    Step& step = chain[k];
    step.t = visited[count - 1 - k];
    step.abar = abar[step.t];
    step.abar_prev = k == 0 ? 1.0 : chain[k - 1].abar;
    step.beta = 1 - step.abar / step.abar_prev;
    posterior_variance[k] = step.beta * (1 - step.abar_prev) / (1 - step.abar);
  }
  for (std::size_t k = 0; k < count; ++k) {
    Step& step = chain[k];
    const double last_step_variance = count > 1 ? posterior_variance[1] : chain[0].beta;
    step.log_variance_small = std::log(k == 0 ? last_step_variance : posterior_variance[k]);
    step.log_variance_large = std::log(k == 0 ? last_step_variance : step.beta);
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

void check_options(const SampleOptions& options, const at::Tensor& x_T, const std::optional<at::Tensor>& labels) {
  if (options.sampler != "ddim" && options.sampler != "ddpm") {
    throw std::invalid_argument(fmt::format("sampler must be ddim or ddpm, got '{}'", options.sampler));
  }
  const std::string& variance = options.variance;
  if (variance != "auto" && variance != "small" && variance != "large" && variance != "learned") {
    throw std::invalid_argument(
        fmt::format("variance must be auto, small, large or learned, got '{}'", options.variance));
  }
  if (!(options.eta >= 0) || !std::isfinite(options.eta)) {
    throw std::invalid_argument(fmt::format("eta must be a number >= 0, got {}", options.eta));
  }
  if (options.sampler == "ddpm" && options.eta != 0) {
    throw std::invalid_argument(fmt::format("eta applies to the ddim sampler only, got eta {} with ddpm", options.eta));
  }
  if (options.sampler == "ddim" && variance != "auto") {
    throw std::invalid_argument(
        fmt::format("variance applies to the ddpm sampler only (ddim takes eta), got '{}' with ddim", variance));
  }
  check_sampling_inputs(x_T, labels, Guidance{options.guidance, options.null_label, std::nullopt});
}

// The model's output for x at timestep t.
at::Tensor run_model(const ModelFunction& model, const at::Tensor& x, std::int64_t t,
                     const std::optional<at::Tensor>& labels, const SampleOptions& options) {
  const at::Tensor timesteps = at::full({x.size(0)}, t, at::TensorOptions().dtype(at::kLong).device(x.device()));
  return guided_output(model, x, timesteps, labels, Guidance{options.guidance, options.null_label, std::nullopt});
}

}  // namespace

std::vector<std::int64_t> sampling_timesteps(std::int64_t timesteps, std::int64_t steps) {
  if (timesteps < 1) throw std::invalid_argument(fmt::format("timesteps must be at least 1, got {}", timesteps));
  if (steps < 1 || steps > timesteps) {
    throw std::invalid_argument(
        fmt::format("sampling steps must be between 1 and the schedule's {} timesteps, got {}", timesteps, steps));
  }
  const at::Tensor grid =
      at::linspace(0.0, static_cast<double>(timesteps - 1), steps, at::TensorOptions().dtype(at::kDouble)).round();
  const double* values = grid.data_ptr<double>();
  std::vector<std::int64_t> visited(static_cast<std::size_t>(steps));
  for (std::int64_t i = 0; i < steps; ++i)
    visited[static_cast<std::size_t>(i)] = static_cast<std::int64_t>(values[steps - 1 - i]);
  return visited;
}

SampleResult sample(const NoiseSchedule& schedule, const ModelFunction& model, at::Tensor x_T,
                    const std::optional<at::Tensor>& labels, const SampleOptions& options, const NoiseSource& noise) {
  check_options(options, x_T, labels);
  const std::vector<Step> chain = respaced_steps(schedule, options.steps);
  const bool ddim = options.sampler == "ddim";

  at::NoGradGuard no_grad;
  std::optional<AutocastDisabled> autocast_off;
  if (!options.autocast) autocast_off.emplace(x_T.device().type());

  SampleResult result;
  at::Tensor x = x_T.to(at::kFloat);
  if (options.keep_trajectory) result.trajectory.push_back(x);
  const std::int64_t channels = x.size(1);

  for (std::size_t i = 0; i < chain.size(); ++i) {
    if (core::interrupt_requested()) throw core::Interrupted();
    const Step& step = chain[i];
    const bool last = i + 1 == chain.size();
    const std::int64_t step_index = static_cast<std::int64_t>(i);

    const at::Tensor output = run_model(model, x, step.t, labels, options);
    const bool learned = output.size(1) == 2 * channels;
    if (!ddim && options.variance == "learned" && !learned) {
      std::ostringstream message;
      message << "variance 'learned' needs a model output with " << 2 * channels << " channels, got shape "
              << output.sizes();
      throw std::invalid_argument(message.str());
    }
    const at::Tensor prediction = learned ? output.narrow(1, 0, channels) : output;

    const double sqrt_recip_abar = std::sqrt(1 / step.abar);
    const double sqrt_recipm1_abar = std::sqrt(1 / step.abar - 1);
    at::Tensor x0;
    switch (options.prediction) {
      case Prediction::eps:
        x0 = sqrt_recip_abar * x - sqrt_recipm1_abar * prediction;
        break;
      case Prediction::x0:
        x0 = prediction;
        break;
      case Prediction::v:
        x0 = std::sqrt(step.abar) * x - std::sqrt(1 - step.abar) * prediction;
        break;
    }
    if (options.clip) x0 = x0.clamp(-1, 1);

    at::Tensor next;
    if (ddim) {
      const at::Tensor eps = (sqrt_recip_abar * x - x0) / sqrt_recipm1_abar;
      const double sigma =
          options.eta * std::sqrt((1 - step.abar_prev) / (1 - step.abar)) * std::sqrt(1 - step.abar / step.abar_prev);
      const double eps_scale = std::sqrt(std::max(0.0, 1 - step.abar_prev - sigma * sigma));
      next = x0 * std::sqrt(step.abar_prev) + eps_scale * eps;
      if (!last && sigma > 0) next = next + sigma * draw_step_noise(noise, step_index, x);
    } else {
      const double coef1 = step.beta * std::sqrt(step.abar_prev) / (1 - step.abar);
      const double coef2 = (1 - step.abar_prev) * std::sqrt(1 - step.beta) / (1 - step.abar);
      next = coef1 * x0 + coef2 * x;
      if (!last) {
        const std::string& variance = options.variance;
        const bool use_learned = variance == "learned" || (variance == "auto" && learned);
        const at::Tensor z = draw_step_noise(noise, step_index, x);
        if (use_learned) {
          const at::Tensor fraction = (output.narrow(1, channels, channels) + 1) / 2;
          const at::Tensor log_variance = fraction * std::log(step.beta) + (1 - fraction) * step.log_variance_small;
          next = next + at::exp(0.5 * log_variance) * z;
        } else {
          const double log_variance = variance == "small" ? step.log_variance_small : step.log_variance_large;
          next = next + std::exp(0.5 * log_variance) * z;
        }
      }
    }
    x = next;
    if (options.keep_trajectory) result.trajectory.push_back(x);
  }
  result.x = x;
  return result;
}

}  // namespace runner::diffusion
