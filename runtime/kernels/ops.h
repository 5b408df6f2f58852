// runner's own operators (runtime/kernels): plain functions over tensors; each is a dispatcher op with a CPU
// implementation in ATen ops, a CUDA kernel where LibTorch has CUDA, and a backward, beside the unfused ATen
// composition it replaces.
#pragma once

#include <ATen/core/Tensor.h>

namespace runner::ops {

// LayerNorm over the channels without affine parameters, then the adaLN modulation:
// modulate(layer_norm(x, eps), shift, scale), in one pass over x. The backward keeps x and the per-token mean and
// reciprocal standard deviation (as PyTorch's layer_norm does), not the normalized x. On the CPU it is
// native_layer_norm and the modulation's ATen ops, so the numbers are theirs exactly.
at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps);
// The unfused composition it replaces, as the official DiT writes it: at::layer_norm(x) * (1 + scale) + shift, with
// shift and scale broadcast over the tokens, differentiated by autograd. The reference the op is tested against and
// the DiT's path without fused ops; on the CPU its forward is the op's.
at::Tensor layer_norm_modulate_unfused(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                       double eps);

// The DiT's gated residual, x + gate * y, with x and y [batch, tokens, channels] and gate [batch, channels]
// broadcast over the tokens; the result has the dtype of those ATen ops. On the CPU it is those ops.
at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);
// The unfused composition, x + gate.unsqueeze(1) * y in ATen ops differentiated by autograd: the reference the op is
// tested against, its CPU implementation and the DiT's path without fused ops.
at::Tensor gated_residual_unfused(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y);

}  // namespace runner::ops
