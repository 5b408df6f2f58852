// The integrators of the samplers, as SiT's transport/integrators.py: an ODE with fixed-step Euler or Heun or adaptive
// dopri5 (torchdiffeq's), and the steps of an SDE dx = drift dt + sqrt(2 w(t)) dW (Euler-Maruyama, Heun).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace runner::diffusion {

// The ODE's: euler, heun (torchdiffeq's euler and heun2) or dopri5 (adaptive); the SDE's: euler (Euler-Maruyama)
// or heun.
enum class Integrator { euler, heun, dopri5 };
// "euler", "heun" or "dopri5"; std::invalid_argument listing them otherwise.
Integrator parse_integrator(const std::string& name);

// linspace(t0, t1, count) as float32 values, as SiT's th.linspace.
std::vector<double> time_grid(double t0, double t1, std::int64_t count);

// An ODE's state: one tensor, or several integrated together (the likelihood's sample and log-density), as
// torchdiffeq's tuple states.
using OdeState = std::vector<at::Tensor>;
using OdeField = std::function<OdeState(const OdeState& y, double t)>;

// What a solver hands each state at a grid time after the first to (the trajectory keeps them; none: dropped).
using OdeStateSink = std::function<void(const OdeState&)>;

// The ODE from y0 over the grid (grid[0] is y0's time): the state at the grid's last time; the states at the grid
// times after the first go to `each`. Fixed steps step from grid time to grid time; dopri5 (torchdiffeq's: its first
// step, step control, and the 4th-order interpolant at each grid time; its steps do not stop at the grid's times)
// with tolerances rtol and atol. Checks Ctrl-C between steps (throws core::Interrupted).
OdeState solve_ode(const OdeField& f, const OdeState& y0, const std::vector<double>& grid, Integrator integrator,
                   double rtol, double atol, const OdeStateSink& each = {});

// An SDE's drift at (x, t).
using SdeDrift = std::function<at::Tensor(const at::Tensor& x, double t)>;

// One step of dt from (x, t) with the diffusion coefficient w(t) (per sample, broadcast over x) and the Brownian
// increment dw (noise times sqrt(dt)). Euler-Maruyama: x + drift(x, t) dt + sqrt(2 w) dw. Heun (SiT's): the noise
// added first, x_hat = x + sqrt(2 w) dw, then Heun's step of the drift from x_hat.
at::Tensor euler_maruyama_step(const SdeDrift& drift, const at::Tensor& x, double t, double dt,
                               const at::Tensor& diffusion, const at::Tensor& dw);
at::Tensor heun_sde_step(const SdeDrift& drift, const at::Tensor& x, double t, double dt, const at::Tensor& diffusion,
                         const at::Tensor& dw);

}  // namespace runner::diffusion
