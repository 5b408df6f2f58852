// Tests of runtime/diffusion: noise schedules, training targets and losses, samplers.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <ATen/core/grad_mode.h>

#include <cmath>
#include <limits>
#include <numbers>
#include <vector>

#include "runtime/core/device.h"
#include "runtime/core/interrupt.h"
#include "runtime/diffusion/gaussian_diffusion.h"
#include "runtime/diffusion/noise_schedule.h"
#include "runtime/diffusion/gaussian_sampler.h"

using namespace runner::diffusion;

namespace {

double at_index(const at::Tensor& values, std::int64_t i) { return values[i].item<double>(); }

double max_abs_difference(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

// The largest difference relative to the largest magnitude of b.
double max_relative_difference(const at::Tensor& a, const at::Tensor& b) {
  return max_abs_difference(a, b) / b.to(at::kDouble).abs().max().item<double>();
}

// Per-sample schedule values as float32 [B, 1, 1, 1], computed independently of extract.
at::Tensor per_sample(const std::vector<double>& values) {
  return at::tensor(values, at::kDouble).to(at::kFloat).view({static_cast<std::int64_t>(values.size()), 1, 1, 1});
}

// The exact denoiser for a data distribution that is the single point x_star (per sample): given x_t it
// returns what the prediction kind asks for.
ModelFunction oracle(const NoiseSchedule& schedule, const at::Tensor& x_star, Prediction prediction) {
  return [&schedule, x_star, prediction](const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>&) {
    const at::Tensor abar = schedule.alphas_cumprod.index_select(0, t.cpu()).view({x.size(0), 1, 1, 1});
    const at::Tensor x64 = x.to(at::kDouble);
    const at::Tensor star = x_star.to(at::kDouble);
    const at::Tensor eps = (x64 - abar.sqrt() * star) / (1 - abar).sqrt();
    switch (prediction) {
      case Prediction::eps:
        return eps.to(at::kFloat);
      case Prediction::x0:
        return star.to(at::kFloat);
      case Prediction::v:
        return (abar.sqrt() * eps - (1 - abar).sqrt() * star).to(at::kFloat);
    }
    return at::Tensor();
  };
}

ModelFunction zero_eps() {
  return [](const at::Tensor& x, const at::Tensor&, const std::optional<at::Tensor>&) { return at::zeros_like(x); };
}

// A class-conditional toy model whose output depends on x, t and the labels; 2C channels with learned sigma.
at::Tensor toy_conditional(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels,
                           bool learned_sigma) {
  const auto shape = std::vector<std::int64_t>{x.size(0), 1, 1, 1};
  const at::Tensor y = labels->to(at::kFloat).view(shape);
  const at::Tensor mean = 0.1 * x + 0.05 * y + 1e-4 * t.to(at::kFloat).view(shape);
  if (!learned_sigma) return mean;
  return at::cat({mean, at::tanh(0.3 * x - 0.02 * y)}, 1);
}

}  // namespace

TEST_CASE("linear schedule: DDPM endpoints at T = 1000, guided-diffusion scaling elsewhere", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  REQUIRE(s.timesteps() == 1000);
  CHECK(s.betas.scalar_type() == at::kDouble);
  CHECK(s.betas.is_cpu());
  CHECK(at_index(s.betas, 0) == Approx(1e-4).epsilon(1e-12));
  CHECK(at_index(s.betas, 999) == Approx(0.02).epsilon(1e-12));
  CHECK(at_index(s.betas, 1) - at_index(s.betas, 0) == Approx((0.02 - 1e-4) / 999).epsilon(1e-9));

  const NoiseSchedule half = make_schedule({.kind = "linear", .timesteps = 500});
  CHECK(at_index(half.betas, 0) == Approx(2e-4).epsilon(1e-12));
  CHECK(at_index(half.betas, 499) == Approx(0.04).epsilon(1e-12));

  const NoiseSchedule custom =
      make_schedule({.kind = "linear", .timesteps = 1000, .beta_start = 1e-3, .beta_end = 0.01});
  CHECK(at_index(custom.betas, 0) == Approx(1e-3).epsilon(1e-12));
  CHECK(at_index(custom.betas, 999) == Approx(0.01).epsilon(1e-12));

  // The derived tables follow their closed forms.
  double abar = 1;
  for (std::int64_t i = 0; i < 1000; ++i) {
    const double beta = at_index(s.betas, i);
    const double abar_prev = abar;
    abar *= 1 - beta;
    if (i % 97 != 3) continue;
    CHECK(at_index(s.alphas_cumprod, i) == Approx(abar).epsilon(1e-12));
    CHECK(at_index(s.alphas_cumprod_prev, i) == Approx(abar_prev).epsilon(1e-12));
    const double variance = beta * (1 - abar_prev) / (1 - abar);
    CHECK(at_index(s.posterior_variance, i) == Approx(variance).epsilon(1e-12));
    CHECK(at_index(s.posterior_log_variance_clipped, i) == Approx(std::log(variance)).epsilon(1e-12));
    CHECK(at_index(s.posterior_mean_coef1, i) == Approx(beta * std::sqrt(abar_prev) / (1 - abar)).epsilon(1e-12));
    CHECK(at_index(s.posterior_mean_coef2, i) ==
          Approx((1 - abar_prev) * std::sqrt(1 - beta) / (1 - abar)).epsilon(1e-12));
    CHECK(at_index(s.sqrt_recipm1_alphas_cumprod, i) == Approx(std::sqrt(1 / abar - 1)).epsilon(1e-12));
  }
  CHECK(at_index(s.alphas_cumprod_prev, 0) == 1.0);
  CHECK(at_index(s.posterior_variance, 0) == 0.0);
  CHECK(at_index(s.posterior_log_variance_clipped, 0) == at_index(s.posterior_log_variance_clipped, 1));
}

TEST_CASE("cosine schedule: betas capped at 0.999, alphas_cumprod decreasing", "[diffusion]") {
  const NoiseSchedule s = make_schedule({.kind = "cosine", .timesteps = 1000});
  const auto abar = [](double u) {
    const double c = std::cos((u + 0.008) / 1.008 * std::numbers::pi / 2);
    return c * c;
  };
  CHECK(at_index(s.betas, 0) == Approx(1 - abar(1e-3) / abar(0)).epsilon(1e-12));
  CHECK(at_index(s.betas, 500) == Approx(1 - abar(0.501) / abar(0.5)).epsilon(1e-12));
  CHECK(s.betas.max().item<double>() == 0.999);
  CHECK(at_index(s.betas, 999) == 0.999);
  CHECK(s.betas.min().item<double>() > 0);
  const at::Tensor& a = s.alphas_cumprod;
  CHECK((a.narrow(0, 1, 999) < a.narrow(0, 0, 999)).all().item<bool>());
}

TEST_CASE("scaled_linear schedule: ends 0.00085 and 0.012, linear in sqrt(beta)", "[diffusion]") {
  const NoiseSchedule s = make_schedule({.kind = "scaled_linear", .timesteps = 1000});
  CHECK(at_index(s.betas, 0) == Approx(0.00085).epsilon(1e-12));
  CHECK(at_index(s.betas, 999) == Approx(0.012).epsilon(1e-12));
  const double root_step = (std::sqrt(0.012) - std::sqrt(0.00085)) / 999;
  CHECK(std::sqrt(at_index(s.betas, 400)) == Approx(std::sqrt(0.00085) + 400 * root_step).epsilon(1e-12));
  const NoiseSchedule custom =
      make_schedule({.kind = "scaled_linear", .timesteps = 100, .beta_start = 1e-4, .beta_end = 0.02});
  CHECK(at_index(custom.betas, 0) == Approx(1e-4).epsilon(1e-12));
  CHECK(at_index(custom.betas, 99) == Approx(0.02).epsilon(1e-12));
}

TEST_CASE("schedule options are checked", "[diffusion]") {
  REQUIRE_THROWS_WITH(make_schedule({.kind = "foo"}), "schedule must be linear, cosine or scaled_linear, got 'foo'");
  REQUIRE_THROWS_WITH(make_schedule({.kind = "linear", .timesteps = 1}), "timesteps must be at least 2, got 1");
  REQUIRE_THROWS_WITH(make_schedule({.kind = "linear", .timesteps = std::int64_t{1} << 31}),
                      "timesteps must be at most 1000000, got 2147483648");
  REQUIRE_THROWS_WITH(make_schedule({.kind = "linear", .timesteps = 1000, .beta_start = -1.0}),
                      "beta_start must be a positive number, got -1");
  REQUIRE_THROWS_WITH(make_schedule({.kind = "scaled_linear", .timesteps = 1000, .beta_end = 0.0}),
                      "beta_end must be a positive number, got 0");
  REQUIRE_THROWS_WITH(make_schedule({.kind = "cosine", .timesteps = 1000, .beta_end = 0.02}),
                      "beta_start and beta_end apply to the linear and scaled_linear schedules, not cosine");
  REQUIRE_THROWS_WITH(make_schedule({.kind = "linear", .timesteps = 10}),
                      "linear schedule over 10 timesteps gives betas outside (0, 1): the largest is 2 "
                      "(linear betas are scaled by 1000 / timesteps)");
}

TEST_CASE("extract gathers float64 values as float32 shaped to broadcast", "[diffusion]") {
  const at::Tensor values = at::arange(5, at::kDouble) / 3;
  const at::Tensor like = at::zeros({3, 2, 4, 4});
  const at::Tensor out = extract(values, at::tensor({4, 0, 2}, at::kLong), like);
  CHECK(out.sizes() == at::IntArrayRef({3, 1, 1, 1}));
  CHECK(out.scalar_type() == at::kFloat);
  CHECK(out[0].item<float>() == static_cast<float>(4.0 / 3));
  CHECK(out[2].item<float>() == static_cast<float>(2.0 / 3));
  REQUIRE_THROWS_WITH(extract(values, at::tensor({1.0f, 2.0f, 3.0f}), like),
                      "timesteps must be an int64 tensor of shape [B], got float32 [3]");
  REQUIRE_THROWS_WITH(extract(values, at::tensor({1, 5, 0}, at::kLong), like), "timesteps must lie in 0..4, got 5");
  REQUIRE_THROWS_WITH(extract(values, at::tensor({1, 2}, at::kLong), like),
                      "2 timesteps for a batch of shape [3, 2, 4, 4]");
}

TEST_CASE("q_sample, the v target and x0 recovery satisfy their identities", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  at::manual_seed(1);
  const at::Tensor x0 = at::rand({4, 3, 8, 8}) * 2 - 1;
  const at::Tensor noise = at::randn({4, 3, 8, 8});
  const std::vector<std::int64_t> steps{0, 10, 500, 999};
  const at::Tensor t = at::tensor(steps, at::kLong);
  std::vector<double> root_abar, root_one_minus;
  for (std::int64_t step : steps) {
    root_abar.push_back(std::sqrt(at_index(s.alphas_cumprod, step)));
    root_one_minus.push_back(std::sqrt(1 - at_index(s.alphas_cumprod, step)));
  }
  const at::Tensor a = per_sample(root_abar), b = per_sample(root_one_minus);

  const at::Tensor x_t = q_sample(s, x0, t, noise);
  CHECK(at::equal(x_t, a * x0 + b * noise));

  const at::Tensor v = prediction_target(s, Prediction::v, x0, t, noise);
  CHECK(max_abs_difference(v, a * noise - b * x0) < 1e-7);
  // v rotates (x0, eps) by the same angle as x_t: x0 = a x_t - b v, eps = b x_t + a v.
  CHECK(max_abs_difference(a * x_t - b * v, x0) < 1e-5);
  CHECK(max_abs_difference(b * x_t + a * v, noise) < 1e-5);
  CHECK(at::equal(prediction_target(s, Prediction::eps, x0, t, noise), noise));
  CHECK(at::equal(prediction_target(s, Prediction::x0, x0, t, noise), x0));

  // x0 from an eps prediction loses precision as 1 / sqrt(abar) grows; 160 at t = 999.
  CHECK(max_abs_difference(predict_x0(s, Prediction::eps, x_t, t, noise), x0) < 1e-4);
  CHECK(max_abs_difference(predict_x0(s, Prediction::v, x_t, t, v), x0) < 1e-5);
  CHECK(at::equal(predict_x0(s, Prediction::x0, x_t, t, x0), x0));

  REQUIRE_THROWS_WITH(q_sample(s, x0, t, noise.narrow(0, 0, 2)),
                      "noise of shape [2, 3, 8, 8] does not match x0 of shape [4, 3, 8, 8]");
  REQUIRE_THROWS_WITH(q_sample(s, x0, t.narrow(0, 0, 3), noise),
                      "timesteps must be an int64 tensor of shape [4], got int64 [3]");
  REQUIRE(parse_prediction("v") == Prediction::v);
  REQUIRE_THROWS_WITH(parse_prediction("score"), "prediction must be eps, x0 or v, got 'score'");
}

TEST_CASE("training loss: a model that returns the target has zero loss for every prediction", "[diffusion]") {
  const NoiseSchedule s = make_schedule({.kind = "cosine", .timesteps = 1000});
  at::manual_seed(2);
  const at::Tensor x0 = at::rand({3, 2, 4, 4}) * 2 - 1;
  const at::Tensor noise = at::randn({3, 2, 4, 4});
  const at::Tensor t = at::tensor({7, 300, 998}, at::kLong);
  for (Prediction prediction : {Prediction::eps, Prediction::x0, Prediction::v}) {
    INFO(prediction_name(prediction));
    int calls = 0;
    const ModelFunction model = [&](const at::Tensor& x, const at::Tensor& steps,
                                    const std::optional<at::Tensor>& labels) {
      ++calls;
      CHECK(at::equal(x, q_sample(s, x0, t, noise)));
      CHECK(at::equal(steps, t));
      CHECK(labels->item<std::int64_t>() == 4);
      return prediction_target(s, prediction, x0, t, noise).clone();
    };
    const LossTerms terms =
        training_loss(s, model, x0, t, noise, at::tensor({4}, at::kLong), {.prediction = prediction});
    CHECK(calls == 1);
    CHECK(terms.mse.sizes() == at::IntArrayRef({3}));
    CHECK(terms.loss.dim() == 0);
    CHECK(terms.loss.item<double>() == 0.0);
    CHECK_FALSE(terms.vb.defined());
  }
}

TEST_CASE("min-SNR-gamma weights follow the closed forms", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  for (std::int64_t step : {0, 100, 400, 999}) {
    const double abar = at_index(s.alphas_cumprod, step);
    const double snr = abar / (1 - abar);
    const double clipped = std::min(snr, 5.0);
    CHECK(at_index(min_snr_weights(s, Prediction::eps, 5), step) == Approx(clipped / snr).epsilon(1e-12));
    CHECK(at_index(min_snr_weights(s, Prediction::x0, 5), step) == Approx(clipped).epsilon(1e-12));
    CHECK(at_index(min_snr_weights(s, Prediction::v, 5), step) == Approx(clipped / (snr + 1)).epsilon(1e-12));
  }

  at::manual_seed(3);
  const at::Tensor x0 = at::rand({4, 3, 4, 4}) * 2 - 1;
  const at::Tensor noise = at::randn({4, 3, 4, 4});
  const at::Tensor t = at::tensor({0, 100, 400, 999}, at::kLong);
  const std::vector<std::int64_t> dims{1, 2, 3};
  for (Prediction prediction : {Prediction::eps, Prediction::x0, Prediction::v}) {
    INFO(prediction_name(prediction));
    const LossTerms plain = training_loss(s, zero_eps(), x0, t, noise, std::nullopt, {.prediction = prediction});
    const at::Tensor target = prediction_target(s, prediction, x0, t, noise);
    CHECK(max_abs_difference(plain.mse, target.pow(2).mean(dims)) < 1e-6);
    const LossTerms weighted =
        training_loss(s, zero_eps(), x0, t, noise, std::nullopt, {.prediction = prediction, .min_snr_gamma = 5.0});
    const at::Tensor w = min_snr_weights(s, prediction, 5).index_select(0, t).to(at::kFloat);
    CHECK(max_abs_difference(weighted.mse, w * plain.mse) < 1e-6);
    CHECK(weighted.loss.item<double>() == Approx(weighted.mse.mean().item<double>()).epsilon(1e-6));
  }
  REQUIRE_THROWS_WITH(training_loss(s, zero_eps(), x0, t, noise, std::nullopt, {.min_snr_gamma = 0.0}),
                      "min_snr_gamma must be a positive number, got 0");
}

TEST_CASE("learned sigma: the VB term is a KL in bits for t > 0, the decoder NLL at t = 0, mean frozen",
          "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  at::manual_seed(4);
  const at::Tensor x0 = at::rand({4, 3, 4, 4}) * 1.6 - 0.8;
  const at::Tensor noise = at::randn({4, 3, 4, 4});
  const at::Tensor t = at::tensor({0, 1, 100, 999}, at::kLong);
  const double ln2 = std::numbers::ln2;

  // Exact eps scaled by (1 + a), variance channels b everywhere; a and b are trained.
  const auto run = [&](double a_value, double b_value) {
    at::Tensor a = at::scalar_tensor(a_value, at::kFloat).requires_grad_(true);
    at::Tensor b = at::scalar_tensor(b_value, at::kFloat).requires_grad_(true);
    const ModelFunction model = [&](const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&) {
      return at::cat({noise * (1 + a), at::zeros_like(noise) + b}, 1);
    };
    LossTerms terms = training_loss(s, model, x0, t, noise, std::nullopt, {});
    return std::make_tuple(terms, a, b);
  };

  {  // v = -1: the model's variance is the posterior's, so the KL of t > 0 vanishes.
    auto [terms, a, b] = run(0.0, -1.0);
    REQUIRE(terms.vb.defined());
    CHECK(terms.vb.sizes() == at::IntArrayRef({4}));
    CHECK(std::abs(terms.vb[1].item<double>()) < 1e-5);
    CHECK(std::abs(terms.vb[2].item<double>()) < 1e-5);
    CHECK(std::abs(terms.vb[3].item<double>()) < 1e-5);
    // t = 0: -log P(x0 in its bin) under N(x0, posterior_variance[1]) with the tanh CDF, in bits.
    const double sigma = std::sqrt(at_index(s.posterior_variance, 1));
    const auto cdf = [](double z) {
      return 0.5 * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (z + 0.044715 * z * z * z)));
    };
    const double expected = -std::log(cdf(1.0 / 255 / sigma) - cdf(-1.0 / 255 / sigma)) / ln2;
    CHECK(terms.vb[0].item<double>() == Approx(expected).epsilon(1e-4));
    CHECK(terms.loss.item<double>() ==
          Approx(terms.mse.mean().item<double>() + terms.vb.mean().item<double>()).epsilon(1e-6));
  }
  {  // v = +1: variance beta against the posterior's, same means.
    auto [terms, a, b] = run(0.0, 1.0);
    const double beta = at_index(s.betas, 100), variance = at_index(s.posterior_variance, 100);
    const double kl = 0.5 * (-1 + std::log(beta) - std::log(variance) + variance / beta) / ln2;
    CHECK(terms.vb[2].item<double>() == Approx(kl).epsilon(1e-4));
  }
  {  // eps off by 10%: the means differ by coef1 * sqrt(1 / abar - 1) * 0.1 * eps.
    auto [terms, a, b] = run(0.1, -1.0);
    const std::int64_t step = 100;
    const double abar = at_index(s.alphas_cumprod, step), variance = at_index(s.posterior_variance, step);
    const double shift = at_index(s.posterior_mean_coef1, step) * std::sqrt(1 / abar - 1) * 0.1;
    const double kl = 0.5 * shift * shift * noise[2].pow(2).mean().item<double>() / variance / ln2;
    CHECK(terms.vb[2].item<double>() == Approx(kl).epsilon(1e-3));
  }
  {  // The VB term reaches only the variance channels.
    auto [terms, a, b] = run(0.5, 0.3);
    terms.vb.sum().backward();
    // cat's backward hands the mean channels a zero gradient.
    CHECK((!a.grad().defined() || a.grad().item<double>() == 0.0));
    REQUIRE(b.grad().defined());
    CHECK(b.grad().item<double>() != 0.0);
    auto [again, a2, b2] = run(0.5, 0.3);
    again.loss.backward();
    CHECK(a2.grad().item<double>() != 0.0);
  }
}

TEST_CASE("model outputs must have C or 2C channels of the input's shape", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  const at::Tensor x0 = at::zeros({2, 3, 4, 4});
  const ModelFunction five = [](const at::Tensor& x, const at::Tensor&, const std::optional<at::Tensor>&) {
    return at::zeros({x.size(0), 5, 4, 4});
  };
  const char* message =
      "model output of shape [2, 5, 4, 4] does not fit input of shape [2, 3, 4, 4]: expected the same shape with 3 "
      "or 6 channels";
  REQUIRE_THROWS_WITH(training_loss(s, five, x0, at::tensor({1, 2}, at::kLong), x0, std::nullopt, {}), message);
  REQUIRE_THROWS_WITH(sample(s, five, x0, std::nullopt, {.steps = 2}), message);
  CHECK_FALSE(learns_sigma(at::zeros({2, 3, 4, 4}), x0));
  CHECK(learns_sigma(at::zeros({2, 6, 4, 4}), x0));
  REQUIRE_THROWS_WITH(learns_sigma(at::zeros({2, 6, 4, 5}), x0),
                      "model output of shape [2, 6, 4, 5] does not fit input of shape [2, 3, 4, 4]: expected the same "
                      "shape with 3 or 6 channels");
}

TEST_CASE("sampling timesteps: round(linspace(0, T - 1, S)) with ties to even, descending", "[diffusion]") {
  const std::vector<std::int64_t> all = sampling_timesteps(1000, 1000);
  REQUIRE(all.size() == 1000);
  CHECK(all.front() == 999);
  CHECK(all.back() == 0);
  CHECK(sampling_timesteps(10, 4) == std::vector<std::int64_t>{9, 6, 3, 0});
  CHECK(sampling_timesteps(6, 3) == std::vector<std::int64_t>{5, 2, 0});  // 2.5 rounds to 2
  CHECK(sampling_timesteps(8, 3) == std::vector<std::int64_t>{7, 4, 0});  // 3.5 rounds to 4
  CHECK(sampling_timesteps(1000, 1) == std::vector<std::int64_t>{0});
  CHECK(sampling_timesteps(1000, 50).size() == 50);
  REQUIRE_THROWS_WITH(sampling_timesteps(1000, 0),
                      "sampling steps must be between 1 and the schedule's 1000 "
                      "timesteps, got 0");
  REQUIRE_THROWS_WITH(sampling_timesteps(1000, 1001),
                      "sampling steps must be between 1 and the schedule's 1000 "
                      "timesteps, got 1001");
}

TEST_CASE("DDIM (any eta) and DDPM reach a single data point under its exact denoiser", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  at::manual_seed(5);
  const at::Tensor x_star = at::rand({2, 3, 4, 4}) * 1.8 - 0.9;
  for (Prediction prediction : {Prediction::eps, Prediction::x0, Prediction::v}) {
    for (const char* sampler : {"ddim", "ddpm"}) {
      for (std::int64_t steps : {1, 10, 50, 1000}) {
        for (double eta : {0.0, 0.7}) {
          if (std::string(sampler) == "ddpm" && eta != 0) continue;
          INFO(prediction_name(prediction) << " " << sampler << " steps " << steps << " eta " << eta);
          std::vector<std::int64_t> noise_steps;
          const NoiseSource noise = [&](std::int64_t step, const at::Tensor& like) {
            noise_steps.push_back(step);
            return at::randn_like(like);
          };
          const at::Tensor x_T = at::randn({2, 3, 4, 4}) * 3;
          const SampleResult result =
              sample(s, oracle(s, x_star, prediction), x_T, std::nullopt,
                     {.sampler = sampler, .steps = steps, .eta = eta, .prediction = prediction}, noise);
          CHECK(max_abs_difference(result.x, x_star) < 1e-4);
          CHECK(result.x.scalar_type() == at::kFloat);
          const std::size_t noisy_steps = (std::string(sampler) == "ddim" && eta == 0) ? 0 : steps - 1;
          REQUIRE(noise_steps.size() == noisy_steps);
          for (std::size_t i = 0; i < noise_steps.size(); ++i) CHECK(noise_steps[i] == static_cast<std::int64_t>(i));
        }
      }
    }
  }
}

TEST_CASE("DDIM with eta 0 follows the chain of x0 predictions", "[diffusion]") {
  // With eps = 0 every step maps x to sqrt(abar' / abar) x, so the chain ends at x_T / sqrt(abar_first).
  const NoiseSchedule s = make_schedule({});
  at::manual_seed(6);
  const at::Tensor x_T = at::randn({2, 3, 4, 4});
  const SampleResult result =
      sample(s, zero_eps(), x_T, std::nullopt, {.steps = 20, .clip = false, .keep_trajectory = true});
  REQUIRE(result.trajectory.size() == 21);
  CHECK(at::equal(result.trajectory.front(), x_T));
  CHECK(at::equal(result.trajectory.back(), result.x));
  const at::Tensor expected = x_T.to(at::kDouble) / std::sqrt(at_index(s.alphas_cumprod, 999));
  CHECK((result.x.to(at::kDouble) - expected).abs().max().item<double>() < 1e-5 * expected.abs().max().item<double>());
  // After the first step (999 -> 946, the second visited timestep of 20):
  const std::int64_t second = sampling_timesteps(1000, 20)[1];
  const double ratio = std::sqrt(at_index(s.alphas_cumprod, second) / at_index(s.alphas_cumprod, 999));
  CHECK(max_abs_difference(result.trajectory[1], x_T * ratio) < 1e-5);

  // eta > 0 adds sigma z with sigma = eta sqrt((1 - abar') / (1 - abar)) sqrt(1 - abar / abar'); z = 1 here.
  const NoiseSource ones = [](std::int64_t, const at::Tensor& like) { return at::ones_like(like); };
  const SampleResult noisy =
      sample(s, zero_eps(), x_T, std::nullopt, {.steps = 2, .eta = 0.6, .clip = false, .keep_trajectory = true}, ones);
  const double abar = at_index(s.alphas_cumprod, 999), abar_prev = at_index(s.alphas_cumprod, 0);
  const double sigma = 0.6 * std::sqrt((1 - abar_prev) / (1 - abar)) * std::sqrt(1 - abar / abar_prev);
  const at::Tensor expected_first = std::sqrt(abar_prev / abar) * x_T + sigma;
  CHECK(max_relative_difference(noisy.trajectory[1], expected_first) < 1e-6);
}

TEST_CASE("DDPM steps: respaced posterior mean and small, large and learned variances", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  at::manual_seed(7);
  const at::Tensor x_T = at::randn({2, 3, 4, 4});
  // Two steps visit 999 and 0: the first goes from 999 to 0 with beta_r = 1 - abar_999 / abar_0.
  const double abar = at_index(s.alphas_cumprod, 999), abar_prev = at_index(s.alphas_cumprod, 0);
  const double beta = 1 - abar / abar_prev;
  const double variance = beta * (1 - abar_prev) / (1 - abar);
  const double coef1 = beta * std::sqrt(abar_prev) / (1 - abar);
  const double coef2 = (1 - abar_prev) * std::sqrt(1 - beta) / (1 - abar);
  const at::Tensor mean = coef1 * (x_T / std::sqrt(abar)) + coef2 * x_T;
  const NoiseSource ones = [](std::int64_t, const at::Tensor& like) { return at::ones_like(like); };

  const auto first_step = [&](const ModelFunction& model, const std::string& variance_kind) {
    const SampleResult result = sample(
        s, model, x_T, std::nullopt,
        {.sampler = "ddpm", .steps = 2, .variance = variance_kind, .clip = false, .keep_trajectory = true}, ones);
    REQUIRE(result.trajectory.size() == 3);
    return result.trajectory[1];
  };
  CHECK(max_relative_difference(first_step(zero_eps(), "small"), mean + std::sqrt(variance)) < 1e-6);
  CHECK(max_relative_difference(first_step(zero_eps(), "large"), mean + std::sqrt(beta)) < 1e-6);
  CHECK(max_relative_difference(first_step(zero_eps(), "auto"), mean + std::sqrt(beta)) < 1e-6);

  // Learned: v = 0 sits halfway between the two log variances.
  const ModelFunction learned = [](const at::Tensor& x, const at::Tensor&, const std::optional<at::Tensor>&) {
    return at::zeros({x.size(0), 2 * x.size(1), x.size(2), x.size(3)});
  };
  const double halfway = std::exp(0.25 * (std::log(beta) + std::log(variance)));
  CHECK(max_relative_difference(first_step(learned, "learned"), mean + halfway) < 1e-6);
  CHECK(max_relative_difference(first_step(learned, "auto"), mean + halfway) < 1e-6);
  CHECK(max_relative_difference(first_step(learned, "small"), mean + std::sqrt(variance)) < 1e-6);
  REQUIRE_THROWS_WITH(first_step(zero_eps(), "learned"),
                      "variance 'learned' needs a model output with 6 channels, got shape [2, 3, 4, 4]");
}

TEST_CASE("classifier-free guidance: scale 1 is the conditional model, others mix cond and uncond", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  at::manual_seed(8);
  const at::Tensor x_T = at::randn({3, 2, 4, 4});
  const at::Tensor labels = at::tensor({0, 3, 7}, at::kLong);
  const std::int64_t null_label = 10;
  const NoiseSource noise = [](std::int64_t step, const at::Tensor& like) {
    return at::randn(like.sizes(), at::detail::createCPUGenerator(static_cast<std::uint64_t>(step)));
  };
  for (bool learned_sigma : {false, true}) {
    INFO("learned sigma " << learned_sigma);
    std::vector<std::int64_t> batch_sizes;
    const ModelFunction model = [&](const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& y) {
      batch_sizes.push_back(x.size(0));
      return toy_conditional(x, t, y, learned_sigma);
    };
    const ModelFunction conditional = [&](const at::Tensor& x, const at::Tensor& t,
                                          const std::optional<at::Tensor>& y) {
      return toy_conditional(x, t, y, learned_sigma);
    };
    const SampleOptions base{.sampler = "ddpm", .steps = 8, .null_label = null_label};

    const SampleResult plain = sample(s, conditional, x_T, labels, base, noise);
    SampleOptions unit = base;
    unit.guidance = 1;
    CHECK(at::equal(sample(s, model, x_T, labels, unit, noise).x, plain.x));
    CHECK(batch_sizes == std::vector<std::int64_t>(8, 3));

    batch_sizes.clear();
    SampleOptions guided = base;
    guided.guidance = 3;
    const SampleResult with_guidance = sample(s, model, x_T, labels, guided, noise);
    CHECK(batch_sizes == std::vector<std::int64_t>(8, 6));
    const ModelFunction mixed = [&](const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& y) {
      const at::Tensor cond = toy_conditional(x, t, y, learned_sigma);
      const at::Tensor uncond = toy_conditional(x, t, at::full_like(*y, null_label), learned_sigma);
      const at::Tensor c = cond.narrow(1, 0, 2), u = uncond.narrow(1, 0, 2);
      const at::Tensor out = u + 3.0 * (c - u);
      return learned_sigma ? at::cat({out, cond.narrow(1, 2, 2)}, 1) : out;
    };
    CHECK(max_abs_difference(with_guidance.x, sample(s, mixed, x_T, labels, base, noise).x) < 1e-5);

    // Guidance 0 is the unconditional model.
    SampleOptions zero = base;
    zero.guidance = 0;
    const ModelFunction unconditional = [&](const at::Tensor& x, const at::Tensor& t,
                                            const std::optional<at::Tensor>& y) {
      const at::Tensor uncond = toy_conditional(x, t, at::full_like(*y, null_label), learned_sigma);
      const at::Tensor cond = toy_conditional(x, t, y, learned_sigma);
      return learned_sigma ? at::cat({uncond.narrow(1, 0, 2), cond.narrow(1, 2, 2)}, 1) : uncond;
    };
    CHECK(max_abs_difference(sample(s, model, x_T, labels, zero, noise).x,
                             sample(s, unconditional, x_T, labels, base, noise).x) < 1e-6);
  }
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.guidance = 2, .null_label = null_label}),
                      "guidance 2 needs class labels (classifier-free guidance)");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, labels, {.guidance = 2}),
                      "guidance 2 needs null_label, the unconditional class id");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, at::tensor({1, 2}, at::kLong), {}),
                      "labels must be an int64 tensor of shape [3], got int64 [2]");
}

TEST_CASE("sample options are checked", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  const at::Tensor x_T = at::zeros({1, 3, 2, 2});
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.sampler = "euler"}),
                      "sampler must be ddim or ddpm, got 'euler'");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.sampler = "ddpm", .variance = "tiny"}),
                      "variance must be auto, small, large or learned, got 'tiny'");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.sampler = "ddpm", .eta = 0.5}),
                      "eta applies to the ddim sampler only, got eta 0.5 with ddpm");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.eta = -1}), "eta must be a number >= 0, got -1");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.variance = "small"}),
                      "variance applies to the ddpm sampler only (ddim takes eta), got 'small' with ddim");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), x_T, std::nullopt, {.steps = 0}),
                      "sampling steps must be between 1 and the schedule's 1000 timesteps, got 0");
  REQUIRE_THROWS_WITH(sample(s, zero_eps(), at::zeros({3}), std::nullopt, {}),
                      "x_T must have a batch and a channel dimension, got shape [3]");
}

TEST_CASE("sampling runs without gradients, with autocast off unless asked, and stops on Ctrl-C", "[diffusion]") {
  const NoiseSchedule s = make_schedule({});
  const at::Tensor x_T = at::zeros({1, 3, 2, 2});
  std::vector<bool> grad_enabled, autocast_enabled;
  const ModelFunction probe = [&](const at::Tensor& x, const at::Tensor&, const std::optional<at::Tensor>&) {
    grad_enabled.push_back(at::GradMode::is_enabled());
    autocast_enabled.push_back(at::autocast::is_autocast_enabled(at::kCPU));
    return at::zeros_like(x);
  };
  at::autocast::set_autocast_enabled(at::kCPU, true);
  sample(s, probe, x_T, std::nullopt, {.steps = 2});
  CHECK(at::autocast::is_autocast_enabled(at::kCPU));
  sample(s, probe, x_T, std::nullopt, {.steps = 1, .autocast = true});
  at::autocast::set_autocast_enabled(at::kCPU, false);
  CHECK(grad_enabled == std::vector<bool>{false, false, false});
  CHECK(autocast_enabled == std::vector<bool>{false, false, true});
  CHECK(at::GradMode::is_enabled());

  runner::core::take_interrupt();
  int calls = 0;
  const ModelFunction interrupting = [&](const at::Tensor& x, const at::Tensor&, const std::optional<at::Tensor>&) {
    if (++calls == 3) runner::core::request_interrupt();
    return at::zeros_like(x);
  };
  CHECK_THROWS_AS(sample(s, interrupting, x_T, std::nullopt, {.steps = 10}), runner::core::Interrupted);
  CHECK(calls == 3);
  CHECK(runner::core::take_interrupt());
}
