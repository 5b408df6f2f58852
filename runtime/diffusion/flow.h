// Flow matching as SiT defines it (willisma/SiT transport/path.py, transport.py): interpolant paths between noise
// and data, the model's prediction targets, the loss weightings, the time ranges and the ODE/SDE drift terms.
//
// Time runs as in SiT: t = 0 is pure noise, t = 1 is data, x_t = alpha_t x1 + sigma_t x0 with x1 the data and x0
// standard normal noise (the rectified-flow papers and diffusers run the other way, sigma = 1 - t).
//   linear: alpha = t, sigma = 1 - t (SiT's ICPlan; rectified flow)
//   gvp:    alpha = sin(pi t / 2), sigma = cos(pi t / 2)
//   vp:     alpha = exp(m(t)), sigma = sqrt(1 - exp(2 m(t))), m(t) = -(1 - t)^2 (20 - 0.1) / 4 - (1 - t) 0.1 / 2
// Coefficients are computed in float64 from the times and converted to the images' dtype.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <utility>

#include "runtime/diffusion/keyed_objective.h"
#include "runtime/diffusion/model_function.h"
#include "runtime/diffusion/sample_streams.h"

namespace runner::diffusion {

enum class InterpolantPath { linear, gvp, vp };
// What the model predicts: the velocity d/dt x_t, the noise x0, or the score grad log p_t(x).
enum class FlowPrediction { velocity, noise, score };
// SiT's loss_weight for noise and score predictions: none (1), velocity ((drift_var / sigma)^2), likelihood
// (drift_var / sigma^2).
enum class FlowLossWeight { none, velocity, likelihood };
// SiT's diffusion_form of the SDE sampler's diffusion coefficient w(t) (times diffusion_norm).
enum class DiffusionForm { constant, sbdm, sigma, linear, decreasing, increasing_decreasing };

// "linear", "gvp", "vp" / "velocity", "noise", "score" / "none", "velocity", "likelihood" / "constant", "sbdm",
// "sigma", "linear", "decreasing", "increasing-decreasing"; each throws std::invalid_argument naming the choices.
InterpolantPath parse_interpolant_path(const std::string& name);
FlowPrediction parse_flow_prediction(const std::string& name);
FlowLossWeight parse_flow_loss_weight(const std::string& name);
DiffusionForm parse_diffusion_form(const std::string& name);
std::string interpolant_path_name(InterpolantPath path);
std::string flow_prediction_name(FlowPrediction prediction);
std::string flow_loss_weight_name(FlowLossWeight weight);
std::string diffusion_form_name(DiffusionForm form);

struct FlowOptions {
  InterpolantPath path = InterpolantPath::linear;
  FlowPrediction prediction = FlowPrediction::velocity;
  FlowLossWeight loss_weight = FlowLossWeight::none;
  // Unset: SiT's create_transport defaults: vp 1e-5 (training) and 1e-3 (sampling); noise or score prediction on
  // linear and gvp 1e-3 and 1e-3; velocity on linear and gvp 0 and 0 (stable everywhere).
  std::optional<double> train_eps;
  std::optional<double> sample_eps;
};

// The path's coefficients at times t, each shaped like t.
struct PathCoefficients {
  at::Tensor alpha, d_alpha, sigma, d_sigma;
};

// The interval [t0, t1] of times.
struct TimeInterval {
  double t0 = 0;
  double t1 = 1;
};

// A per-sample coefficient [B] shaped to broadcast over x [B, ...], in x's dtype.
at::Tensor per_sample(const at::Tensor& coefficient, const at::Tensor& x);

class Flow {
 public:
  // Throws std::invalid_argument for a loss_weight with velocity prediction (SiT weights only noise and score
  // losses) and for eps outside [0, 0.5).
  explicit Flow(FlowOptions options);

  const FlowOptions& options() const { return options_; }
  double train_eps() const { return train_eps_; }
  double sample_eps() const { return sample_eps_; }

  // alpha, sigma and their derivatives at float64 times t.
  PathCoefficients coefficients(const at::Tensor& t) const;
  // SiT's compute_drift at float64 times t: (c, g) with the probability-flow ODE's velocity -c x + g score.
  std::pair<at::Tensor, at::Tensor> drift_coefficients(const at::Tensor& t) const;
  // The SDE's diffusion coefficient w(t) at float64 times t.
  at::Tensor diffusion_coefficient(const at::Tensor& t, DiffusionForm form, double norm) const;

  // Where training times lie: [train_eps, 1 - train_eps] for noise and score on linear and gvp, [0, 1 - train_eps]
  // for vp, [0, 1] for velocity on linear and gvp (SiT's check_interval).
  TimeInterval training_interval() const;
  // Where sampling integrates (SiT's check_interval with eval): the ODE, or the SDE with its diffusion form and
  // the size of its last step (0: none).
  TimeInterval sampling_interval(bool sde, DiffusionForm form, double last_step_size) const;

  // The velocity and the score at (x, t) from a model output (float32 [B, C, ...]; t float64 [B]).
  at::Tensor velocity(const at::Tensor& output, const at::Tensor& x, const at::Tensor& t) const;
  at::Tensor score(const at::Tensor& output, const at::Tensor& x, const at::Tensor& t) const;

 private:
  FlowOptions options_;
  double train_eps_ = 0;
  double sample_eps_ = 0;
};

struct FlowLossTerms {
  at::Tensor loss;  // scalar: mean over the batch
  at::Tensor mse;   // [B]: each sample's weighted mean squared error
};

// x_t = alpha_t x1 + sigma_t x0 at times t (float [B] in [0, 1], given to the model as they are, in x1's dtype) with
// noise x0, one model run (its first C channels: a learned-sigma output's variance channels are ignored, as SiT's
// model drops them) and SiT's training loss: velocity |out - (d_alpha x1 + d_sigma x0)|^2, noise
// w |out - x0|^2, score w |sigma out + x0|^2, each the mean over a sample's elements, in float32 or wider.
FlowLossTerms flow_training_loss(const Flow& flow, const ModelFunction& model, const at::Tensor& x1,
                                 const at::Tensor& t, const at::Tensor& x0, const std::optional<at::Tensor>& labels);

// The training side of runner.diffusion.flow: the flow, how training times are drawn (uniform over the
// training interval, or logit-normal) and the keyed streams (shared with the objectives made from it).
struct FlowTraining {
  Flow flow;
  TimestepSampling time;
  std::shared_ptr<SampleStreams> streams;
};

// The training times of keyed samples (float64 [B]): t0 + (t1 - t0) u with u the stream's uniform draw, or with
// logit_normal t0 + (t1 - t0) (1 - sigmoid(mean + std n)): the logit-normal draw is the noise level of the
// rectified-flow convention (SD3: mean > 0 trains at more noise), turned into SiT's time.
at::Tensor flow_training_times(const FlowTraining& training, const at::Tensor& keys, at::Device device);

struct KeyedFlowLoss {
  FlowLossTerms terms;
  at::Tensor t;  // float64 [B]: the times drawn
};

// Time, noise and label dropout of each sample drawn from its key (the streams the diffusion objective draws its
// timesteps, noise and label dropout from), then flow_training_loss.
KeyedFlowLoss keyed_flow_loss(const FlowTraining& training, const ModelFunction& model, const at::Tensor& x1,
                              const TrainingLabels& labels, const at::Tensor& keys);

// flow:loss(model, batch) as a trainer objective (train:step(batch)), with the same numbers.
class FlowObjective : public KeyedObjective {
 public:
  FlowObjective(FlowTraining training, ModelFunction model, ModelLabels labels, std::optional<double> label_dropout,
                CaptureCheck capture_check = {});

  std::string describe() const override;

 protected:
  at::Tensor keyed_loss(const at::Tensor& x, const TrainingLabels& labels, const at::Tensor& keys) override;

 private:
  FlowTraining training_;
  ModelFunction model_;
};

// "flow matching (linear path, velocity prediction, uniform times": what the objective computes, without the labels.
std::string describe_flow(const FlowTraining& training);

}  // namespace runner::diffusion
