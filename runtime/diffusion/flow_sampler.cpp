// SiT's ODE (Euler, Heun) and SDE (Euler-Maruyama, Heun) samplers over a flow-matching model, in float32.
#include "runtime/diffusion/flow_sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <utility>
#include <vector>

#include "runtime/core/enum_table.h"
#include "runtime/core/interrupt.h"
#include "runtime/diffusion/integrators.h"

namespace runner::diffusion {
namespace {

void check_options(const FlowSampleOptions& o) {
  if (o.sde && o.sampler == Integrator::dopri5)
    throw std::invalid_argument("sampler must be \"euler\", \"heun\" (the SDE's), got \"dopri5\"");
  if (!(o.rtol > 0) || !(o.atol > 0) || !std::isfinite(o.rtol) || !std::isfinite(o.atol))
    throw std::invalid_argument(fmt::format("rtol and atol must be positive numbers, got {} and {}", o.rtol, o.atol));
  const FlowSampleOptions defaults;
  if (o.sampler != Integrator::dopri5 && (o.rtol != defaults.rtol || o.atol != defaults.atol))
    throw std::invalid_argument("rtol and atol apply to the adaptive sampler (sampler = \"dopri5\")");
  if (o.sde && o.steps < 2)
    throw std::invalid_argument(
        fmt::format("steps must be at least 2 with sde (a step and the last step), got {}", o.steps));
  if (o.steps < 1) throw std::invalid_argument(fmt::format("steps must be at least 1, got {}", o.steps));
  if (o.steps > kMaxSteps)
    throw std::invalid_argument(fmt::format("steps must be at most {}, got {}", kMaxSteps, o.steps));
  if (!std::isfinite(o.diffusion_norm) || o.diffusion_norm < 0)
    throw std::invalid_argument(fmt::format("diffusion_norm must be a number >= 0, got {}", o.diffusion_norm));
  if (!(o.last_step_size >= 0 && o.last_step_size < 1))
    throw std::invalid_argument(fmt::format("last_step_size must be in [0, 1), got {}", o.last_step_size));
  if (o.sde && o.reverse) throw std::invalid_argument("reverse applies to the ODE sampler (sde = false)");
  if (!o.sde) {
    if (o.diffusion_form != defaults.diffusion_form || o.diffusion_norm != defaults.diffusion_norm ||
        o.last_step != defaults.last_step || o.last_step_size != defaults.last_step_size)
      throw std::invalid_argument(
          "diffusion_form, diffusion_norm, last_step and last_step_size apply to the SDE sampler (sde = true)");
  }
}

// One model run at time t (all samples) as the velocity and the score, float32 like x.
class FlowField {
 public:
  FlowField(const Flow& flow, const ModelFunction& model, const std::optional<at::Tensor>& labels,
            const Guidance& guidance)
      : flow_(flow), model_(model), labels_(labels), guidance_(guidance) {}

  // The model's prediction (its first C channels) at (x, t).
  at::Tensor prediction(const at::Tensor& x, double t) const {
    const at::Tensor output = guided_output(model_, x, times(x, t), labels_, guidance_);
    return output.size(1) == x.size(1) ? output : output.narrow(1, 0, x.size(1));
  }
  at::Tensor velocity(const at::Tensor& x, double t) const { return flow_.velocity(prediction(x, t), x, times(x, t)); }
  at::Tensor score(const at::Tensor& x, double t) const { return flow_.score(prediction(x, t), x, times(x, t)); }
  // The SDE's drift v + w(t) score from one model run.
  at::Tensor sde_drift(const at::Tensor& x, double t, DiffusionForm form, double norm) const {
    const at::Tensor time = times(x, t);
    const at::Tensor out = prediction(x, t);
    return flow_.velocity(out, x, time) +
           per_sample(flow_.diffusion_coefficient(time, form, norm), x) * flow_.score(out, x, time);
  }
  // The model's times: float32 [B] as SiT's th.ones(B) * t.
  static at::Tensor times(const at::Tensor& x, double t) { return at::full({x.size(0)}, t, x.options()); }

 private:
  const Flow& flow_;
  const ModelFunction& model_;
  const std::optional<at::Tensor>& labels_;
  Guidance guidance_;
};

}  // namespace

const core::EnumTable<LastStep, 4> kLastSteps{
    {{{LastStep::mean, "mean"}, {LastStep::tweedie, "tweedie"}, {LastStep::euler, "euler"}, {LastStep::none, "none"}}},
    core::NameQuotes::double_,
    "last_step must be {list}, got \"{got}\""};

LastStep parse_last_step(const std::string& name) { return kLastSteps.parse(name); }

SampleResult sample_flow(const Flow& flow, const ModelFunction& model, at::Tensor x_T,
                         const std::optional<at::Tensor>& labels, const FlowSampleOptions& options,
                         const NoiseSource& noise) {
  check_options(options);
  const Guidance guidance{options.guidance, options.null_label, options.guidance_channels};
  check_sampling_inputs(x_T, labels, guidance);
  const DiffusionForm form = options.diffusion_form;
  const LastStep last_step = options.last_step;
  const Integrator integrator = options.sampler;

  at::NoGradGuard no_grad;
  std::optional<AutocastDisabled> autocast_off;
  if (!options.autocast) autocast_off.emplace(x_T.device().type());

  const FlowField field(flow, model, labels, guidance);
  SampleResult result;
  at::Tensor x = x_T.to(at::kFloat);
  if (options.keep_trajectory) result.trajectory.push_back(x);
  auto keep = [&](const at::Tensor& value) {
    if (options.keep_trajectory) result.trajectory.push_back(value);
  };

  if (!options.sde) {
    TimeInterval interval = flow.sampling_interval(false, form, 0);
    if (options.reverse) interval = {1 - interval.t0, 1 - interval.t1};
    std::vector<double> grid = time_grid(interval.t0, interval.t1, options.steps + 1);
    OdeField velocity = [&](const OdeState& y, double t) { return OdeState{field.velocity(y[0], t)}; };
    if (options.reverse && integrator == Integrator::dopri5) {
      // As torchdiffeq solves on decreasing times: forward in -t with the field negated.
      for (double& t : grid) t = -t;
      velocity = [&](const OdeState& y, double t) { return OdeState{-field.velocity(y[0], -t)}; };
    }
    OdeStateSink each;
    if (options.keep_trajectory) each = [&](const OdeState& y) { result.trajectory.push_back(y[0]); };
    result.x = solve_ode(velocity, {x}, grid, integrator, options.rtol, options.atol, each)[0];
    return result;
  }

  const double last_step_size = last_step == LastStep::none ? 0.0 : options.last_step_size;
  const TimeInterval interval = flow.sampling_interval(true, form, last_step_size);
  const std::vector<double> grid = time_grid(interval.t0, interval.t1, options.steps);
  const double dt = grid[1] - grid[0];
  const double sqrt_dt = std::sqrt(dt);
  const SdeDrift drift = [&](const at::Tensor& y, double t) {
    return field.sde_drift(y, t, form, options.diffusion_norm);
  };
  for (std::int64_t i = 0; i + 1 < options.steps; ++i) {
    if (core::interrupt_requested()) throw core::Interrupted();
    const double t = grid[i];
    const at::Tensor dw = draw_step_noise(noise, i, x) * sqrt_dt;
    const at::Tensor diffusion =
        per_sample(flow.diffusion_coefficient(FlowField::times(x, t), form, options.diffusion_norm), x);
    x = integrator == Integrator::heun ? heun_sde_step(drift, x, t, dt, diffusion, dw)
                                       : euler_maruyama_step(drift, x, t, dt, diffusion, dw);
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
      const PathCoefficients c = flow.coefficients(FlowField::times(x, t1));
      const at::Tensor alpha = per_sample(c.alpha, x);
      x = x / alpha + per_sample(c.sigma * c.sigma, x) / alpha * field.score(x, t1);
      break;
    }
  }
  keep(x);
  result.x = x;
  return result;
}

FlowLikelihood flow_likelihood(const Flow& flow, const ModelFunction& model, const at::Tensor& x,
                               const std::optional<at::Tensor>& labels, const FlowLikelihoodOptions& options,
                               const NoiseSource& probes) {
  if (options.steps < 1) throw std::invalid_argument(fmt::format("steps must be at least 1, got {}", options.steps));
  if (options.steps > kMaxSteps)
    throw std::invalid_argument(fmt::format("steps must be at most {}, got {}", kMaxSteps, options.steps));
  if (!(options.rtol > 0) || !(options.atol > 0))
    throw std::invalid_argument(
        fmt::format("rtol and atol must be positive numbers, got {} and {}", options.rtol, options.atol));
  check_sampling_inputs(x, labels, Guidance{});
  std::optional<AutocastDisabled> autocast_off;
  if (!options.autocast) autocast_off.emplace(x.device().type());

  const FlowField field(flow, model, labels, Guidance{});
  std::int64_t evaluation = 0;
  const OdeField reverse = [&](const OdeState& y, double s) {
    const double t = 1.0 - static_cast<double>(static_cast<float>(s));
    const at::Tensor probe = draw_step_noise(probes, evaluation++, y[0]);
    at::AutoGradMode grad_on(true);
    const at::Tensor x_in = y[0].detach().requires_grad_(true);
    const at::Tensor v = field.velocity(x_in, t);
    const at::Tensor grad = torch::autograd::grad({(v * probe).sum()}, {x_in})[0];
    return OdeState{-v.detach(), (grad * probe).flatten(1).sum(1).detach()};
  };
  const TimeInterval interval = flow.sampling_interval(false, DiffusionForm::sigma, 0);
  const std::vector<double> grid = time_grid(interval.t0, interval.t1, options.steps + 1);
  const at::Tensor start = x.to(at::kFloat).detach();
  const OdeState end = solve_ode(reverse, {start, at::zeros({start.size(0)}, start.options())}, grid, options.sampler,
                                 options.rtol, options.atol);
  FlowLikelihood out;
  out.z = end[0];
  const double elements = static_cast<double>(start[0].numel());
  const at::Tensor prior = -elements / 2 * std::log(2 * M_PI) - out.z.square().flatten(1).sum(1) / 2;
  out.logp = prior - end[1];
  return out;
}

NoiseSource likelihood_probes(const std::optional<at::Tensor>& given, std::uint64_t seed, const c10::Device& device) {
  if (given) {
    const at::Tensor all = *given;
    const at::Tensor not_a_sign = all.abs().ne(1);
    if (not_a_sign.any().item<bool>())
      throw std::invalid_argument(
          fmt::format("likelihood: probes must hold -1 and 1 only (Rademacher probes, as SiT draws them), got {}",
                      all.masked_select(not_a_sign)[0].item<double>()));
    return [all](std::int64_t evaluation, const at::Tensor& like) {
      if (all.dim() != like.dim() + 1 || all[0].sizes() != like.sizes())
        throw std::invalid_argument(fmt::format("likelihood: probes must be [evaluations, {}], got [{}]",
                                                fmt::join(like.sizes(), ", "), fmt::join(all.sizes(), ", ")));
      if (evaluation >= all.size(0))
        throw std::invalid_argument(fmt::format(
            "likelihood: the solver evaluated the model more than the {} times the probes cover", all.size(0)));
      return all[evaluation].to(like.options());
    };
  }
  auto generator = at::globalContext().defaultGenerator(device).clone();
  {
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_current_seed(seed ^ 0x9b0be5ULL);
  }
  return [generator](std::int64_t, const at::Tensor& like) {
    return at::randint(0, 2, like.sizes(), generator, like.options()).mul_(2).sub_(1);
  };
}

}  // namespace runner::diffusion
