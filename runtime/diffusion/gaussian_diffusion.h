// Gaussian diffusion training: noising, prediction targets, min-SNR weighted MSE, learned-variance VB term.
#pragma once

#include <ATen/core/Tensor.h>

#include <optional>
#include <string>

#include "runtime/diffusion/model_function.h"
#include "runtime/diffusion/noise_schedule.h"

namespace runner::diffusion {

// What the first C output channels of the model predict.
enum class Prediction { eps, x0, v };

// "eps", "x0" or "v"; throws std::invalid_argument for anything else.
Prediction parse_prediction(const std::string& name);
std::string prediction_name(Prediction prediction);

// x_t = sqrt(abar_t) x0 + sqrt(1 - abar_t) noise.
at::Tensor q_sample(const NoiseSchedule& schedule, const at::Tensor& x0, const at::Tensor& t, const at::Tensor& noise);

// The regression target of a prediction kind; v = sqrt(abar_t) noise - sqrt(1 - abar_t) x0.
at::Tensor prediction_target(const NoiseSchedule& schedule, Prediction prediction, const at::Tensor& x0,
                             const at::Tensor& t, const at::Tensor& noise);

// x0 recovered from x_t and the model's prediction (unclipped).
at::Tensor predict_x0(const NoiseSchedule& schedule, Prediction prediction, const at::Tensor& x_t, const at::Tensor& t,
                      const at::Tensor& model_output);

// Per-timestep min-SNR-gamma weights (float64 [T]); with snr = abar / (1 - abar): eps min(snr, g) / snr,
// x0 min(snr, g), v min(snr, g) / (snr + 1).
at::Tensor min_snr_weights(const NoiseSchedule& schedule, Prediction prediction, double gamma);

struct LossOptions {
  Prediction prediction = Prediction::eps;
  std::optional<double> min_snr_gamma;  // unset: every timestep weighs 1
};

struct LossTerms {
  at::Tensor loss;  // scalar: mean(mse) + mean(vb) (vb only with learned sigma)
  at::Tensor mse;   // [B], per-sample mean squared error times its min-SNR weight
  at::Tensor vb;    // [B], the variational term in bits per dimension; undefined without learned sigma
};

// Noises x0 to timesteps t (int64 [B]) with the given noise, runs the model once and compares. The loss
// is computed in the model output's dtype (at least float32); schedule values are gathered in float64 and
// converted to float32. With learned sigma the VB term sees the mean channels detached, so it trains
// only the variance.
LossTerms training_loss(const NoiseSchedule& schedule, const ModelFunction& model, const at::Tensor& x0,
                        const at::Tensor& t, const at::Tensor& noise, const std::optional<at::Tensor>& labels,
                        const LossOptions& options);

// KL(N(mean1, exp(logvar1)) || N(mean2, exp(logvar2))), elementwise, in nats.
at::Tensor normal_kl(const at::Tensor& mean1, const at::Tensor& logvar1, const at::Tensor& mean2,
                     const at::Tensor& logvar2);

// Log-likelihood (nats) of data x in [-1, 1] quantized to 256 levels under N(means, exp(log_scales)^2):
// bins of width 2/255, the outer bins extended to infinity, the normal CDF by the tanh approximation.
at::Tensor discretized_gaussian_log_likelihood(const at::Tensor& x, const at::Tensor& means,
                                               const at::Tensor& log_scales);

}  // namespace runner::diffusion
