// Internal to runtime/kernels: the shape, dtype and device checks of the ops over a DiT's token tensors, with
// messages that name the op and the input.
#pragma once

#include <ATen/core/Tensor.h>

#include <initializer_list>
#include <string>
#include <utility>

namespace runner::kernels {

using NamedTensor = std::pair<const char*, const at::Tensor&>;

// `tokens` is [batch, tokens, channels].
void check_token_tensor(const char* op, NamedTensor tokens);
// `per_sample` is [batch, channels] of `tokens` (broadcast over its tokens).
void check_per_sample(const char* op, NamedTensor per_sample, NamedTensor tokens);
// `same` has the shape of `tokens`.
void check_same_shape(const char* op, NamedTensor same, NamedTensor tokens);
// All floating point and on one device.
void check_floating_on_one_device(const char* op, std::initializer_list<NamedTensor> inputs);

}  // namespace runner::kernels
