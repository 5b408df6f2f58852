// SiT's interpolant paths, prediction targets, loss weightings, time intervals and drift terms.
#include "runtime/diffusion/flow.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <stdexcept>
#include <utility>

#include "runtime/core/enum_table.h"

namespace runner::diffusion {
namespace {

constexpr double kVpSigmaMin = 0.1;  // SiT's VPCPlan defaults
constexpr double kVpSigmaMax = 20.0;

// VP's log mean coefficient m(t) and its derivative.
at::Tensor vp_log_mean(const at::Tensor& t) {
  const at::Tensor s = 1 - t;
  return -0.25 * s * s * (kVpSigmaMax - kVpSigmaMin) - 0.5 * s * kVpSigmaMin;
}
at::Tensor vp_d_log_mean(const at::Tensor& t) {
  return 0.5 * (1 - t) * (kVpSigmaMax - kVpSigmaMin) + 0.5 * kVpSigmaMin;
}

at::Tensor as_double(const at::Tensor& t) { return t.to(at::kDouble); }

}  // namespace

at::Tensor per_sample(const at::Tensor& coefficient, const at::Tensor& x) {
  std::vector<std::int64_t> shape(static_cast<std::size_t>(x.dim()), 1);
  shape[0] = coefficient.size(0);
  return coefficient.to(x.scalar_type()).reshape(shape);
}

const core::EnumTable<InterpolantPath, 3> kInterpolantPaths{
    {{{InterpolantPath::linear, "linear"}, {InterpolantPath::gvp, "gvp"}, {InterpolantPath::vp, "vp"}}},
    core::NameQuotes::double_,
    "path must be {list}, got \"{got}\""};

const core::EnumTable<FlowPrediction, 3> kFlowPredictions{
    {{{FlowPrediction::velocity, "velocity"}, {FlowPrediction::noise, "noise"}, {FlowPrediction::score, "score"}}},
    core::NameQuotes::double_,
    "prediction must be {list}, got \"{got}\""};

const core::EnumTable<FlowLossWeight, 3> kFlowLossWeights{{{{FlowLossWeight::none, "none"},
                                                            {FlowLossWeight::velocity, "velocity"},
                                                            {FlowLossWeight::likelihood, "likelihood"}}},
                                                          core::NameQuotes::double_,
                                                          "loss_weight must be {list}, got \"{got}\""};

const core::EnumTable<DiffusionForm, 6> kDiffusionForms{
    {{{DiffusionForm::sigma, "sigma"},
      {DiffusionForm::sbdm, "sbdm"},
      {DiffusionForm::constant, "constant"},
      {DiffusionForm::linear, "linear"},
      {DiffusionForm::decreasing, "decreasing"},
      {DiffusionForm::increasing_decreasing, "increasing-decreasing"}}},
    core::NameQuotes::double_,
    "diffusion_form must be {list}, got \"{got}\""};

InterpolantPath parse_interpolant_path(const std::string& name) { return kInterpolantPaths.parse(name); }

FlowPrediction parse_flow_prediction(const std::string& name) { return kFlowPredictions.parse(name); }

FlowLossWeight parse_flow_loss_weight(const std::string& name) { return kFlowLossWeights.parse(name); }

DiffusionForm parse_diffusion_form(const std::string& name) { return kDiffusionForms.parse(name); }

std::string interpolant_path_name(InterpolantPath path) { return kInterpolantPaths.name(path); }

std::string flow_prediction_name(FlowPrediction prediction) { return kFlowPredictions.name(prediction); }

std::string flow_loss_weight_name(FlowLossWeight weight) { return kFlowLossWeights.name(weight); }

std::string diffusion_form_name(DiffusionForm form) { return kDiffusionForms.name(form); }

Flow::Flow(FlowOptions options) : options_(std::move(options)) {
  const bool velocity = options_.prediction == FlowPrediction::velocity;
  if (velocity && options_.loss_weight != FlowLossWeight::none) {
    throw std::invalid_argument(fmt::format(
        "loss_weight \"{}\" applies to noise and score predictions; the velocity loss is unweighted (as SiT's)",
        flow_loss_weight_name(options_.loss_weight)));
  }
  double train_default = 0;
  double sample_default = 0;
  if (options_.path == InterpolantPath::vp) {
    train_default = 1e-5;
    sample_default = 1e-3;
  } else if (!velocity) {
    train_default = 1e-3;
    sample_default = 1e-3;
  }
  train_eps_ = options_.train_eps.value_or(train_default);
  sample_eps_ = options_.sample_eps.value_or(sample_default);
  for (const auto& [name, value] : {std::pair{"train_eps", train_eps_}, std::pair{"sample_eps", sample_eps_}}) {
    if (!(value >= 0 && value < 0.5))
      throw std::invalid_argument(fmt::format("{} must be in [0, 0.5), got {}", name, value));
  }
}

PathCoefficients Flow::coefficients(const at::Tensor& time) const {
  const at::Tensor t = as_double(time);
  PathCoefficients c;
  switch (options_.path) {
    case InterpolantPath::linear:
      c.alpha = t;
      c.d_alpha = at::ones_like(t);
      c.sigma = 1 - t;
      c.d_sigma = -at::ones_like(t);
      break;
    case InterpolantPath::gvp:
      c.alpha = at::sin(t * (M_PI / 2));
      c.d_alpha = (M_PI / 2) * at::cos(t * (M_PI / 2));
      c.sigma = at::cos(t * (M_PI / 2));
      c.d_sigma = -(M_PI / 2) * at::sin(t * (M_PI / 2));
      break;
    case InterpolantPath::vp: {
      const at::Tensor m = vp_log_mean(t);
      const at::Tensor dm = vp_d_log_mean(t);
      c.alpha = at::exp(m);
      c.d_alpha = c.alpha * dm;
      c.sigma = at::sqrt(1 - at::exp(2 * m));
      c.d_sigma = at::exp(2 * m) * (2 * dm) / (-2 * c.sigma);
      break;
    }
  }
  return c;
}

std::pair<at::Tensor, at::Tensor> Flow::drift_coefficients(const at::Tensor& time) const {
  const at::Tensor t = as_double(time);
  if (options_.path == InterpolantPath::vp) {
    const at::Tensor beta = kVpSigmaMin + (1 - t) * (kVpSigmaMax - kVpSigmaMin);
    return {-0.5 * beta, beta / 2};
  }
  // d_alpha / alpha, written as SiT writes it for stability.
  const at::Tensor ratio = options_.path == InterpolantPath::linear ? 1 / t : M_PI / (2 * at::tan(t * (M_PI / 2)));
  const PathCoefficients c = coefficients(t);
  return {-ratio, ratio * c.sigma * c.sigma - c.sigma * c.d_sigma};
}

at::Tensor Flow::diffusion_coefficient(const at::Tensor& time, DiffusionForm form, double norm) const {
  const at::Tensor t = as_double(time);
  switch (form) {
    case DiffusionForm::constant:
      return at::full_like(t, norm);
    case DiffusionForm::sbdm:
      return norm * drift_coefficients(t).second;
    case DiffusionForm::sigma:
      return norm * coefficients(t).sigma;
    case DiffusionForm::linear:
      return norm * (1 - t);
    case DiffusionForm::decreasing: {
      const at::Tensor base = norm * at::cos(M_PI * t) + 1;
      return 0.25 * base * base;
    }
    case DiffusionForm::increasing_decreasing: {
      const at::Tensor s = at::sin(M_PI * t);
      return norm * s * s;
    }
  }
  throw std::logic_error("unknown diffusion form");
}

TimeInterval Flow::training_interval() const {
  if (options_.path == InterpolantPath::vp) return {0, 1 - train_eps_};
  if (options_.prediction != FlowPrediction::velocity) return {train_eps_, 1 - train_eps_};
  return {0, 1};
}

TimeInterval Flow::sampling_interval(bool sde, DiffusionForm form, double last_step_size) const {
  const double eps = sample_eps_;
  const double end = !sde || last_step_size == 0 ? 1 - eps : 1 - last_step_size;
  if (options_.path == InterpolantPath::vp) return {0, end};
  const bool velocity = options_.prediction == FlowPrediction::velocity;
  if (!velocity || sde) return {(form == DiffusionForm::sbdm && sde) || !velocity ? eps : 0.0, end};
  return {0, 1};
}

at::Tensor Flow::score(const at::Tensor& output, const at::Tensor& x, const at::Tensor& t) const {
  switch (options_.prediction) {
    case FlowPrediction::score:
      return output;
    case FlowPrediction::noise:
      return output / -per_sample(coefficients(t).sigma, x);
    case FlowPrediction::velocity: {
      const PathCoefficients c = coefficients(t);
      const at::Tensor reverse_ratio = c.alpha / c.d_alpha;
      const at::Tensor variance = c.sigma * c.sigma - reverse_ratio * c.d_sigma * c.sigma;
      return (per_sample(reverse_ratio, x) * output - x) / per_sample(variance, x);
    }
  }
  throw std::logic_error("unknown prediction");
}

at::Tensor Flow::velocity(const at::Tensor& output, const at::Tensor& x, const at::Tensor& t) const {
  if (options_.prediction == FlowPrediction::velocity) return output;
  const auto [drift_mean, drift_var] = drift_coefficients(t);
  return -per_sample(drift_mean, x) * x + per_sample(drift_var, x) * score(output, x, t);
}

FlowLossTerms flow_training_loss(const Flow& flow, const ModelFunction& model, const at::Tensor& x1,
                                 const at::Tensor& t, const at::Tensor& x0, const std::optional<at::Tensor>& labels) {
  if (x1.dim() < 2)
    throw std::invalid_argument(fmt::format("loss: x1 must be a batch [B, C, ...], got {} dimensions", x1.dim()));
  if (t.dim() != 1 || t.size(0) != x1.size(0) || !at::isFloatingType(t.scalar_type()))
    throw std::invalid_argument(
        fmt::format("loss: t must be a floating-point tensor of {} times in [0, 1], got shape {}", x1.size(0),
                    fmt::join(t.sizes(), ", ")));
  if (x0.sizes() != x1.sizes())
    throw std::invalid_argument(fmt::format("loss: the noise must have the shape of x1 [{}], got [{}]",
                                            fmt::join(x1.sizes(), ", "), fmt::join(x0.sizes(), ", ")));
  const at::Tensor time = t.to(x1.options());
  const PathCoefficients c = flow.coefficients(time);
  const at::Tensor x_t = per_sample(c.alpha, x1) * x1 + per_sample(c.sigma, x1) * x0;
  const at::Tensor output = model(x_t, time, labels);
  const bool learned = learns_sigma(output, x_t);
  const at::ScalarType dtype = at::promote_types(output.scalar_type(), at::kFloat);
  const at::Tensor out = (learned ? output.narrow(1, 0, x1.size(1)) : output).to(dtype);
  const at::Tensor data = x1.to(dtype);
  const at::Tensor noise = x0.to(dtype);
  const FlowOptions& options = flow.options();
  at::Tensor squared;
  if (options.prediction == FlowPrediction::velocity) {
    const at::Tensor target = per_sample(c.d_alpha, out) * data + per_sample(c.d_sigma, out) * noise;
    squared = (out - target).square();
  } else {
    const at::Tensor drift_var = flow.drift_coefficients(time).second;
    at::Tensor weight;
    switch (options.loss_weight) {
      case FlowLossWeight::none:
        break;
      case FlowLossWeight::velocity:
        weight = (drift_var / c.sigma).square();
        break;
      case FlowLossWeight::likelihood:
        weight = drift_var / c.sigma.square();
        break;
    }
    squared = options.prediction == FlowPrediction::noise ? (out - noise).square()
                                                          : (out * per_sample(c.sigma, out) + noise).square();
    if (weight.defined()) squared = per_sample(weight, out) * squared;
  }
  FlowLossTerms terms;
  terms.mse = squared.flatten(1).mean(1);
  terms.loss = terms.mse.mean();
  return terms;
}

at::Tensor flow_training_times(const FlowTraining& training, const at::Tensor& keys, at::Device device) {
  const TimeInterval interval = training.flow.training_interval();
  at::Tensor u = training.streams->unit_times(keys, device, training.time);
  if (training.time.kind == TimestepSampling::Kind::logit_normal) u = 1 - u;
  return u.mul_(interval.t1 - interval.t0).add_(interval.t0);
}

KeyedFlowLoss keyed_flow_loss(const FlowTraining& training, const ModelFunction& model, const at::Tensor& x1,
                              const TrainingLabels& labels, const at::Tensor& keys) {
  KeyedFlowLoss out;
  out.t = flow_training_times(training, keys, x1.device());
  const at::Tensor noise = training.streams->noise(keys, x1.sizes().slice(1), x1.options());
  out.terms =
      flow_training_loss(training.flow, model, x1, out.t, noise, dropped_labels(*training.streams, labels, keys));
  return out;
}

FlowObjective::FlowObjective(FlowTraining training, ModelFunction model, ModelLabels labels,
                             std::optional<double> label_dropout, CaptureCheck capture_check)
    : KeyedObjective(training.streams, labels, label_dropout, std::move(capture_check)),
      training_(std::move(training)),
      model_(std::move(model)) {}

at::Tensor FlowObjective::keyed_loss(const at::Tensor& x, const TrainingLabels& labels, const at::Tensor& keys) {
  return keyed_flow_loss(training_, model_, x, labels, keys).terms.loss;
}

std::string describe_flow(const FlowTraining& training) {
  const FlowOptions& o = training.flow.options();
  std::string text = fmt::format("flow matching ({} path, {} prediction", interpolant_path_name(o.path),
                                 flow_prediction_name(o.prediction));
  if (o.loss_weight != FlowLossWeight::none)
    text += fmt::format(", {} weighting", flow_loss_weight_name(o.loss_weight));
  return text + fmt::format(", {} times", timestep_sampling_name(training.time.kind));
}

std::string FlowObjective::describe() const { return describe_flow(training_) + labels_description() + ")"; }

}  // namespace runner::diffusion
