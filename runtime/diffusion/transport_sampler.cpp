// SiT's ODE (Euler, Heun) and SDE (Euler-Maruyama, Heun) samplers over a flow-matching model, in float32.
#include "runtime/diffusion/transport_sampler.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <cmath>
#include <functional>
#include <stdexcept>
#include <utility>
#include <vector>

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
  if (!std::isfinite(o.diffusion_norm) || o.diffusion_norm < 0)
    throw std::invalid_argument(fmt::format("diffusion_norm must be a number >= 0, got {}", o.diffusion_norm));
  if (!(o.last_step_size >= 0 && o.last_step_size < 1))
    throw std::invalid_argument(fmt::format("last_step_size must be in [0, 1), got {}", o.last_step_size));
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

// RMS over every element (torchdiffeq's _rms_norm), read on the host.
double rms(const at::Tensor& x) { return x.square().mean().sqrt().item<double>(); }

// torchdiffeq's dopri5 (Dormand-Prince 5(4), Shampine's coefficients): its first step (Hairer, Norsett & Wanner
// II.4), step control (safety 0.9, factors in [0.2, 10], error ratio the RMS over the whole batch of
// error / (atol + rtol max(|y0|, |y1|))) and the 4th-order interpolant at each grid time after the first; the steps
// do not stop at the grid's times. The state is float32 and the times double.
class Dopri5 {
 public:
  using Field = std::function<at::Tensor(const at::Tensor& y, double t)>;

  Dopri5(Field f, double rtol, double atol) : f_(std::move(f)), rtol_(rtol), atol_(atol) {}

  // y at each grid time (grid[0] is y0's).
  std::vector<at::Tensor> solve(const at::Tensor& y0, const std::vector<double>& grid) {
    y_ = y0;
    t_ = grid[0];
    t_start_ = t_;
    f0_ = f_(y_, t_);
    dt_ = first_step();
    std::vector<at::Tensor> out{y0};
    for (std::size_t i = 1; i < grid.size(); ++i) {
      while (grid[i] > t_) {
        if (core::interrupt_requested()) throw core::Interrupted();
        step();
      }
      out.push_back(interpolate(grid[i]));
    }
    return out;
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
    const at::Tensor scale = atol_ + y_.abs() * rtol_;
    const double d0 = rms(y_ / scale);
    const double d1 = rms(f0_ / scale);
    const double h0 = d0 < 1e-5 || d1 < 1e-5 ? 1e-6 : 0.01 * d0 / d1;
    const at::Tensor f1 = f_(y_ + h0 * f0_, t_ + h0);
    const double d2 = rms((f1 - f0_) / scale) / h0;
    const double h1 =
        d1 <= 1e-15 && d2 <= 1e-15 ? std::max(1e-6, h0 * 1e-3) : std::pow(0.01 / std::max(d1, d2), 1.0 / 5);
    return std::min(100 * h0, h1);
  }

  // The weighted sum of the stages with weights w (dt included), as a change of y.
  static at::Tensor combine(const std::vector<at::Tensor>& k, const double* w, std::size_t count, double dt) {
    at::Tensor sum = k[0] * (w[0] * dt);
    for (std::size_t j = 1; j < count; ++j)
      if (w[j] != 0) sum = sum + k[j] * (w[j] * dt);
    return sum;
  }

  void step() {
    const double dt = std::isfinite(dt_) ? dt_ : 0.0;
    const double t1 = t_ + dt;
    if (!(t1 > t_)) throw std::runtime_error(fmt::format("dopri5: the step size underflowed at t = {}", t_));
    std::vector<at::Tensor> k{f0_};
    at::Tensor y1;
    for (std::size_t i = 0; i < 6; ++i) {
      const double ti = kAlpha[i] == 1.0 ? t1 : t_ + kAlpha[i] * dt;
      const at::Tensor yi = y_ + combine(k, kBeta[i], i + 1, dt);
      k.push_back(f_(yi, ti));
      y1 = yi;
    }
    const at::Tensor error = combine(k, kError, 7, dt);
    const double ratio = rms(error / (atol_ + rtol_ * at::max(y_.abs(), y1.abs())));
    if (ratio <= 1) {
      const at::Tensor y_mid = y_ + combine(k, kMid, 7, dt);
      const at::Tensor& f0 = k[0];
      const at::Tensor& f1 = k[6];
      coefficients_ = {y_, dt * f0, dt * (f1 - 4 * f0) - 11 * y_ - 5 * y1 + 16 * y_mid,
                       dt * (5 * f0 - 3 * f1) + 18 * y_ + 14 * y1 - 32 * y_mid,
                       2 * dt * (f1 - f0) - 8 * (y1 + y_) + 16 * y_mid};
      t_start_ = t_;
      t_ = t1;
      y_ = y1;
      f0_ = f1;
    }
    if (ratio == 0) {
      dt_ = dt * 10;
    } else {
      const double shrink = ratio < 1 ? 1.0 : 0.2;
      dt_ = dt * std::min(10.0, std::max(0.9 / std::pow(ratio, 1.0 / 5), shrink));
    }
  }

  at::Tensor interpolate(double t) const {
    if (t == t_start_ && coefficients_.empty()) return y_;
    const double x = (t - t_start_) / (t_ - t_start_);
    at::Tensor total = coefficients_[0] + x * coefficients_[1];
    double power = x;
    for (std::size_t i = 2; i < coefficients_.size(); ++i) {
      power *= x;
      total = total + power * coefficients_[i];
    }
    return total;
  }

  Field f_;
  double rtol_;
  double atol_;
  at::Tensor y_, f0_;
  double t_ = 0, t_start_ = 0, dt_ = 0;
  std::vector<at::Tensor> coefficients_;  // e, d, c, b, a of the last accepted step
};

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
    if (options.sampler == "dopri5") {
      Dopri5 solver([&](const at::Tensor& y, double t) { return field.velocity(y, t); }, options.rtol, options.atol);
      std::vector<at::Tensor> points = solver.solve(x, grid);
      result.x = points.back();
      if (options.keep_trajectory) result.trajectory = std::move(points);
      return result;
    }
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
