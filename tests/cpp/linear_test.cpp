// Linear layers run as Python's nn.Linear runs them: one addmm per layer for inputs of any rank (the bias in the
// GEMM), in the DiT's blocks too, and their gradients are one mm each plus a bias reduction folded into addmm's.
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/record_function.h>

#include <functional>
#include <map>
#include <string>

#include "runtime/nn/dit.h"
#include "runtime/nn/linear.h"

namespace {

// The operators `work` calls, by name, with their counts (the dispatcher's record-function callbacks).
std::map<std::string, int> operators_called(const std::function<void()>& work) {
  static thread_local std::map<std::string, int>* counts = nullptr;
  std::map<std::string, int> seen;
  counts = &seen;
  const at::CallbackHandle handle = at::addThreadLocalCallback(
      at::RecordFunctionCallback([](const at::RecordFunction& fn) -> std::unique_ptr<at::ObserverContext> {
        if (counts != nullptr) ++(*counts)[fn.name()];
        return nullptr;
      }).scopes({at::RecordScope::FUNCTION}));
  work();
  at::removeCallback(handle);
  counts = nullptr;
  return seen;
}

}  // namespace

TEST_CASE("a linear layer on a 3-D input is one addmm, with nn.Linear's numbers", "[nn]") {
  at::manual_seed(0);
  torch::nn::Linear layer(8, 5);
  const at::Tensor x = at::randn({3, 7, 8});
  at::Tensor y;
  const auto ops = operators_called([&] { y = runner::nn::linear_forward(*layer, x); });
  CHECK(ops.count("aten::addmm") == 1);
  CHECK(ops.count("aten::matmul") == 0);
  CHECK(ops.count("aten::add_") == 0);
  CHECK(y.sizes() == at::IntArrayRef({3, 7, 5}));
  CHECK(at::allclose(y, layer->forward(x), 1e-6, 1e-6));
}

TEST_CASE("the DiT's linear layers are one addmm each", "[nn]") {
  runner::nn::DiTOptions options = runner::nn::dit_preset("DiT-S/2");
  options.depth = 2;
  options.hidden = 64;
  options.heads = 2;
  options.image = 8;
  options.classes = 3;
  runner::nn::DiT dit(options);
  const at::Tensor x = at::randn({2, 4, 8, 8});
  const at::Tensor t = at::tensor({1, 500}, at::kLong);
  const at::Tensor labels = at::tensor({0, 2}, at::kLong);
  const auto ops = operators_called([&] { dit->forward(x, t, labels); });
  // Per block: adaLN modulation, qkv, proj, fc1, fc2; then the timestep MLP's two layers and the final layer's
  // modulation and projection.
  CHECK(ops.count("aten::addmm") == 1);
  CHECK(ops.at("aten::addmm") == 2 * 5 + 2 + 2);
  CHECK(ops.count("aten::matmul") == 0);
}
