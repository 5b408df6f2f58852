// The model as both families' losses and samplers call it (a built-in nn::Denoiser or a Lua-defined model), and
// what its output's channels say.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <optional>

namespace runner::diffusion {

// The model as the losses and samplers call it (a built-in nn::Denoiser or a Lua-defined model): x [B, C, ...],
// t [B] (integer timesteps in Gaussian diffusion, times in [0, 1] in flow matching), optional class labels [B].
// It returns C channels, or 2C when it also predicts the variance (learned sigma).
using ModelFunction =
    std::function<at::Tensor(const at::Tensor& x, const at::Tensor& t, const std::optional<at::Tensor>& labels)>;

// Whether a model output for input x carries learned-variance channels: true for 2C channels, false
// for C. Throws std::invalid_argument naming both shapes when the output is anything else.
bool learns_sigma(const at::Tensor& output, const at::Tensor& x);

}  // namespace runner::diffusion
