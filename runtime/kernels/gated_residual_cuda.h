// Internal to runtime/kernels: the CUDA launchers of runner::gated_residual and its backward
// (gated_residual.cu), registered in gated_residual.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <tuple>

namespace runner::kernels {

// x + gate * y in one pass, the product rounded to the parameters' dtype and the sum to x's, as the ATen ops
// round them. The result is contiguous, in x's dtype.
at::Tensor gated_residual_cuda(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

// One kernel, deterministic: per sample and channel, y's gradient for every token and gate's as their sum.
// Gradients not asked for in `mask` (gate, y) are undefined.
std::tuple<at::Tensor, at::Tensor> gated_residual_backward_cuda(const at::Tensor& grad, const at::Tensor& gate,
                                                                const at::Tensor& y, std::array<bool, 2> mask);

}  // namespace runner::kernels
