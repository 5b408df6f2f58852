// Internal to runtime/kernels: the CUDA launchers of runner::layer_norm_modulate and its backward
// (layer_norm_modulate.cu), registered in layer_norm_modulate.cpp.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <tuple>

namespace runner::kernels {

// One kernel: per token, the mean and reciprocal standard deviation over the channels, then the normalized x
// modulated, rounded as the ATen ops round each step. Returns the output (x's dtype, contiguous) and the
// statistics [batch, tokens, 1] in float (float64 for float64 x), as PyTorch's CUDA layer_norm keeps them.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_modulate_cuda(const at::Tensor& x, const at::Tensor& shift,
                                                                        const at::Tensor& scale, double eps);

// Two kernels, deterministic: one per token for x's gradient (a reduction over the channels), one per sample and
// channel for shift's and scale's (a reduction over the tokens), both recomputing the normalized x from the
// statistics. Gradients not asked for in `mask` (x, shift, scale) are undefined.
std::tuple<at::Tensor, at::Tensor, at::Tensor> layer_norm_modulate_backward_cuda(
    const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
    const at::Tensor& scale, std::array<bool, 3> mask);

}  // namespace runner::kernels
