// Gaussian diffusion training: noising, targets, min-SNR weighting and the learned-variance VB term.
#include "runtime/diffusion/gaussian_diffusion.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <cmath>
#include <numbers>
#include <stdexcept>
#include <vector>

#include "runtime/core/dtype.h"
#include "runtime/core/enum_table.h"
#include "runtime/core/shape_text.h"

namespace runner::diffusion {
namespace {

// Mean over every dimension but the batch dimension.
at::Tensor mean_flat(const at::Tensor& tensor) {
  std::vector<std::int64_t> dims;
  for (std::int64_t d = 1; d < tensor.dim(); ++d) dims.push_back(d);
  return tensor.mean(dims);
}

at::Tensor approx_standard_normal_cdf(const at::Tensor& x) {
  return 0.5 * (1.0 + at::tanh(std::sqrt(2.0 / std::numbers::pi) * (x + 0.044715 * at::pow(x, 3))));
}

void check_batch(const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise) {
  if (!x0.defined() || x0.dim() < 2) {
    throw std::invalid_argument(fmt::format("x0 must have a batch and a channel dimension, got shape {}",
                                            x0.defined() ? core::shape_text(x0.sizes()) : std::string("(undefined)")));
  }
  if (!noise.defined() || noise.sizes() != x0.sizes()) {
    throw std::invalid_argument(fmt::format(
        "noise of shape {} does not match x0 of shape {}",
        noise.defined() ? core::shape_text(noise.sizes()) : std::string("(undefined)"), core::shape_text(x0.sizes())));
  }
  if (!t.defined() || t.dim() != 1 || t.scalar_type() != at::kLong || t.size(0) != x0.size(0)) {
    throw std::invalid_argument(fmt::format("timesteps must be an int64 tensor of shape [{}], got {}", x0.size(0),
                                            t.defined()
                                                ? core::dtype_name(t.scalar_type()) + " " + core::shape_text(t.sizes())
                                                : std::string("an undefined tensor")));
  }
}

}  // namespace

const core::EnumTable<Prediction, 3> kPredictions{
    {{{Prediction::eps, "eps"}, {Prediction::x0, "x0"}, {Prediction::v, "v"}}},
    core::NameQuotes::none,
    "prediction must be {list}, got '{got}'"};

Prediction parse_prediction(const std::string& name) { return kPredictions.parse(name); }

std::string prediction_name(Prediction prediction) { return kPredictions.name(prediction); }

at::Tensor q_sample(const NoiseSchedule& schedule, const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise) {
  check_batch(x0, t, noise);
  return extract(schedule.sqrt_alphas_cumprod, t, x0) * x0 +
         extract(schedule.sqrt_one_minus_alphas_cumprod, t, x0) * noise;
}

at::Tensor prediction_target(const NoiseSchedule& schedule, Prediction prediction, const at::Tensor& x0,
                             const at::Tensor& t, const at::Tensor& noise) {
  switch (prediction) {
    case Prediction::eps:
      return noise;
    case Prediction::x0:
      return x0;
    case Prediction::v:
      return extract(schedule.sqrt_alphas_cumprod, t, x0) * noise -
             extract(schedule.sqrt_one_minus_alphas_cumprod, t, x0) * x0;
  }
  throw std::invalid_argument("unknown prediction");
}

at::Tensor predict_x0(const NoiseSchedule& schedule, Prediction prediction, const at::Tensor& x_t, const at::Tensor& t,
                      const at::Tensor& model_output) {
  switch (prediction) {
    case Prediction::eps:
      return extract(schedule.sqrt_recip_alphas_cumprod, t, x_t) * x_t -
             extract(schedule.sqrt_recipm1_alphas_cumprod, t, x_t) * model_output;
    case Prediction::x0:
      return model_output;
    case Prediction::v:
      return extract(schedule.sqrt_alphas_cumprod, t, x_t) * x_t -
             extract(schedule.sqrt_one_minus_alphas_cumprod, t, x_t) * model_output;
  }
  throw std::invalid_argument("unknown prediction");
}

at::Tensor min_snr_weights(const NoiseSchedule& schedule, Prediction prediction, double gamma) {
  if (!(gamma > 0) || !std::isfinite(gamma)) {
    throw std::invalid_argument(fmt::format("min_snr_gamma must be a positive number, got {}", gamma));
  }
  const at::Tensor snr = schedule.alphas_cumprod / (1 - schedule.alphas_cumprod);
  const at::Tensor clipped = at::clamp_max(snr, gamma);
  switch (prediction) {
    case Prediction::eps:
      return clipped / snr;
    case Prediction::x0:
      return clipped;
    case Prediction::v:
      return clipped / (snr + 1);
  }
  throw std::invalid_argument("unknown prediction");
}

at::Tensor normal_kl(const at::Tensor& mean1, const at::Tensor& logvar1, const at::Tensor& mean2,
                     const at::Tensor& logvar2) {
  return 0.5 * (-1.0 + logvar2 - logvar1 + at::exp(logvar1 - logvar2) + at::pow(mean1 - mean2, 2) * at::exp(-logvar2));
}

at::Tensor discretized_gaussian_log_likelihood(const at::Tensor& x, const at::Tensor& means,
                                               const at::Tensor& log_scales) {
  const at::Tensor centered_x = x - means;
  const at::Tensor inv_stdv = at::exp(-log_scales);
  const at::Tensor cdf_plus = approx_standard_normal_cdf(inv_stdv * (centered_x + 1.0 / 255.0));
  const at::Tensor cdf_min = approx_standard_normal_cdf(inv_stdv * (centered_x - 1.0 / 255.0));
  const at::Tensor log_cdf_plus = at::log(cdf_plus.clamp_min(1e-12));
  const at::Tensor log_one_minus_cdf_min = at::log((1.0 - cdf_min).clamp_min(1e-12));
  const at::Tensor cdf_delta = cdf_plus - cdf_min;
  return at::where(x < -0.999, log_cdf_plus,
                   at::where(x > 0.999, log_one_minus_cdf_min, at::log(cdf_delta.clamp_min(1e-12))));
}

LossTerms training_loss(const NoiseSchedule& schedule, const ModelFunction& model, const at::Tensor& x0,
                        const at::Tensor& t, const at::Tensor& noise, const std::optional<at::Tensor>& labels,
                        const LossOptions& options) {
  check_batch(x0, t, noise);
  at::Tensor weights;
  if (options.min_snr_gamma) weights = min_snr_weights(schedule, options.prediction, *options.min_snr_gamma);

  const at::Tensor x_t = q_sample(schedule, x0, t, noise);
  const at::Tensor output = model(x_t, t, labels);
  const bool learned = learns_sigma(output, x0);
  const std::int64_t channels = x0.size(1);
  const auto dtype = at::promote_types(output.scalar_type(), at::kFloat);

  const at::Tensor prediction = (learned ? output.narrow(1, 0, channels) : output).to(dtype);
  const at::Tensor target = prediction_target(schedule, options.prediction, x0, t, noise).to(dtype);
  LossTerms terms;
  terms.mse = mean_flat(at::pow(target - prediction, 2));
  if (weights.defined()) terms.mse = extract(weights, t, terms.mse) * terms.mse;
  terms.loss = terms.mse.mean();
  if (!learned) return terms;

  // The variational term with the mean frozen: only the variance channels receive its gradient.
  const at::Tensor x0_c = x0.to(dtype);
  const at::Tensor x_t_c = x_t.to(dtype);
  const at::Tensor frozen = prediction.detach();
  const at::Tensor variance_values = output.narrow(1, channels, channels).to(dtype);
  const at::Tensor min_log = extract(schedule.posterior_log_variance_clipped, t, x0_c);
  const at::Tensor max_log = extract(schedule.log_betas, t, x0_c);
  const at::Tensor fraction = (variance_values + 1) / 2;
  const at::Tensor model_log_variance = fraction * max_log + (1 - fraction) * min_log;
  const at::Tensor x0_predicted = predict_x0(schedule, options.prediction, x_t_c, t, frozen);
  const at::Tensor coef1 = extract(schedule.posterior_mean_coef1, t, x0_c);
  const at::Tensor coef2 = extract(schedule.posterior_mean_coef2, t, x0_c);
  const at::Tensor model_mean = coef1 * x0_predicted + coef2 * x_t_c;
  const at::Tensor true_mean = coef1 * x0_c + coef2 * x_t_c;

  const double ln2 = std::numbers::ln2;
  const at::Tensor kl = mean_flat(normal_kl(true_mean, min_log, model_mean, model_log_variance)) / ln2;
  const at::Tensor decoder_nll =
      mean_flat(-discretized_gaussian_log_likelihood(x0_c, model_mean, 0.5 * model_log_variance)) / ln2;
  terms.vb = at::where(t.to(kl.device()) == 0, decoder_nll, kl);
  terms.loss = terms.loss + terms.vb.mean();
  return terms;
}

}  // namespace runner::diffusion
