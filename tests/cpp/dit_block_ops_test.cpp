// The fused DiT block against the unfused one on the CPU: the same numbers, and the dispatcher ops of one block's
// forward and backward counted and pinned, so that an op added to the block later fails here, without a GPU.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <torch/nn/utils/convert_parameters.h>

#include <map>
#include <sstream>
#include <string>

#include "runtime/nn/dit.h"
#include "tests/cpp/operator_counts.h"
#include "tests/cpp/small_dit.h"

namespace {

using runner::testing::operators_called;
using runner::testing::outer_operators_called;
using runner::testing::total_calls;

std::string listed(const std::map<std::string, int>& ops) {
  std::ostringstream text;
  for (const auto& [name, calls] : ops) text << name << " " << calls << "\n";
  return text.str();
}

struct BlockRun {
  std::map<std::string, int> ops;
  at::Tensor out, grad_x, grad_c;
  std::vector<at::Tensor> parameter_grads;
};

// One forward and backward of a DiT-S-like block (hidden 64, 4 heads) on fixed inputs, the ops counted.
BlockRun run_block(bool fused) {
  at::manual_seed(11);
  runner::nn::DiTBlock block(64, 4, 4.0, fused);
  {
    // adaLN-Zero starts at zero, which would hide the modulation's and the gates' arithmetic.
    const at::NoGradGuard no_grad;
    block->modulation->weight.normal_(0, 0.05);
    block->modulation->bias.normal_(0, 0.05);
  }
  const auto x = at::randn({2, 16, 64}).requires_grad_(true);
  const auto c = at::silu(at::randn({2, 64})).requires_grad_(true);
  const auto grad = at::randn({2, 16, 64});
  BlockRun run;
  run.ops = outer_operators_called([&] {
    run.out = block->forward(x, c);
    run.out.backward(grad);
  });
  run.out = run.out.detach();
  run.grad_x = x.grad();
  run.grad_c = c.grad();
  for (const auto& p : block->parameters()) run.parameter_grads.push_back(p.grad());
  return run;
}

}  // namespace

TEST_CASE("the fused DiT block gives the unfused block's numbers on the CPU, forward and backward", "[nn]") {
  const auto fused = run_block(true);
  const auto unfused = run_block(false);
  CHECK(at::equal(fused.out, unfused.out));
  CHECK(at::equal(fused.grad_x, unfused.grad_x));
  CHECK(at::equal(fused.grad_c, unfused.grad_c));
  REQUIRE(fused.parameter_grads.size() == unfused.parameter_grads.size());
  for (std::size_t i = 0; i < fused.parameter_grads.size(); ++i) {
    INFO("parameter " << i);
    CHECK(at::equal(fused.parameter_grads[i], unfused.parameter_grads[i]));
  }
}

TEST_CASE("one DiT block's forward and backward call a pinned number of dispatcher ops", "[nn]") {
  // The ops the block's code and autograd's backward formulas call (outer_operators_called: on a GPU each is a
  // kernel or a view), counted with LibTorch 2.11. A change to the block that adds an op changes these numbers:
  // justify it, then pin the new count. The fused block's runner ops replace the unfused chains: layer_norm with
  // the modulation's unsqueeze, mul and adds, and the gates' unsqueeze, mul and add, with their backward's muls,
  // sums, squeezes and adds. PyTorch eager runs the official block with the unfused block's ops.
  const auto fused = run_block(true);
  const auto unfused = run_block(false);
  INFO("fused block:\n" << listed(fused.ops) << "unfused block:\n" << listed(unfused.ops));
  CHECK(fused.ops.at("runner::layer_norm_modulate") == 2);
  CHECK(fused.ops.at("runner::layer_norm_modulate_backward") == 2);
  CHECK(fused.ops.at("runner::gated_residual") == 2);
  CHECK(fused.ops.at("runner::gated_residual_backward") == 2);
  for (const char* gone : {"aten::layer_norm", "aten::native_layer_norm_backward", "aten::mul", "aten::unsqueeze",
                           "aten::squeeze", "aten::zeros"}) {
    INFO(gone);
    CHECK(fused.ops.count(gone) == 0);
  }
  // The one add left sums x's two gradients (through the residual and through the layer norm).
  CHECK(fused.ops.at("aten::add") == 1);
  CHECK(total_calls(fused.ops) == 91);
  CHECK(total_calls(unfused.ops) == 123);
}

TEST_CASE("a fused DiT takes every block's adaLN projection in one GEMM, with the unfused numbers", "[nn]") {
  runner::nn::DiTOptions options = runner::testing::small_dit_options(3);
  at::manual_seed(12);
  runner::nn::DiT unfused(options);
  options.fused = true;
  runner::nn::DiT fused(options);
  {
    const at::NoGradGuard no_grad;
    for (auto& p : unfused->parameters()) p.normal_(0, 0.05);
    const auto source = unfused->named_parameters();
    for (auto& p : fused->named_parameters()) p.value().copy_(source[p.key()]);
  }
  const at::Tensor x = at::randn({2, 4, 8, 8});
  const at::Tensor t = at::tensor({1, 500}, at::kLong);
  const at::Tensor labels = at::tensor({0, 2}, at::kLong);
  at::Tensor fused_out;
  const auto ops = operators_called([&] { fused_out = fused->forward(x, t, labels); });
  // Per block: qkv, proj, fc1, fc2; the timestep MLP's two layers; every adaLN projection at once; the final
  // projection.
  CHECK(ops.at("aten::addmm") == 4 * 3 + 2 + 1 + 1);
  const auto unfused_out = unfused->forward(x, t, labels);
  CHECK(at::allclose(fused_out, unfused_out, 1e-5, 1e-6));
  fused_out.square().mean().backward();
  unfused_out.square().mean().backward();
  const auto reference = unfused->named_parameters();
  for (const auto& p : fused->named_parameters()) {
    if (!p.value().requires_grad()) continue;
    INFO(p.key());
    CHECK(at::allclose(p.value().grad(), reference[p.key()].grad(), 1e-4, 1e-6));
  }
}
