// FP8 linear layers on the CPU (at::_scaled_mm has a CPU implementation): the tensorwise scaling against its
// float definition, the three GEMMs against the dequantized operands, the layer against the bfloat16 linear,
// the DiT's layers set to FP8 with their state dict unchanged, and the refusal of amp "fp8" off FP8 GPUs.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <string>
#include <vector>

#include "runtime/nn/dit.h"
#include "runtime/nn/fp8_linear.h"
#include "runtime/nn/linear.h"
#include "runtime/core/device.h"
#include "runtime/train/trainer.h"
#include "tests/cpp/cuda_skip.h"
#include "tests/cpp/small_dit.h"

namespace {

using runner::nn::cast_to_fp8;
using runner::nn::fp8_linear;

// ||actual - expected|| / ||expected|| over all elements, in float64.
double relative_error(const at::Tensor& actual, const at::Tensor& expected) {
  const auto e = expected.to(at::kDouble);
  return ((actual.to(at::kDouble) - e).norm() / e.norm()).item<double>();
}

at::Tensor dequantized(const runner::nn::Fp8Tensor& t) { return t.data.to(at::kFloat) * t.inverse_scale; }

}  // namespace

TEST_CASE("cast_to_fp8 scales by float8_max / amax and saturates, as torchao's tensorwise cast", "[nn][fp8]") {
  at::manual_seed(21);
  const auto t = at::randn({37, 19}) * 3;
  for (const auto& [dtype, most] :
       std::vector<std::pair<at::ScalarType, double>>{{at::kFloat8_e4m3fn, 448.0}, {at::kFloat8_e5m2, 57344.0}}) {
    INFO(c10::toString(dtype));
    const auto cast = cast_to_fp8(t, dtype);
    const float amax = t.abs().max().item<float>();
    const auto scale = at::full({}, static_cast<float>(most)) / amax;
    CHECK(cast.data.scalar_type() == dtype);
    CHECK(cast.data.sizes() == t.sizes());
    CHECK(cast.inverse_scale.scalar_type() == at::kFloat);
    CHECK(cast.inverse_scale.item<float>() == scale.reciprocal().item<float>());
    CHECK(at::equal(cast.data.to(at::kFloat), (t * scale).clamp(-most, most).to(dtype).to(at::kFloat)));
    // The largest magnitude lands on float8_max exactly.
    CHECK(cast.data.to(at::kFloat).abs().max().item<double>() == most);
  }
  // A zero tensor: amax is floored at 1e-12, the data stays zero and finite.
  const auto zero = cast_to_fp8(at::zeros({4, 16}), at::kFloat8_e4m3fn);
  CHECK(at::equal(zero.data.to(at::kFloat), at::zeros({4, 16})));
  CHECK(std::isfinite(zero.inverse_scale.item<float>()));
}

TEST_CASE("fp8_linear's forward and gradients are the scaled GEMMs of the dequantized operands", "[nn][fp8]") {
  at::manual_seed(22);
  const auto x = at::randn({4, 16, 96}).requires_grad_(true);
  const auto weight = (0.1 * at::randn({48, 96})).requires_grad_(true);
  const auto bias = (0.1 * at::randn({48})).requires_grad_(true);
  const auto grad = at::randn({4, 16, 48});
  const auto y = fp8_linear(x, weight, bias);
  CHECK(y.scalar_type() == at::kBFloat16);
  CHECK(y.sizes() == at::IntArrayRef({4, 16, 48}));
  y.backward(grad.to(at::kBFloat16));

  const auto x8 = cast_to_fp8(x.detach().reshape({-1, 96}), at::kFloat8_e4m3fn);
  const auto w8 = cast_to_fp8(weight.detach(), at::kFloat8_e4m3fn);
  const auto g8 = cast_to_fp8(grad.to(at::kBFloat16).reshape({-1, 48}), at::kFloat8_e5m2);
  const auto expected_y =
      at::addmm(bias.detach().to(at::kBFloat16).to(at::kFloat), dequantized(x8), dequantized(w8).t());
  // One rounding to bfloat16 apart: 2^-8 of the largest value.
  const auto largest = [](const at::Tensor& t) { return t.abs().max().item<double>(); };
  CHECK((y.reshape({-1, 48}).to(at::kFloat) - expected_y).abs().max().item<double>() <= largest(expected_y) / 256);
  const auto expected_grad_x = dequantized(g8).mm(dequantized(w8));
  CHECK(x.grad().scalar_type() == at::kFloat);
  CHECK((x.grad().reshape({-1, 96}) - expected_grad_x).abs().max().item<double>() <= largest(expected_grad_x) / 256);
  const auto expected_grad_w = dequantized(g8).t().mm(dequantized(x8));
  CHECK(weight.grad().scalar_type() == at::kFloat);
  CHECK((weight.grad() - expected_grad_w).abs().max().item<double>() <= 1e-5 * largest(expected_grad_w));
  CHECK(at::allclose(bias.grad(), grad.to(at::kBFloat16).to(at::kFloat).sum(at::IntArrayRef{0, 1}), 1e-5, 1e-5));
}

TEST_CASE("fp8_linear is within FP8's error of the bfloat16 linear", "[nn][fp8]") {
  // e4m3 keeps 3 mantissa bits, e5m2 2: stated tolerances on the relative Frobenius error, about 1.6x what these
  // inputs show (0.038 forward, 0.059 for the gradients).
  at::manual_seed(23);
  const auto x = at::randn({64, 96}).requires_grad_(true);
  const auto weight = (0.1 * at::randn({48, 96})).requires_grad_(true);
  const auto bias = (0.1 * at::randn({48})).requires_grad_(true);
  const auto grad = at::randn({64, 48});
  const auto y = fp8_linear(x, weight, bias);
  y.backward(grad.to(at::kBFloat16));
  const auto x_ref = x.detach().clone().requires_grad_(true);
  const auto w_ref = weight.detach().clone().requires_grad_(true);
  const auto y_ref = at::linear(x_ref, w_ref, bias.detach());
  y_ref.backward(grad);
  CHECK(relative_error(y, y_ref) <= 0.06);
  CHECK(relative_error(x.grad(), x_ref.grad()) <= 0.1);
  CHECK(relative_error(weight.grad(), w_ref.grad()) <= 0.1);
}

TEST_CASE("fp8_linear takes the bfloat16 linear when the rows are not a multiple of 16", "[nn][fp8]") {
  at::manual_seed(24);
  const auto x = at::randn({5, 32});
  const auto weight = at::randn({16, 32});
  const auto bias = at::randn({16});
  CHECK(at::equal(fp8_linear(x, weight, bias),
                  at::linear(x.to(at::kBFloat16), weight.to(at::kBFloat16), bias.to(at::kBFloat16))));
}

TEST_CASE("a DiT's block layers set to FP8 keep their parameters and state dict", "[nn][fp8]") {
  at::manual_seed(25);
  runner::nn::DiT dit(runner::testing::small_dit_options());
  std::vector<std::string> names_before;
  for (const auto& p : dit->named_parameters()) names_before.push_back(p.key());
  // qkv, proj, fc1 and fc2 of each block; the embedders, adaLN projections and the final layer stay as they are.
  CHECK(runner::nn::set_matmul_precision(*dit, runner::nn::MatmulPrecision::fp8) == 4 * 2);
  std::vector<std::string> names_after;
  for (const auto& p : dit->named_parameters()) names_after.push_back(p.key());
  CHECK(names_after == names_before);
  const auto x = at::randn({2, 4, 8, 8});
  const auto t = at::tensor({3, 700}, at::kLong);
  const auto labels = at::tensor({1, 2}, at::kLong);
  {
    const at::NoGradGuard no_grad;
    for (auto& p : dit->parameters()) p.normal_(0, 0.05);
  }
  const auto fp8_out = dit->forward(x, t, labels);
  CHECK(runner::nn::set_matmul_precision(*dit, runner::nn::MatmulPrecision::autocast) == 4 * 2);
  const auto reference = dit->forward(x, t, labels);
  CHECK(relative_error(fp8_out, reference) <= 0.06);
  CHECK_FALSE(at::equal(fp8_out.to(at::kFloat), reference));
}

TEST_CASE("amp 'fp8' is refused on the CPU, naming what it needs", "[nn][fp8]") {
  CHECK_THROWS_WITH(runner::train::resolve_precision("fp8", c10::Device(c10::kCPU)),
                    "amp 'fp8' needs a CUDA device of compute capability 8.9 or later (FP8 tensor cores); this "
                    "device is the CPU (use 'bf16' or 'fp32')");
  CHECK_THROWS_WITH(runner::train::resolve_precision("fp4", c10::Device(c10::kCPU)),
                    "amp must be auto, bf16, fp16, fp32 or fp8, got 'fp4'");
}

TEST_CASE("fp8_linear on an FP8 GPU: the scaled GEMMs of the dequantized operands, within FP8's error of bf16",
          "[nn][fp8][cuda]") {
  SKIP_WITHOUT_CUDA("fp8_linear's GEMMs on the GPU");
  const auto capability = runner::core::cuda_compute_capability(0);
  if (capability.major * 10 + capability.minor < 89) {
    WARN("SKIP: this GPU is compute capability " << capability.major << "." << capability.minor
                                                 << "; FP8 GEMMs need 8.9 or later");
    return;
  }
  at::manual_seed(26);
  const auto cuda = at::TensorOptions().device(c10::Device(c10::kCUDA, 0));
  // DiT-B/2's MLP at 2 images of 256 tokens: rows 512, in 768, out 3072.
  const auto x = at::randn({2, 256, 768}, cuda).requires_grad_(true);
  const auto weight = (0.02 * at::randn({3072, 768}, cuda)).requires_grad_(true);
  const auto bias = (0.02 * at::randn({3072}, cuda)).requires_grad_(true);
  const auto grad = at::randn({2, 256, 3072}, cuda).to(at::kBFloat16);
  const auto y = fp8_linear(x, weight, bias);
  y.backward(grad);
  const auto x8 = cast_to_fp8(x.detach().reshape({-1, 768}), at::kFloat8_e4m3fn);
  const auto w8 = cast_to_fp8(weight.detach(), at::kFloat8_e4m3fn);
  const auto g8 = cast_to_fp8(grad.reshape({-1, 3072}), at::kFloat8_e5m2);
  const auto largest = [](const at::Tensor& t) { return t.abs().max().item<double>(); };
  // The forward accumulates fast (as torchao's recipe): within 2^-7 of the largest value; the gradients exactly
  // accumulated: 2^-8 (one bf16 rounding) for x's, 1e-5 for W's (float32 output).
  const auto expected_y =
      at::addmm(bias.detach().to(at::kBFloat16).to(at::kFloat), dequantized(x8), dequantized(w8).t());
  CHECK((y.reshape({-1, 3072}).to(at::kFloat) - expected_y).abs().max().item<double>() <= largest(expected_y) / 128);
  const auto expected_grad_x = dequantized(g8).mm(dequantized(w8));
  CHECK((x.grad().reshape({-1, 768}) - expected_grad_x).abs().max().item<double>() <= largest(expected_grad_x) / 256);
  const auto expected_grad_w = dequantized(g8).t().mm(dequantized(x8));
  CHECK((weight.grad() - expected_grad_w).abs().max().item<double>() <= 1e-5 * largest(expected_grad_w));
  // Against the bf16 linear (autocast's numbers): the stated FP8 tolerances.
  const auto x_ref = x.detach().clone().requires_grad_(true);
  const auto w_ref = weight.detach().clone().requires_grad_(true);
  const auto y_ref = at::linear(x_ref.to(at::kBFloat16), w_ref.to(at::kBFloat16), bias.detach().to(at::kBFloat16));
  y_ref.backward(grad);
  CHECK(relative_error(y, y_ref) <= 0.06);
  CHECK(relative_error(x.grad(), x_ref.grad()) <= 0.1);
  CHECK(relative_error(weight.grad(), w_ref.grad()) <= 0.1);
}
