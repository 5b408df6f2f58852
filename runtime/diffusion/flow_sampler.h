// Sampling a flow-matching model (runtime/diffusion/flow.h) as SiT's transport Sampler does: the probability-flow
// ODE with fixed-step Euler or Heun or adaptive dopri5, or the SDE with Euler-Maruyama or Heun and SiT's last steps,
// with classifier-free guidance as SiT's forward_with_cfg.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>

#include "runtime/diffusion/flow.h"
#include "runtime/diffusion/integrators.h"
#include "runtime/diffusion/model_function.h"
#include "runtime/diffusion/sampling.h"

namespace runner::diffusion {

// The SDE sampler's last step to the end of its interval (SiT's last_step): mean (the drift's step), tweedie
// (Tweedie's denoised estimate), euler (the velocity's step) or none.
enum class LastStep { none, mean, tweedie, euler };
// "mean", "tweedie", "euler" or "none"; std::invalid_argument listing them otherwise.
LastStep parse_last_step(const std::string& name);

struct FlowSampleOptions {
  // The ODE's: euler, heun (torchdiffeq's euler and heun2) or dopri5 (torchdiffeq's adaptive dopri5, the solution
  // interpolated at the grid's times); the SDE's: euler (Euler-Maruyama) or heun.
  Integrator sampler = Integrator::euler;
  bool sde = false;      // false: the ODE
  bool reverse = false;  // the ODE from data to noise over the reversed interval (SiT's --reverse)
  // ODE: steps of the grid linspace(t0, t1, steps + 1) (SiT's num_sampling_steps is steps + 1);
  // SDE: steps - 1 steps over linspace(t0, t1, steps), then the last step (SiT's num_sampling_steps).
  std::int64_t steps = 50;
  DiffusionForm diffusion_form = DiffusionForm::sigma;  // SDE: w(t)
  double diffusion_norm = 1.0;                          // SDE: its scale
  LastStep last_step = LastStep::mean;                  // SDE
  double last_step_size = 0.04;                         // SDE: the last step's size (t1 = 1 - last_step_size)
  double rtol = 1e-3;                                   // dopri5: relative and absolute tolerances (SiT's defaults)
  double atol = 1e-6;
  double guidance = 1.0;                          // classifier-free guidance scale; 1 runs the conditional model alone
  std::optional<std::int64_t> guidance_channels;  // the channels guided (default all; SiT's forward_with_cfg: 3)
  std::optional<std::int64_t> null_label;         // the unconditional class id, required when guidance != 1
  bool keep_trajectory = false;
  bool autocast = false;  // true: the model runs under the caller's autocast state; false: autocast off
};

// Integrates from x_T [B, C, ...] (noise at t0, converted to float32) to data without gradients; the model sees
// times t in [0, 1] (float32 [B], as SiT's model) and its first C output channels are its prediction. The SDE draws
// its step noise from `noise` (step k of steps - 1). The trajectory holds x_T then x after every step (steps + 1
// entries). Checks Ctrl-C between steps. Throws std::invalid_argument naming the bad option.
SampleResult sample_flow(const Flow& flow, const ModelFunction& model, at::Tensor x_T,
                         const std::optional<at::Tensor>& labels, const FlowSampleOptions& options,
                         const NoiseSource& noise = {});

struct FlowLikelihoodOptions {
  Integrator sampler = Integrator::euler;  // as the ODE sampler's
  std::int64_t steps = 50;                 // steps of the grid linspace(t0, t1, steps + 1)
  double rtol = 1e-3;                      // dopri5's tolerances
  double atol = 1e-6;
  bool autocast = false;
};

struct FlowLikelihood {
  at::Tensor logp;  // float32 [B]: log p(x) in nats, summed over a sample's elements
  at::Tensor z;     // float32 [B, C, ...]: where the reverse ODE takes x (noise)
};

// The log-likelihood of data x [B, C, ...] as SiT's sample_ode_likelihood computes it: the probability-flow ODE run
// backwards from data (model time 1 - s for s over the sampling interval) together with the Hutchinson estimate of
// its divergence, probe . d(v . probe)/dx with a Rademacher probe per model evaluation (`probes`: evaluation k's),
// then log N(z; 0, I) - the integrated divergence. No guidance (SiT refuses it). Throws std::invalid_argument for
// bad options.
FlowLikelihood flow_likelihood(const Flow& flow, const ModelFunction& model, const at::Tensor& x,
                               const std::optional<at::Tensor>& labels, const FlowLikelihoodOptions& options,
                               const NoiseSource& probes);

// The likelihood's probes: `given` [evaluations, B, ...] (-1 and 1 only, as SiT draws them; evaluation k's is
// given[k]), or without them Rademacher draws of a generator on `device` seeded from `seed`. Throws
// std::invalid_argument for given probes that are not signs, and (when drawn from) of another shape than the
// model's input or too few for the solver's evaluations.
NoiseSource likelihood_probes(const std::optional<at::Tensor>& given, std::uint64_t seed, const c10::Device& device);

}  // namespace runner::diffusion
