// SiT's ODE (Euler, Heun) and SDE (Euler-Maruyama, Heun) samplers over a flow-matching model, in float32.
#include "runtime/diffusion/transport_sampler.h"

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

namespace runner::diffusion {
namespace {

enum class LastStep { none, mean, tweedie, euler };

const core::EnumTable<LastStep, 4> kLastSteps{
    {{{LastStep::mean, "mean"}, {LastStep::tweedie, "tweedie"}, {LastStep::euler, "euler"}, {LastStep::none, "none"}}},
    core::NameQuotes::double_,
    "last_step must be {list}, got \"{got}\""};

LastStep parse_last_step(const std::string& name) { return kLastSteps.parse(name); }

void check_options(const FlowSampleOptions& o) {
  if (o.sampler != "euler" && o.sampler != "heun" && (o.sde || o.sampler != "dopri5"))
    throw std::invalid_argument(fmt::format("sampler must be \"euler\", \"heun\"{}, got \"{}\"",
                                            o.sde ? " (the SDE's)" : " or \"dopri5\"", o.sampler));
  if (!(o.rtol > 0) || !(o.atol > 0) || !std::isfinite(o.rtol) || !std::isfinite(o.atol))
    throw std::invalid_argument(fmt::format("rtol and atol must be positive numbers, got {} and {}", o.rtol, o.atol));
  const FlowSampleOptions defaults;
  if (o.sampler != "dopri5" && (o.rtol != defaults.rtol || o.atol != defaults.atol))
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
  FlowField(const Transport& transport, const ModelFunction& model, const std::optional<at::Tensor>& labels,
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
  const ModelFunction& model_;
  const std::optional<at::Tensor>& labels_;
  Guidance guidance_;
};

// linspace(t0, t1, count) as float32 values, as SiT's th.linspace.
std::vector<double> time_grid(double t0, double t1, std::int64_t count) {
  const at::Tensor grid = at::linspace(t0, t1, count, at::TensorOptions().dtype(at::kFloat)).to(at::kDouble);
  const double* values = grid.data_ptr<double>();
  return {values, values + count};
}

// An ODE's state: one tensor, or several integrated together (the likelihood's sample and log-density), as
// torchdiffeq's tuple states.
using OdeState = std::vector<at::Tensor>;
using OdeField = std::function<OdeState(const OdeState& y, double t)>;

// a + sum_j w_j dt k_j, component by component (zero weights skipped).
OdeState add_stages(const OdeState& a, const std::vector<OdeState>& k, const double* w, std::size_t count, double dt) {
  OdeState out = a;
  for (std::size_t c = 0; c < a.size(); ++c) {
    at::Tensor sum;
    for (std::size_t j = 0; j < count; ++j) {
      if (w[j] == 0) continue;
      const at::Tensor term = k[j][c] * (w[j] * dt);
      sum = sum.defined() ? sum + term : term;
    }
    if (sum.defined()) out[c] = a.empty() || !a[c].defined() ? sum : a[c] + sum;
  }
  return out;
}

// What a solver hands each state at a grid time after the first to (the trajectory keeps them; none: dropped).
using OdeStateSink = std::function<void(const OdeState&)>;

// Fixed steps over the grid: Euler, or Heun (torchdiffeq's heun2). The state at the grid's end; each one after a
// step goes to `each`.
OdeState fixed_steps(const OdeField& f, OdeState y, const std::vector<double>& grid, bool heun,
                     const OdeStateSink& each) {
  for (std::size_t i = 0; i + 1 < grid.size(); ++i) {
    if (core::interrupt_requested()) throw core::Interrupted();
    const double t = grid[i];
    const double dt = static_cast<double>(static_cast<float>(grid[i + 1] - grid[i]));
    const OdeState k1 = f(y, t);
    if (heun) {
      OdeState predicted = y;
      for (std::size_t c = 0; c < y.size(); ++c) predicted[c] = y[c] + dt * k1[c];
      const OdeState k2 = f(predicted, t + dt);
      for (std::size_t c = 0; c < y.size(); ++c) y[c] = y[c] + dt * (0.5 * k1[c] + 0.5 * k2[c]);
    } else {
      for (std::size_t c = 0; c < y.size(); ++c) y[c] = y[c] + dt * k1[c];
    }
    if (each) each(y);
  }
  return y;
}

// torchdiffeq's norm of a state: the largest RMS over its components (_mixed_norm; _rms_norm for one), on the host.
double state_norm(const OdeState& y) {
  double norm = 0;
  for (const at::Tensor& c : y) norm = std::max(norm, c.square().mean().sqrt().item<double>());
  return norm;
}

// torchdiffeq's dopri5 (Dormand-Prince 5(4), Shampine's coefficients): its first step (Hairer, Norsett & Wanner
// II.4), step control (safety 0.9, factors in [0.2, 10], error ratio the norm over the whole batch of
// error / (atol + rtol max(|y0|, |y1|))) and the 4th-order interpolant at each grid time after the first; the steps
// do not stop at the grid's times. The state is float32 and the times double.
class Dopri5 {
 public:
  Dopri5(OdeField f, double rtol, double atol) : f_(std::move(f)), rtol_(rtol), atol_(atol) {}

  // y at the grid's last time (grid[0] is y0's); y at each grid time after the first goes to `each`.
  OdeState solve(const OdeState& y0, const std::vector<double>& grid, const OdeStateSink& each) {
    y_ = y0;
    t_ = grid[0];
    t_start_ = t_;
    f0_ = f_(y_, t_);
    dt_ = first_step();
    OdeState last = y0;
    for (std::size_t i = 1; i < grid.size(); ++i) {
      while (grid[i] > t_) {
        if (core::interrupt_requested()) throw core::Interrupted();
        step();
      }
      last = interpolate(grid[i]);
      if (each) each(last);
    }
    return last;
  }

 private:
  static constexpr double kAlpha[6] = {1.0 / 5, 3.0 / 10, 4.0 / 5, 8.0 / 9, 1.0, 1.0};
  static constexpr double kBeta[6][6] = {
      {1.0 / 5},
      {3.0 / 40, 9.0 / 40},
      {44.0 / 45, -56.0 / 15, 32.0 / 9},
      {19372.0 / 6561, -25360.0 / 2187, 64448.0 / 6561, -212.0 / 729},
      {9017.0 / 3168, -355.0 / 33, 46732.0 / 5247, 49.0 / 176, -5103.0 / 18656},
      {35.0 / 384, 0, 500.0 / 1113, 125.0 / 192, -2187.0 / 6784, 11.0 / 84},
  };
  static constexpr double kError[7] = {35.0 / 384 - 1951.0 / 21600,
                                       0,
                                       500.0 / 1113 - 22642.0 / 50085,
                                       125.0 / 192 - 451.0 / 720,
                                       -2187.0 / 6784 - -12231.0 / 42400,
                                       11.0 / 84 - 649.0 / 6300,
                                       -1.0 / 60};
  static constexpr double kMid[7] = {6025192743.0 / 30085553152 / 2,     0,
                                     51252292925.0 / 65400821598 / 2,    -2691868925.0 / 45128329728 / 2,
                                     187940372067.0 / 1594534317056 / 2, -1776094331.0 / 19743644256 / 2,
                                     11237099.0 / 235043384 / 2};

  double first_step() {
    OdeState scaled_y, scaled_f, y1;
    std::vector<at::Tensor> scales;
    for (std::size_t c = 0; c < y_.size(); ++c) {
      scales.push_back(atol_ + y_[c].abs() * rtol_);
      scaled_y.push_back(y_[c] / scales[c]);
      scaled_f.push_back(f0_[c] / scales[c]);
    }
    const double d0 = state_norm(scaled_y);
    const double d1 = state_norm(scaled_f);
    const double h0 = d0 < 1e-5 || d1 < 1e-5 ? 1e-6 : 0.01 * d0 / d1;
    for (std::size_t c = 0; c < y_.size(); ++c) y1.push_back(y_[c] + h0 * f0_[c]);
    const OdeState f1 = f_(y1, t_ + h0);
    OdeState change;
    for (std::size_t c = 0; c < y_.size(); ++c) change.push_back((f1[c] - f0_[c]) / scales[c]);
    const double d2 = state_norm(change) / h0;
    const double h1 =
        d1 <= 1e-15 && d2 <= 1e-15 ? std::max(1e-6, h0 * 1e-3) : std::pow(0.01 / std::max(d1, d2), 1.0 / 5);
    return std::min(100 * h0, h1);
  }

  void step() {
    const double dt = std::isfinite(dt_) ? dt_ : 0.0;
    const double t1 = t_ + dt;
    if (!(t1 > t_)) throw std::runtime_error(fmt::format("dopri5: the step size underflowed at t = {}", t_));
    std::vector<OdeState> k{f0_};
    OdeState y1;
    for (std::size_t i = 0; i < 6; ++i) {
      const double ti = kAlpha[i] == 1.0 ? t1 : t_ + kAlpha[i] * dt;
      y1 = add_stages(y_, k, kBeta[i], i + 1, dt);
      k.push_back(f_(y1, ti));
    }
    const OdeState error = add_stages(OdeState(y_.size()), k, kError, 7, dt);
    OdeState relative;
    for (std::size_t c = 0; c < y_.size(); ++c)
      relative.push_back(error[c] / (atol_ + rtol_ * at::max(y_[c].abs(), y1[c].abs())));
    const double ratio = state_norm(relative);
    if (ratio <= 1) {
      const OdeState y_mid = add_stages(y_, k, kMid, 7, dt);
      coefficients_.clear();
      for (std::size_t c = 0; c < y_.size(); ++c) {
        const at::Tensor& y0 = y_[c];
        const at::Tensor& f0 = k[0][c];
        const at::Tensor& f1 = k[6][c];
        coefficients_.push_back({y0, dt * f0, dt * (f1 - 4 * f0) - 11 * y0 - 5 * y1[c] + 16 * y_mid[c],
                                 dt * (5 * f0 - 3 * f1) + 18 * y0 + 14 * y1[c] - 32 * y_mid[c],
                                 2 * dt * (f1 - f0) - 8 * (y1[c] + y0) + 16 * y_mid[c]});
      }
      t_start_ = t_;
      t_ = t1;
      y_ = y1;
      f0_ = k[6];
    }
    if (ratio == 0) {
      dt_ = dt * 10;
    } else {
      const double shrink = ratio < 1 ? 1.0 : 0.2;
      dt_ = dt * std::min(10.0, std::max(0.9 / std::pow(ratio, 1.0 / 5), shrink));
    }
  }

  OdeState interpolate(double t) const {
    if (coefficients_.empty()) return y_;
    const double x = (t - t_start_) / (t_ - t_start_);
    OdeState out;
    for (const std::vector<at::Tensor>& c : coefficients_) {
      at::Tensor total = c[0] + x * c[1];
      double power = x;
      for (std::size_t i = 2; i < c.size(); ++i) {
        power *= x;
        total = total + power * c[i];
      }
      out.push_back(total);
    }
    return out;
  }

  OdeField f_;
  double rtol_;
  double atol_;
  OdeState y_, f0_;
  double t_ = 0, t_start_ = 0, dt_ = 0;
  std::vector<std::vector<at::Tensor>> coefficients_;  // per component: e, d, c, b, a of the last accepted step
};

// The ODE from y0 over the grid with the named sampler: the state at the grid's last time; the states at the grid
// times after the first go to `each`.
OdeState solve_ode(const OdeField& f, const OdeState& y0, const std::vector<double>& grid, const std::string& sampler,
                   double rtol, double atol, const OdeStateSink& each = {}) {
  if (sampler == "dopri5") return Dopri5(f, rtol, atol).solve(y0, grid, each);
  return fixed_steps(f, y0, grid, sampler == "heun", each);
}

}  // namespace

SampleResult sample_flow(const Transport& transport, const ModelFunction& model, at::Tensor x_T,
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
    TimeInterval interval = transport.sampling_interval(false, form, 0);
    if (options.reverse) interval = {1 - interval.t0, 1 - interval.t1};
    std::vector<double> grid = time_grid(interval.t0, interval.t1, options.steps + 1);
    OdeField velocity = [&](const OdeState& y, double t) { return OdeState{field.velocity(y[0], t)}; };
    if (options.reverse && options.sampler == "dopri5") {
      // As torchdiffeq solves on decreasing times: forward in -t with the field negated.
      for (double& t : grid) t = -t;
      velocity = [&](const OdeState& y, double t) { return OdeState{-field.velocity(y[0], -t)}; };
    }
    OdeStateSink each;
    if (options.keep_trajectory) each = [&](const OdeState& y) { result.trajectory.push_back(y[0]); };
    result.x = solve_ode(velocity, {x}, grid, options.sampler, options.rtol, options.atol, each)[0];
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

FlowLikelihood flow_likelihood(const Transport& transport, const ModelFunction& model, const at::Tensor& x,
                               const std::optional<at::Tensor>& labels, const FlowLikelihoodOptions& options,
                               const NoiseSource& probes) {
  if (options.sampler != "euler" && options.sampler != "heun" && options.sampler != "dopri5")
    throw std::invalid_argument(
        fmt::format("sampler must be \"euler\", \"heun\" or \"dopri5\", got \"{}\"", options.sampler));
  if (options.steps < 1) throw std::invalid_argument(fmt::format("steps must be at least 1, got {}", options.steps));
  if (options.steps > kMaxSteps)
    throw std::invalid_argument(fmt::format("steps must be at most {}, got {}", kMaxSteps, options.steps));
  if (!(options.rtol > 0) || !(options.atol > 0))
    throw std::invalid_argument(
        fmt::format("rtol and atol must be positive numbers, got {} and {}", options.rtol, options.atol));
  check_sampling_inputs(x, labels, Guidance{});
  std::optional<AutocastDisabled> autocast_off;
  if (!options.autocast) autocast_off.emplace(x.device().type());

  const FlowField field(transport, model, labels, Guidance{});
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
  const TimeInterval interval = transport.sampling_interval(false, DiffusionForm::sigma, 0);
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
