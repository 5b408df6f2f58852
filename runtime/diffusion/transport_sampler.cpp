// SiT's ODE (Euler, Heun) and SDE (Euler-Maruyama, Heun) samplers over a flow-matching model, in float32.
#include "runtime/diffusion/transport_sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <stdexcept>

#include "runtime/core/interrupt.h"

namespace runner::diffusion {
namespace {

enum class LastStep { none, mean, tweedie, euler };

LastStep parse_last_step(const std::string& name) {
  if (name == "mean") return LastStep::mean;
  if (name == "tweedie") return LastStep::tweedie;
  if (name == "euler") return LastStep::euler;
  if (name == "none") return LastStep::none;
  throw std::invalid_argument(
      fmt::format("last_step must be \"mean\", \"tweedie\", \"euler\" or \"none\", got \"{}\"", name));
}

void check_options(const FlowSampleOptions& o) {
  if (o.sampler != "euler" && o.sampler != "heun")
    throw std::invalid_argument(fmt::format("sampler must be \"euler\" or \"heun\", got \"{}\"", o.sampler));
  if (o.steps < (o.sde ? 2 : 1))
    throw std::invalid_argument(fmt::format("steps must be at least {} {}, got {}", o.sde ? 2 : 1,
                                            o.sde ? "with sde (a step and the last step)" : "", o.steps));
  if (!std::isfinite(o.diffusion_norm) || o.diffusion_norm < 0)
    throw std::invalid_argument(fmt::format("diffusion_norm must be a number >= 0, got {}", o.diffusion_norm));
  if (!(o.last_step_size >= 0 && o.last_step_size < 1))
    throw std::invalid_argument(fmt::format("last_step_size must be in [0, 1), got {}", o.last_step_size));
  if (!o.sde) {
    const FlowSampleOptions defaults;
    if (o.diffusion_form != defaults.diffusion_form || o.diffusion_norm != defaults.diffusion_norm ||
        o.last_step != defaults.last_step || o.last_step_size != defaults.last_step_size)
      throw std::invalid_argument(
          "diffusion_form, diffusion_norm, last_step and last_step_size apply to the SDE sampler (sde = true)");
  }
}

// One model run at time t (all samples) as the velocity and the score, float32 like x.
class FlowField {
 public:
  FlowField(const Transport& transport, const Denoiser& model, const std::optional<at::Tensor>& labels,
            const Guidance& guidance)
      : transport_(transport), model_(model), labels_(labels), guidance_(guidance) {}

  // The model's prediction (its first C channels) at (x, t).
  at::Tensor prediction(const at::Tensor& x, double t) const {
    const at::Tensor output = guided_output(model_, x, times(x, t), labels_, guidance_);
    return output.size(1) == x.size(1) ? output : output.narrow(1, 0, x.size(1));
  }
  at::Tensor velocity(const at::Tensor& x, double t) const {
    return transport_.velocity(prediction(x, t), x, times(x, t));
  }
  at::Tensor score(const at::Tensor& x, double t) const { return transport_.score(prediction(x, t), x, times(x, t)); }
  // The SDE's drift v + w(t) score from one model run.
  at::Tensor sde_drift(const at::Tensor& x, double t, DiffusionForm form, double norm) const {
    const at::Tensor time = times(x, t);
    const at::Tensor out = prediction(x, t);
    return transport_.velocity(out, x, time) +
           per_sample(transport_.diffusion_coefficient(time, form, norm), x) * transport_.score(out, x, time);
  }
  // The model's times: float32 [B] as SiT's th.ones(B) * t.
  static at::Tensor times(const at::Tensor& x, double t) { return at::full({x.size(0)}, t, x.options()); }

 private:
  const Transport& transport_;
  const Denoiser& model_;
  const std::optional<at::Tensor>& labels_;
  Guidance guidance_;
};

// linspace(t0, t1, count) as float32 values, as SiT's th.linspace.
std::vector<double> time_grid(double t0, double t1, std::int64_t count) {
  const at::Tensor grid = at::linspace(t0, t1, count, at::TensorOptions().dtype(at::kFloat)).to(at::kDouble);
  const double* values = grid.data_ptr<double>();
  return {values, values + count};
}

}  // namespace

SampleResult sample_flow(const Transport& transport, const Denoiser& model, at::Tensor x_T,
                         const std::optional<at::Tensor>& labels, const FlowSampleOptions& options,
                         const NoiseSource& noise) {
  check_options(options);
  const Guidance guidance{options.guidance, options.null_label, options.guidance_channels};
  check_sampling_inputs(x_T, labels, guidance);
  const DiffusionForm form = parse_diffusion_form(options.diffusion_form);
  const LastStep last_step = parse_last_step(options.last_step);
  const bool heun = options.sampler == "heun";

  at::NoGradGuard no_grad;
  std::optional<AutocastDisabled> autocast_off;
  if (!options.autocast) autocast_off.emplace(x_T.device().type());

  const FlowField field(transport, model, labels, guidance);
  SampleResult result;
  at::Tensor x = x_T.to(at::kFloat);
  if (options.keep_trajectory) result.trajectory.push_back(x);
  auto keep = [&](const at::Tensor& value) {
    if (options.keep_trajectory) result.trajectory.push_back(value);
  };

  if (!options.sde) {
    const TimeInterval interval = transport.sampling_interval(false, form, 0);
    const std::vector<double> grid = time_grid(interval.t0, interval.t1, options.steps + 1);
    for (std::int64_t i = 0; i < options.steps; ++i) {
      if (core::interrupt_requested()) throw core::Interrupted();
      const double t = grid[i];
      const double dt = static_cast<double>(static_cast<float>(grid[i + 1] - grid[i]));
      const at::Tensor k1 = field.velocity(x, t);
      if (heun) {
        const at::Tensor k2 = field.velocity(x + dt * k1, t + dt);
        x = x + dt * (0.5 * k1 + 0.5 * k2);
      } else {
        x = x + dt * k1;
      }
      keep(x);
    }
    result.x = x;
    return result;
  }

  const double last_step_size = last_step == LastStep::none ? 0.0 : options.last_step_size;
  const TimeInterval interval = transport.sampling_interval(true, form, last_step_size);
  const std::vector<double> grid = time_grid(interval.t0, interval.t1, options.steps);
  const double dt = grid[1] - grid[0];
  const double sqrt_dt = std::sqrt(dt);
  for (std::int64_t i = 0; i + 1 < options.steps; ++i) {
    if (core::interrupt_requested()) throw core::Interrupted();
    const double t = grid[i];
    const at::Tensor dw = draw_step_noise(noise, i, x) * sqrt_dt;
    const at::Tensor diffusion =
        per_sample(transport.diffusion_coefficient(FlowField::times(x, t), form, options.diffusion_norm), x);
    if (heun) {
      const at::Tensor x_hat = x + at::sqrt(2 * diffusion) * dw;
      const at::Tensor k1 = field.sde_drift(x_hat, t, form, options.diffusion_norm);
      const at::Tensor x_pred = x_hat + dt * k1;
      const at::Tensor k2 = field.sde_drift(x_pred, t + dt, form, options.diffusion_norm);
      x = x_hat + 0.5 * dt * (k1 + k2);
    } else {
      const at::Tensor mean = x + field.sde_drift(x, t, form, options.diffusion_norm) * dt;
      x = mean + at::sqrt(2 * diffusion) * dw;
    }
    keep(x);
  }
  if (core::interrupt_requested()) throw core::Interrupted();
  const double t1 = interval.t1;
  switch (last_step) {
    case LastStep::none:
      break;
    case LastStep::mean:
      x = x + field.sde_drift(x, t1, form, options.diffusion_norm) * last_step_size;
      break;
    case LastStep::euler:
      x = x + field.velocity(x, t1) * last_step_size;
      break;
    case LastStep::tweedie: {
      const PathCoefficients c = transport.coefficients(FlowField::times(x, t1));
      const at::Tensor alpha = per_sample(c.alpha, x);
      x = x / alpha + per_sample(c.sigma * c.sigma, x) / alpha * field.score(x, t1);
      break;
    }
  }
  keep(x);
  result.x = x;
  return result;
}

}  // namespace runner::diffusion
