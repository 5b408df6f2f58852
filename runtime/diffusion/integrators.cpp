// torchdiffeq's fixed-step and dopri5 ODE solvers and SiT's SDE steps, over float32 states and double times.
#include "runtime/diffusion/integrators.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <utility>

#include "runtime/core/enum_table.h"
#include "runtime/core/interrupt.h"

namespace runner::diffusion {
namespace {

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

}  // namespace

const core::EnumTable<Integrator, 3> kIntegrators{
    {{{Integrator::euler, "euler"}, {Integrator::heun, "heun"}, {Integrator::dopri5, "dopri5"}}},
    core::NameQuotes::double_,
    "sampler must be {list}, got \"{got}\""};

Integrator parse_integrator(const std::string& name) { return kIntegrators.parse(name); }

std::vector<double> time_grid(double t0, double t1, std::int64_t count) {
  const at::Tensor grid = at::linspace(t0, t1, count, at::TensorOptions().dtype(at::kFloat)).to(at::kDouble);
  const double* values = grid.data_ptr<double>();
  return {values, values + count};
}

OdeState solve_ode(const OdeField& f, const OdeState& y0, const std::vector<double>& grid, Integrator integrator,
                   double rtol, double atol, const OdeStateSink& each) {
  if (integrator == Integrator::dopri5) return Dopri5(f, rtol, atol).solve(y0, grid, each);
  return fixed_steps(f, y0, grid, integrator == Integrator::heun, each);
}

at::Tensor euler_maruyama_step(const SdeDrift& drift, const at::Tensor& x, double t, double dt,
                               const at::Tensor& diffusion, const at::Tensor& dw) {
  const at::Tensor mean = x + drift(x, t) * dt;
  return mean + at::sqrt(2 * diffusion) * dw;
}

at::Tensor heun_sde_step(const SdeDrift& drift, const at::Tensor& x, double t, double dt, const at::Tensor& diffusion,
                         const at::Tensor& dw) {
  const at::Tensor x_hat = x + at::sqrt(2 * diffusion) * dw;
  const at::Tensor k1 = drift(x_hat, t);
  const at::Tensor x_pred = x_hat + dt * k1;
  const at::Tensor k2 = drift(x_pred, t + dt);
  return x_hat + 0.5 * dt * (k1 + k2);
}

}  // namespace runner::diffusion
