// runner::ops::modulate against the ATen ops it replaces: on the CPU equal bit for bit (forward and backward),
// finite differences and second derivatives in float64, input errors; on CUDA the kernel against the CPU
// implementation.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#if RUNNER_WITH_CUDA
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#endif
// After LibTorch: c10's logging header defines a CHECK of its own, which Catch's must replace.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "runtime/kernels/ops.h"
#include "tests/cpp/cuda_graph_capture.h"
#include "tests/cpp/cuda_skip.h"

namespace {

using Leaves = std::vector<at::Tensor>;
using ModulateFn = at::Tensor (*)(const at::Tensor&, const at::Tensor&, const at::Tensor&);
// Builds the op's inputs from the leaves (directly or as views) and applies a modulate function.
using Forward = std::function<at::Tensor(ModulateFn, const Leaves&)>;

// What the DiT computed before the op existed, written out here as the reference.
at::Tensor modulate_in_aten_ops(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

struct Shape {
  std::int64_t batch, tokens, channels;
};

// Odd channel counts (no 16-byte packs), single tokens and samples, a DiT-S width.
const std::vector<Shape> kShapes = {{2, 5, 8}, {3, 1, 7}, {1, 4, 1}, {4, 17, 33}, {2, 9, 384}};

struct Dtypes {
  at::ScalarType x, parameters;
};

std::string describe(const Shape& s, const Dtypes& d) {
  return "x [" + std::to_string(s.batch) + ", " + std::to_string(s.tokens) + ", " + std::to_string(s.channels) + "] " +
         c10::toString(d.x) + ", shift and scale " + c10::toString(d.parameters);
}

// x, shift, scale as separate contiguous tensors.
Leaves plain_leaves(const Shape& s, const Dtypes& d) {
  return {at::randn({s.batch, s.tokens, s.channels}, at::kDouble).to(d.x),
          at::randn({s.batch, s.channels}, at::kDouble).to(d.parameters),
          (0.5 * at::randn({s.batch, s.channels}, at::kDouble)).to(d.parameters)};
}

at::Tensor plain_forward(ModulateFn modulate, const Leaves& leaves) {
  return modulate(leaves[0], leaves[1], leaves[2]);
}

// As in the DiT: shift and scale are chunks of one [batch, 6 channels] modulation (rows strided), and here x is
// a transposed view of a [batch, channels, tokens] tensor.
Leaves strided_leaves(const Shape& s, const Dtypes& d) {
  return {at::randn({s.batch, s.channels, s.tokens}, at::kDouble).to(d.x),
          at::randn({s.batch, 6 * s.channels}, at::kDouble).to(d.parameters)};
}

at::Tensor strided_forward(ModulateFn modulate, const Leaves& leaves) {
  const auto chunks = leaves[1].chunk(6, 1);
  return modulate(leaves[0].transpose(1, 2), chunks[3], chunks[4]);
}

struct Outcome {
  at::Tensor out;
  Leaves grads;
};

// out and the gradients of sum(out * grad_out) with respect to fresh copies of the leaves on `device`.
Outcome forward_backward(ModulateFn modulate, const Forward& forward, const Leaves& leaves, const at::Tensor& grad_out,
                         c10::Device device) {
  Leaves on_device;
  for (const auto& leaf : leaves) on_device.push_back(leaf.detach().to(device).clone().requires_grad_(true));
  const auto out = forward(modulate, on_device);
  out.backward(grad_out.to(device).to(out.scalar_type()));
  Outcome outcome{out.detach().cpu(), {}};
  for (const auto& leaf : on_device) outcome.grads.push_back(leaf.grad().cpu());
  return outcome;
}

void check_equal(const Outcome& actual, const Outcome& expected, const std::string& what) {
  INFO(what);
  CHECK(actual.out.scalar_type() == expected.out.scalar_type());
  CHECK(at::equal(actual.out, expected.out));
  REQUIRE(actual.grads.size() == expected.grads.size());
  for (std::size_t i = 0; i < actual.grads.size(); ++i) {
    INFO("gradient of leaf " << i);
    CHECK(actual.grads[i].scalar_type() == expected.grads[i].scalar_type());
    CHECK(at::equal(actual.grads[i], expected.grads[i]));
  }
}

// max |actual - expected| <= tolerance * max |expected|, with equal dtypes and shapes.
void check_close(const at::Tensor& actual, const at::Tensor& expected, double tolerance, const std::string& what) {
  INFO(what);
  REQUIRE(actual.sizes() == expected.sizes());
  CHECK(actual.scalar_type() == expected.scalar_type());
  if (expected.numel() == 0) return;
  const auto a = actual.cpu().to(at::kDouble), e = expected.cpu().to(at::kDouble);
  const double largest = e.abs().max().item<double>();
  const double difference = (a - e).abs().max().item<double>();
  INFO("largest difference " << difference << ", largest value " << largest << ", tolerance " << tolerance);
  CHECK(difference <= tolerance * largest);
}

}  // namespace

TEST_CASE("modulate on the CPU equals the ATen ops bit for bit, forward and backward", "[kernels]") {
  at::manual_seed(1);
  const std::vector<Dtypes> dtypes = {{at::kFloat, at::kFloat},    {at::kBFloat16, at::kBFloat16},
                                      {at::kHalf, at::kHalf},      {at::kDouble, at::kDouble},
                                      {at::kFloat, at::kBFloat16},  // autocast: layer_norm in float32, linear in bf16
                                      {at::kBFloat16, at::kFloat}};
  const c10::Device cpu(c10::kCPU);
  for (const auto& d : dtypes) {
    for (const auto& s : kShapes) {
      const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
      for (const auto& [layout, forward, leaves] :
           {std::tuple{"contiguous", Forward(plain_forward), plain_leaves(s, d)},
            std::tuple{"strided", Forward(strided_forward), strided_leaves(s, d)}}) {
        check_equal(forward_backward(runner::ops::modulate, forward, leaves, grad_out, cpu),
                    forward_backward(modulate_in_aten_ops, forward, leaves, grad_out, cpu),
                    describe(s, d) + ", " + layout);
      }
    }
  }
}

TEST_CASE("modulate computes only the gradients asked for, each equal to the ATen ops'", "[kernels]") {
  at::manual_seed(2);
  const Shape s{3, 6, 10};
  const auto leaves = plain_leaves(s, {at::kFloat, at::kFloat});
  const auto grad_out = at::randn({s.batch, s.tokens, s.channels});
  for (int wanted = 0; wanted < 3; ++wanted) {
    INFO("only input " << wanted << " requires grad");
    std::vector<at::Tensor> fused, reference;
    for (int i = 0; i < 3; ++i) {
      fused.push_back(leaves[i].clone().requires_grad_(i == wanted));
      reference.push_back(leaves[i].clone().requires_grad_(i == wanted));
    }
    runner::ops::modulate(fused[0], fused[1], fused[2]).backward(grad_out);
    modulate_in_aten_ops(reference[0], reference[1], reference[2]).backward(grad_out);
    for (int i = 0; i < 3; ++i) {
      CHECK(fused[i].grad().defined() == (i == wanted));
      if (i == wanted) CHECK(at::equal(fused[i].grad(), reference[i].grad()));
    }
  }
  const auto out = runner::ops::modulate(leaves[0], leaves[1], leaves[2]);
  CHECK_FALSE(out.requires_grad());
}

TEST_CASE("modulate's gradients agree with central differences in float64", "[kernels]") {
  at::manual_seed(3);
  const Shape s{2, 3, 5};
  const auto leaves = plain_leaves(s, {at::kDouble, at::kDouble});
  const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
  const auto analytic =
      forward_backward(runner::ops::modulate, plain_forward, leaves, grad_out, c10::Device(c10::kCPU)).grads;
  const auto objective = [&](const Leaves& inputs) {
    return (runner::ops::modulate(inputs[0], inputs[1], inputs[2]) * grad_out).sum().item<double>();
  };
  // The objective is linear in each single element, so the central difference is exact up to rounding.
  constexpr double kStep = 1e-6;
  for (std::size_t leaf = 0; leaf < leaves.size(); ++leaf) {
    for (std::int64_t element = 0; element < leaves[leaf].numel(); ++element) {
      Leaves plus = {leaves[0].clone(), leaves[1].clone(), leaves[2].clone()};
      Leaves minus = {leaves[0].clone(), leaves[1].clone(), leaves[2].clone()};
      plus[leaf].view(-1)[element] += kStep;
      minus[leaf].view(-1)[element] -= kStep;
      const double numeric = (objective(plus) - objective(minus)) / (2 * kStep);
      const double exact = analytic[leaf].view(-1)[element].item<double>();
      INFO("leaf " << leaf << " element " << element << ": analytic " << exact << ", numeric " << numeric);
      CHECK(std::abs(numeric - exact) <= 1e-7 * (1 + std::abs(exact)));
    }
  }
}

TEST_CASE("modulate's backward is differentiable: second derivatives equal the ATen ops'", "[kernels]") {
  at::manual_seed(7);
  const Shape s{2, 4, 6};
  const auto leaves = plain_leaves(s, {at::kDouble, at::kDouble});
  const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
  const auto x_direction = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
  const auto scale_direction = at::randn({s.batch, s.channels}, at::kDouble);
  // d/d(inputs) of <d(out . grad_out)/dx, x_direction> + <d(out . grad_out)/dscale, scale_direction>.
  const auto second_derivatives = [&](ModulateFn modulate) {
    Leaves inputs;
    for (const auto& leaf : leaves) inputs.push_back(leaf.clone().requires_grad_(true));
    const auto first = torch::autograd::grad({(modulate(inputs[0], inputs[1], inputs[2]) * grad_out).sum()},
                                             {inputs[0], inputs[2]}, {}, std::nullopt, /*create_graph=*/true);
    const auto along = (first[0] * x_direction).sum() + (first[1] * scale_direction).sum();
    return torch::autograd::grad({along}, inputs, {}, std::nullopt, false, /*allow_unused=*/true);
  };
  const auto fused = second_derivatives(runner::ops::modulate);
  const auto reference = second_derivatives(modulate_in_aten_ops);
  for (std::size_t i = 0; i < fused.size(); ++i) {
    INFO("input " << i);
    REQUIRE(fused[i].defined() == reference[i].defined());
    if (fused[i].defined()) check_close(fused[i], reference[i], 1e-12, "second derivative");
  }
}

TEST_CASE("modulate names the input that does not fit", "[kernels]") {
  const auto x = at::zeros({2, 5, 8});
  CHECK_THROWS_WITH(
      runner::ops::modulate(x, at::zeros({2, 9}), at::zeros({2, 8})),
      Catch::Contains("modulate: shift must be [batch, channels] = [2, 8] for x of [2, 5, 8], got [2, 9]"));
  CHECK_THROWS_WITH(
      runner::ops::modulate(x, at::zeros({2, 8}), at::zeros({1, 8})),
      Catch::Contains("modulate: scale must be [batch, channels] = [2, 8] for x of [2, 5, 8], got [1, 8]"));
  CHECK_THROWS_WITH(runner::ops::modulate(at::zeros({2, 40}), at::zeros({2, 40}), at::zeros({2, 40})),
                    Catch::Contains("modulate: x must be [batch, tokens, channels], got [2, 40]"));
  CHECK_THROWS_WITH(runner::ops::modulate(x.to(at::kInt), at::zeros({2, 8}), at::zeros({2, 8})),
                    Catch::Contains("modulate: x, shift and scale must be floating point, got Int, Float and Float"));
}

// Tolerances relative to the largest value of each tensor: float32 1e-5, float64 1e-12, bfloat16 2^-7 and
// float16 2^-10 (one unit in the last place at the top of the range). The forward rounds as the ATen ops do, so
// it should be equal; the gradients' sums over tokens run in another order on the GPU.
double tolerance_of(at::ScalarType dtype) {
  switch (dtype) {
    case at::kDouble:
      return 1e-12;
    case at::kBFloat16:
      return 1.0 / 128;
    case at::kHalf:
      return 1.0 / 1024;
    default:
      return 1e-5;
  }
}

TEST_CASE("modulate's CUDA kernel matches the CPU implementation, forward and backward", "[kernels][cuda]") {
  SKIP_WITHOUT_CUDA("modulate's CUDA kernel against the CPU implementation");
  at::manual_seed(4);
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  const std::vector<Dtypes> dtypes = {{at::kFloat, at::kFloat},    {at::kBFloat16, at::kBFloat16},
                                      {at::kHalf, at::kHalf},      {at::kDouble, at::kDouble},
                                      {at::kFloat, at::kBFloat16}, {at::kFloat, at::kHalf},
                                      {at::kBFloat16, at::kFloat}};  // no kernel: the ATen ops on the device
  std::vector<Shape> shapes = kShapes;
  shapes.push_back({3, 64, 1152});  // DiT-XL's width, 16-byte packs in every dtype
  shapes.push_back({2, 0, 16});     // no tokens: an empty result, no launch
  for (const auto& d : dtypes) {
    for (const auto& s : shapes) {
      const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
      for (const auto& [layout, forward, leaves] :
           {std::tuple{"contiguous", Forward(plain_forward), plain_leaves(s, d)},
            std::tuple{"strided", Forward(strided_forward), strided_leaves(s, d)}}) {
        const auto what = describe(s, d) + ", " + layout;
        const auto on_cuda = forward_backward(runner::ops::modulate, forward, leaves, grad_out, cuda);
        const auto on_cpu = forward_backward(runner::ops::modulate, forward, leaves, grad_out, cpu);
        check_close(on_cuda.out, on_cpu.out, tolerance_of(on_cpu.out.scalar_type()), what + ": output");
        for (std::size_t i = 0; i < leaves.size(); ++i) {
          check_close(on_cuda.grads[i], on_cpu.grads[i], tolerance_of(on_cpu.grads[i].scalar_type()),
                      what + ": gradient of leaf " + std::to_string(i));
        }
      }
    }
  }
}

TEST_CASE("modulate's CUDA kernel reads misaligned x and parameters strided along the channels", "[kernels][cuda]") {
  SKIP_WITHOUT_CUDA("modulate's CUDA kernel on misaligned and strided inputs");
  at::manual_seed(5);
  const c10::Device cuda(c10::kCUDA, 0);
  const Shape s{3, 7, 64};
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    // Contiguous, but one element past a 16-byte boundary: the kernel takes one element at a time.
    const auto storage = at::randn({s.batch * s.tokens * s.channels + 1}).to(dtype);
    const auto x = storage.narrow(0, 1, s.batch * s.tokens * s.channels).view({s.batch, s.tokens, s.channels});
    // [channels, batch] transposed: channel stride `batch`.
    const auto shift = at::randn({s.channels, s.batch}).to(dtype).t();
    const auto scale = at::randn({s.channels, s.batch}).to(dtype).t();
    const auto expected = runner::ops::modulate(x, shift, scale);
    const auto actual = runner::ops::modulate(x.to(cuda), shift.to(cuda), scale.to(cuda));
    check_close(actual, expected, tolerance_of(dtype), std::string("misaligned x, ") + c10::toString(dtype));
  }
}

TEST_CASE("modulate's CUDA kernel runs on the current stream: it captures in a CUDA graph and replays",
          "[kernels][cuda]") {
  SKIP_WITHOUT_CUDA("capturing modulate in a CUDA graph");
#if RUNNER_WITH_CUDA
  at::manual_seed(6);
  const c10::Device cuda(c10::kCUDA, 0);
  const Shape s{4, 16, 384};
  const auto options = at::TensorOptions().device(cuda);
  const auto x = at::randn({s.batch, s.tokens, s.channels}, options);
  const auto shift = at::randn({s.batch, s.channels}, options);
  const auto scale = at::randn({s.batch, s.channels}, options);
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  at::Tensor out;
  c10::cuda::device_synchronize();  // the inputs are written before the side stream reads them
  {
    c10::cuda::CUDAStreamGuard guard(side);
    runner::ops::modulate(x, shift, scale);  // warm-up outside the capture
    runner::testing::capture_into(graph, [&] { out = runner::ops::modulate(x, shift, scale); });
  }
  // New inputs in the captured addresses: a replay computes from them.
  x.copy_(at::randn_like(x));
  shift.copy_(at::randn_like(shift));
  scale.copy_(at::randn_like(scale));
  graph.replay();
  check_close(out, runner::ops::modulate(x.cpu(), shift.cpu(), scale.cpu()), tolerance_of(at::kFloat),
              "replayed output");
#endif
}
