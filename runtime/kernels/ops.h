// runner's own operators (runtime/kernels): plain functions over tensors; each is a dispatcher op with a CPU
// implementation in ATen ops, a CUDA kernel where LibTorch has CUDA, and a backward.
#pragma once

#include <ATen/core/Tensor.h>

namespace runner::ops {

// The DiT's adaLN modulation, x * (1 + scale) + shift, with x [batch, tokens, channels] and shift, scale
// [batch, channels] broadcast over the tokens. The result has the dtype of those ATen ops (x's, when the
// parameters are as precise or less); on the CPU it is those ops, so the numbers are theirs exactly.
at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

}  // namespace runner::ops
