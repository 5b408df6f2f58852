// Linear layers applied as PyTorch's Python nn.Linear applies them, and runner's Linear whose matmul precision a
// trainer may lower (amp = "fp8").
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

namespace runner::nn {

// How a runner Linear multiplies: as autocast says (the default), or in FP8 (fp8_linear.h).
enum class MatmulPrecision { autocast, fp8 };

// torch::nn::Linear with the same parameters and state dict, whose matmul precision set_matmul_precision may
// change. Models build the layers that may run in FP8 with it (the DiT blocks' attention and MLP layers); the
// embeddings, the adaLN projections and the final layer stay torch::nn::Linear.
class LinearImpl : public torch::nn::LinearImpl {
 public:
  using torch::nn::LinearImpl::LinearImpl;
  MatmulPrecision precision = MatmulPrecision::autocast;
};
TORCH_MODULE(Linear);

// y = x W^T + b through at::linear, as Python's nn.Linear: for a contiguous input of any rank one GEMM with the bias
// in its epilogue. torch::nn::Linear's own forward (the C++ frontend's functional::linear) multiplies, then adds the
// bias in a kernel of its own (and reduces it in another in backward) for inputs of more than two dimensions. A
// runner Linear set to FP8 runs fp8_linear instead.
at::Tensor linear_forward(const torch::nn::LinearImpl& layer, const at::Tensor& x);

// Sets the precision of every runner Linear in `model` (itself included) whose sizes fit it (FP8: multiples of 16);
// returns how many were set.
std::int64_t set_matmul_precision(torch::nn::Module& model, MatmulPrecision precision);

}  // namespace runner::nn
