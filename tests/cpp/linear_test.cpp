// Linear layers run as Python's nn.Linear runs them: one addmm per layer for inputs of any rank (the bias in the
// GEMM), in the DiT's blocks too, and their gradients are one mm each plus a bias reduction folded into addmm's.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>

#include <map>
#include <string>

#include "runtime/nn/dit.h"
#include "runtime/nn/linear.h"
#include "tests/cpp/operator_counts.h"
#include "tests/cpp/small_dit.h"

using runner::testing::operators_called;

namespace {

// How many times `name` ran (0 when it did not).
int calls(const std::map<std::string, int>& ops, const std::string& name) {
  const auto found = ops.find(name);
  return found == ops.end() ? 0 : found->second;
}

}  // namespace

TEST_CASE("a linear layer on a 3-D input is one addmm, with nn.Linear's numbers", "[nn]") {
  at::manual_seed(0);
  torch::nn::Linear layer(8, 5);
  const at::Tensor x = at::randn({3, 7, 8});
  at::Tensor y;
  const auto ops = operators_called([&] { y = runner::nn::linear_forward(*layer, x); });
  CHECK(calls(ops, "aten::addmm") == 1);
  CHECK(calls(ops, "aten::mm") == 0);
  CHECK(calls(ops, "aten::matmul") == 0);
  CHECK(calls(ops, "aten::add") + calls(ops, "aten::add_") == 0);
  CHECK(y.sizes() == at::IntArrayRef({3, 7, 5}));
  CHECK(at::allclose(y, layer->forward(x), 1e-6, 1e-6));
}

TEST_CASE("a linear layer's gradients are one mm each and a bias sum", "[nn]") {
  at::manual_seed(0);
  torch::nn::Linear layer(8, 5);
  const at::Tensor x = at::randn({3, 7, 8}).requires_grad_(true);
  const at::Tensor y = runner::nn::linear_forward(*layer, x);
  const at::Tensor grad = at::randn_like(y);
  const auto ops = operators_called([&] { y.backward(grad); });
  // The input's gradient grad @ W and the weight's grad^T @ x: two mm; the bias's: one sum over the rows.
  CHECK(calls(ops, "aten::mm") == 2);
  CHECK(calls(ops, "aten::addmm") == 0);
  CHECK(calls(ops, "aten::matmul") == 0);
  CHECK(calls(ops, "aten::sum") == 1);
  const auto flat_grad = grad.reshape({-1, 5});
  CHECK(at::allclose(x.grad(), grad.matmul(layer->weight.detach()), 1e-5, 1e-6));
  CHECK(at::allclose(layer->weight.grad(), flat_grad.t().mm(x.detach().reshape({-1, 8})), 1e-5, 1e-6));
  CHECK(at::allclose(layer->bias.grad(), flat_grad.sum(0), 1e-5, 1e-6));
}

TEST_CASE("the DiT's linear layers are one addmm each", "[nn]") {
  runner::nn::DiT dit(runner::testing::small_dit_options());
  const at::Tensor x = at::randn({2, 4, 8, 8});
  const at::Tensor t = at::tensor({1, 500}, at::kLong);
  const at::Tensor labels = at::tensor({0, 2}, at::kLong);
  const auto ops = operators_called([&] { dit->forward(x, t, labels); });
  // Per block: adaLN modulation, qkv, proj, fc1, fc2; then the timestep MLP's two layers and the final layer's
  // modulation and projection.
  CHECK(calls(ops, "aten::addmm") == 2 * 5 + 2 + 2);
  CHECK(calls(ops, "aten::mm") == 0);
  CHECK(calls(ops, "aten::matmul") == 0);
}
