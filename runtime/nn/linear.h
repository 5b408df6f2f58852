// Linear layers applied as PyTorch's Python nn.Linear applies them.
#pragma once

#include <ATen/ops/linear.h>
#include <torch/nn/modules/linear.h>

namespace runner::nn {

// y = x W^T + b through at::linear, as Python's nn.Linear: for a contiguous input of any rank one GEMM with the bias
// in its epilogue. torch::nn::Linear's own forward (the C++ frontend's functional::linear) multiplies, then adds the
// bias in a kernel of its own (and reduces it in another in backward) for inputs of more than two dimensions.
inline at::Tensor linear_forward(const torch::nn::LinearImpl& layer, const at::Tensor& x) {
  return at::linear(x, layer.weight, layer.bias);
}

}  // namespace runner::nn
