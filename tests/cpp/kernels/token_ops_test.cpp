// runner's token ops (layer_norm_modulate, gated_residual) against the ATen ops they replace: on the CPU equal
// bit for bit (forward and backward), central differences and second derivatives in float64, input errors; on
// CUDA the kernels against the CPU implementation.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
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
using TokenOp = std::function<at::Tensor(const Leaves&)>;

constexpr double kEps = 1e-6;

struct Shape {
  std::int64_t batch, tokens, channels;
};

// Odd channel counts, single tokens and samples, a DiT-S width.
const std::vector<Shape> kShapes = {{2, 5, 8}, {3, 1, 7}, {1, 4, 1}, {4, 17, 33}, {2, 9, 384}};

struct Dtypes {
  at::ScalarType tokens, parameters;
};

const std::vector<Dtypes> kDtypes = {
    {at::kFloat, at::kFloat},   {at::kBFloat16, at::kBFloat16}, {at::kHalf, at::kHalf},
    {at::kDouble, at::kDouble}, {at::kFloat, at::kBFloat16},  // autocast: the residual stream in float32
    {at::kBFloat16, at::kFloat}};

// An op under test: the runner op, the unfused ATen composition it replaces (the reference, which the DiT runs
// without fused ops), and how its leaves are made. Leaf 0 is x [batch, tokens, channels]; the others are
// per-sample [batch, channels] parameters or, for gated_residual's y, token tensors in the parameters' dtype.
struct OpCase {
  std::string name;
  TokenOp fused, reference;
  std::vector<bool> per_sample;  // of leaves 1 and 2
};

const OpCase kLayerNormModulate{
    "layer_norm_modulate",
    [](const Leaves& l) { return runner::ops::layer_norm_modulate(l[0], l[1], l[2], kEps); },
    [](const Leaves& l) { return runner::ops::layer_norm_modulate_unfused(l[0], l[1], l[2], kEps); },
    {true, true}};

const OpCase kGatedResidual{"gated_residual",
                            [](const Leaves& l) { return runner::ops::gated_residual(l[0], l[1], l[2]); },
                            [](const Leaves& l) { return runner::ops::gated_residual_unfused(l[0], l[1], l[2]); },
                            {true, false}};

const std::vector<OpCase> kOps = {kLayerNormModulate, kGatedResidual};

std::string describe(const OpCase& op, const Shape& s, const Dtypes& d, const std::string& layout) {
  return op.name + ": x [" + std::to_string(s.batch) + ", " + std::to_string(s.tokens) + ", " +
         std::to_string(s.channels) + "] " + c10::toString(d.tokens) + ", parameters " + c10::toString(d.parameters) +
         ", " + layout;
}

// The leaves and a function of them that builds the op's inputs: "contiguous" takes each leaf as it is;
// "strided", as in the DiT, takes x as a transposed view of [batch, channels, tokens] and each per-sample
// parameter as a chunk of one [batch, 6 channels] modulation (rows strided).
struct Inputs {
  Leaves leaves;
  std::function<Leaves(const Leaves&)> arrange;
};

Inputs make_inputs(const OpCase& op, const Shape& s, const Dtypes& d, bool strided) {
  Inputs in;
  const auto random = [](at::IntArrayRef sizes, at::ScalarType dtype, double spread) {
    return (spread * at::randn(sizes, at::kDouble)).to(dtype);
  };
  if (!strided) {
    in.leaves.push_back(random({s.batch, s.tokens, s.channels}, d.tokens, 1.0));
    for (bool per_sample : op.per_sample) {
      in.leaves.push_back(per_sample ? random({s.batch, s.channels}, d.parameters, 0.5)
                                     : random({s.batch, s.tokens, s.channels}, d.parameters, 1.0));
    }
    in.arrange = [](const Leaves& leaves) { return leaves; };
    return in;
  }
  in.leaves.push_back(random({s.batch, s.channels, s.tokens}, d.tokens, 1.0));
  in.leaves.push_back(random({s.batch, 6 * s.channels}, d.parameters, 0.5));
  in.leaves.push_back(op.per_sample[1] ? at::Tensor() : random({s.batch, s.tokens, s.channels}, d.parameters, 1.0));
  const bool third_per_sample = op.per_sample[1];
  in.arrange = [third_per_sample](const Leaves& leaves) {
    const auto chunks = leaves[1].chunk(6, 1);
    return Leaves{leaves[0].transpose(1, 2), chunks[3], third_per_sample ? chunks[4] : leaves[2]};
  };
  if (third_per_sample) in.leaves.pop_back();
  return in;
}

struct Outcome {
  at::Tensor out;
  Leaves grads;
};

// The output and the gradients of sum(out * grad_out) with respect to fresh copies of the leaves on `device`.
Outcome forward_backward(const TokenOp& op, const Inputs& in, const at::Tensor& grad_out, c10::Device device) {
  Leaves on_device;
  for (const auto& leaf : in.leaves) on_device.push_back(leaf.detach().to(device).clone().requires_grad_(true));
  const auto out = op(in.arrange(on_device));
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

TEST_CASE("the token ops on the CPU equal the ATen ops bit for bit, forward and backward", "[kernels]") {
  at::manual_seed(1);
  const c10::Device cpu(c10::kCPU);
  for (const auto& op : kOps) {
    for (const auto& d : kDtypes) {
      for (const auto& s : kShapes) {
        const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
        for (const bool strided : {false, true}) {
          const auto in = make_inputs(op, s, d, strided);
          check_equal(forward_backward(op.fused, in, grad_out, cpu), forward_backward(op.reference, in, grad_out, cpu),
                      describe(op, s, d, strided ? "strided" : "contiguous"));
        }
      }
    }
  }
}

TEST_CASE("the token ops compute only the gradients asked for, each equal to the ATen ops'", "[kernels]") {
  at::manual_seed(2);
  const Shape s{3, 6, 10};
  for (const auto& op : kOps) {
    const auto in = make_inputs(op, s, {at::kFloat, at::kFloat}, false);
    const auto grad_out = at::randn({s.batch, s.tokens, s.channels});
    for (int wanted = 0; wanted < 3; ++wanted) {
      INFO(op.name << ": only input " << wanted << " requires grad");
      Leaves fused, reference;
      for (int i = 0; i < 3; ++i) {
        fused.push_back(in.leaves[i].clone().requires_grad_(i == wanted));
        reference.push_back(in.leaves[i].clone().requires_grad_(i == wanted));
      }
      op.fused(fused).backward(grad_out);
      op.reference(reference).backward(grad_out);
      for (int i = 0; i < 3; ++i) {
        CHECK(fused[i].grad().defined() == (i == wanted));
        if (i == wanted) CHECK(at::equal(fused[i].grad(), reference[i].grad()));
      }
    }
    CHECK_FALSE(op.fused(in.leaves).requires_grad());
  }
}

TEST_CASE("the token ops' gradients agree with central differences in float64", "[kernels]") {
  at::manual_seed(3);
  const Shape s{2, 3, 5};
  for (const auto& op : kOps) {
    const auto in = make_inputs(op, s, {at::kDouble, at::kDouble}, false);
    const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
    const auto analytic = forward_backward(op.fused, in, grad_out, c10::Device(c10::kCPU)).grads;
    const auto objective = [&](const Leaves& inputs) { return (op.fused(inputs) * grad_out).sum().item<double>(); };
    constexpr double kStep = 1e-6;
    for (std::size_t leaf = 0; leaf < in.leaves.size(); ++leaf) {
      for (std::int64_t element = 0; element < in.leaves[leaf].numel(); ++element) {
        Leaves plus, minus;
        for (const auto& l : in.leaves) {
          plus.push_back(l.clone());
          minus.push_back(l.clone());
        }
        plus[leaf].view(-1)[element] += kStep;
        minus[leaf].view(-1)[element] -= kStep;
        const double numeric = (objective(plus) - objective(minus)) / (2 * kStep);
        const double exact = analytic[leaf].view(-1)[element].item<double>();
        INFO(op.name << ": leaf " << leaf << " element " << element << ": analytic " << exact << ", numeric "
                     << numeric);
        CHECK(std::abs(numeric - exact) <= 1e-6 * (1 + std::abs(exact)));
      }
    }
  }
}

TEST_CASE("the token ops' backward is differentiable: second derivatives equal the ATen ops'", "[kernels]") {
  at::manual_seed(7);
  const Shape s{2, 4, 6};
  for (const auto& op : kOps) {
    const auto in = make_inputs(op, s, {at::kDouble, at::kDouble}, false);
    const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
    Leaves directions;
    for (const auto& leaf : in.leaves) directions.push_back(at::randn_like(leaf));
    // d/d(inputs) of the sum over the leaves of <d(out . grad_out)/d leaf, direction>.
    const auto second_derivatives = [&](const TokenOp& f) {
      Leaves inputs;
      for (const auto& leaf : in.leaves) inputs.push_back(leaf.clone().requires_grad_(true));
      const auto first = torch::autograd::grad({(f(inputs) * grad_out).sum()}, inputs, {}, std::nullopt,
                                               /*create_graph=*/true, /*allow_unused=*/true);
      at::Tensor along = at::zeros({}, at::kDouble);
      for (std::size_t i = 0; i < first.size(); ++i) {
        if (first[i].defined() && first[i].requires_grad()) along = along + (first[i] * directions[i]).sum();
      }
      return torch::autograd::grad({along}, inputs, {}, std::nullopt, false, /*allow_unused=*/true);
    };
    const auto fused = second_derivatives(op.fused);
    const auto reference = second_derivatives(op.reference);
    for (std::size_t i = 0; i < fused.size(); ++i) {
      INFO(op.name << ": input " << i);
      REQUIRE(fused[i].defined() == reference[i].defined());
      if (fused[i].defined()) check_close(fused[i], reference[i], 1e-12, "second derivative");
    }
  }
}

TEST_CASE("the token ops name the input that does not fit", "[kernels]") {
  using runner::ops::gated_residual;
  using runner::ops::layer_norm_modulate;
  const auto x = at::zeros({2, 5, 8});
  CHECK_THROWS_WITH(layer_norm_modulate(x, at::zeros({2, 9}), at::zeros({2, 8}), kEps),
                    Catch::Contains("layer_norm_modulate: shift must be [batch, channels] = [2, 8] for x of "
                                    "[2, 5, 8], got [2, 9]"));
  CHECK_THROWS_WITH(layer_norm_modulate(x, at::zeros({2, 8}), at::zeros({1, 8}), kEps),
                    Catch::Contains("layer_norm_modulate: scale must be [batch, channels] = [2, 8] for x of "
                                    "[2, 5, 8], got [1, 8]"));
  CHECK_THROWS_WITH(layer_norm_modulate(at::zeros({2, 40}), at::zeros({2, 40}), at::zeros({2, 40}), kEps),
                    Catch::Contains("layer_norm_modulate: x must be [batch, tokens, channels], got [2, 40]"));
  CHECK_THROWS_WITH(layer_norm_modulate(x.to(at::kInt), at::zeros({2, 8}), at::zeros({2, 8}), kEps),
                    Catch::Contains("layer_norm_modulate: x, shift and scale must be floating point, got Int, "
                                    "Float and Float"));
  CHECK_THROWS_WITH(layer_norm_modulate(x, at::zeros({2, 8}), at::zeros({2, 8}), 0.0),
                    Catch::Contains("layer_norm_modulate: eps must be positive, got 0"));
  CHECK_THROWS_WITH(gated_residual(x, at::zeros({2, 8}), at::zeros({2, 5, 7})),
                    Catch::Contains("gated_residual: y must have the shape of x, [2, 5, 8], got [2, 5, 7]"));
  CHECK_THROWS_WITH(gated_residual(x, at::zeros({5, 8}), at::zeros({2, 5, 8})),
                    Catch::Contains("gated_residual: gate must be [batch, channels] = [2, 8] for x of [2, 5, 8], "
                                    "got [5, 8]"));
  CHECK_THROWS_WITH(gated_residual(x, at::zeros({2, 8}).to(at::kLong), at::zeros({2, 5, 8})),
                    Catch::Contains("gated_residual: x, gate and y must be floating point, got Float, Long and Float"));
}

// Tolerances relative to the largest value of each tensor: float32 1e-5, float64 1e-12, bfloat16 2^-7 and
// float16 2^-10 (one unit in the last place at the top of the range). The statistics and the sums over tokens
// run in another order on the GPU.
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

TEST_CASE("the token ops' CUDA kernels match the CPU implementation, forward and backward", "[kernels][cuda]") {
  SKIP_WITHOUT_CUDA("the token ops' CUDA kernels against the CPU implementation");
  at::manual_seed(4);
  const c10::Device cpu(c10::kCPU), cuda(c10::kCUDA, 0);
  std::vector<Dtypes> dtypes = kDtypes;
  dtypes.push_back({at::kFloat, at::kHalf});
  std::vector<Shape> shapes = kShapes;
  shapes.push_back({3, 64, 1152});  // DiT-XL's width
  shapes.push_back({2, 0, 16});     // no tokens: an empty result, no launch
  for (const auto& op : kOps) {
    for (const auto& d : dtypes) {
      for (const auto& s : shapes) {
        const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, at::kDouble);
        for (const bool strided : {false, true}) {
          const auto in = make_inputs(op, s, d, strided);
          const auto what = describe(op, s, d, strided ? "strided" : "contiguous");
          const auto on_cuda = forward_backward(op.fused, in, grad_out, cuda);
          const auto on_cpu = forward_backward(op.fused, in, grad_out, cpu);
          check_close(on_cuda.out, on_cpu.out, tolerance_of(on_cpu.out.scalar_type()), what + ": output");
          for (std::size_t i = 0; i < in.leaves.size(); ++i) {
            check_close(on_cuda.grads[i], on_cpu.grads[i], tolerance_of(on_cpu.grads[i].scalar_type()),
                        what + ": gradient of leaf " + std::to_string(i));
          }
        }
      }
    }
  }
}

TEST_CASE("the token ops' CUDA kernels read misaligned x and parameters strided along the channels",
          "[kernels][cuda]") {
  SKIP_WITHOUT_CUDA("the token ops' CUDA kernels on misaligned and strided inputs");
  at::manual_seed(5);
  const c10::Device cuda(c10::kCUDA, 0);
  const Shape s{3, 7, 64};
  for (const auto dtype : {at::kFloat, at::kBFloat16}) {
    // Contiguous, but one element past a 16-byte boundary.
    const auto storage = at::randn({s.batch * s.tokens * s.channels + 1}).to(dtype);
    const auto x = storage.narrow(0, 1, s.batch * s.tokens * s.channels).view({s.batch, s.tokens, s.channels});
    // [channels, batch] transposed: channel stride `batch`.
    const auto a = at::randn({s.channels, s.batch}).to(dtype).t();
    const auto b = at::randn({s.channels, s.batch}).to(dtype).t();
    const auto what = std::string("misaligned x, ") + c10::toString(dtype);
    check_close(runner::ops::layer_norm_modulate(x.to(cuda), a.to(cuda), b.to(cuda), kEps),
                runner::ops::layer_norm_modulate(x, a, b, kEps), tolerance_of(dtype), "layer_norm_modulate, " + what);
    check_close(runner::ops::gated_residual(x.to(cuda), a.to(cuda), x.to(cuda)), runner::ops::gated_residual(x, a, x),
                tolerance_of(dtype), "gated_residual, " + what);
  }
}

TEST_CASE("the token ops' CUDA kernels run on the current stream: they capture in a CUDA graph and replay",
          "[kernels][cuda]") {
  SKIP_WITHOUT_CUDA("capturing the token ops in a CUDA graph");
#if RUNNER_WITH_CUDA
  at::manual_seed(6);
  const c10::Device cuda(c10::kCUDA, 0);
  const Shape s{4, 16, 384};
  const auto options = at::TensorOptions().device(cuda);
  const auto x = at::randn({s.batch, s.tokens, s.channels}, options).requires_grad_(true);
  const auto shift = at::randn({s.batch, s.channels}, options).requires_grad_(true);
  const auto scale = at::randn({s.batch, s.channels}, options).requires_grad_(true);
  const auto grad_out = at::randn({s.batch, s.tokens, s.channels}, options);
  const auto step = [&] {
    for (const auto& leaf : {x, shift, scale}) leaf.mutable_grad() = at::Tensor();
    const auto normalized = runner::ops::layer_norm_modulate(x, shift, scale, kEps);
    const auto out = runner::ops::gated_residual(x, scale, normalized);
    out.backward(grad_out);
    return out.detach();
  };
  c10::cuda::CUDAStream side = c10::cuda::getStreamFromPool();
  at::cuda::CUDAGraph graph;
  at::Tensor out;
  c10::cuda::device_synchronize();  // the inputs are written before the side stream reads them
  {
    c10::cuda::CUDAStreamGuard guard(side);
    step();  // warm-up outside the capture
    runner::testing::capture_into(graph, [&] { out = step(); });
  }
  // New inputs in the captured addresses: a replay computes from them.
  {
    const c10::NoGradGuard no_grad;
    x.copy_(at::randn_like(x));
    shift.copy_(at::randn_like(shift));
    scale.copy_(at::randn_like(scale));
  }
  graph.replay();
  c10::cuda::device_synchronize();
  Leaves on_cpu;
  for (const auto& leaf : {x, shift, scale}) on_cpu.push_back(leaf.detach().cpu().requires_grad_(true));
  const auto expected = runner::ops::gated_residual(
      on_cpu[0], on_cpu[2], runner::ops::layer_norm_modulate(on_cpu[0], on_cpu[1], on_cpu[2], kEps));
  expected.backward(grad_out.cpu());
  check_close(out, expected.detach(), tolerance_of(at::kFloat), "replayed output");
  check_close(x.grad(), on_cpu[0].grad(), tolerance_of(at::kFloat), "replayed x gradient");
  check_close(shift.grad(), on_cpu[1].grad(), tolerance_of(at::kFloat), "replayed shift gradient");
#else
  FAIL("a CUDA device is present but this test was compiled without RUNNER_WITH_CUDA");
#endif
}
