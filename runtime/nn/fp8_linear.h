// FP8 linear layers with dynamic tensorwise scaling, as torchao.float8's tensorwise recipe: e4m3 weights and
// activations, e5m2 gradients, each tensor scaled by float8_max / amax on the device (no host sync, so a step
// still captures as a CUDA graph), the three GEMMs through at::_scaled_mm.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

namespace runner::nn {

// A tensor cast to FP8 and the reciprocal of the scale it was cast with: value ~= data * inverse_scale.
struct Fp8Tensor {
  at::Tensor data;           // float8_e4m3fn or float8_e5m2, the input's shape
  at::Tensor inverse_scale;  // float32 scalar, amax / float8_max
};

// scale = float8_max / max(amax(|t|), 1e-12) in float32; data = clamp(t * scale, -float8_max, float8_max) in
// `dtype`, as torchao's hp_tensor_to_float8_dynamic (saturated cast).
Fp8Tensor cast_to_fp8(const at::Tensor& t, c10::ScalarType dtype);

// Whether a layer of these sizes can run in FP8: at::_scaled_mm needs both multiples of 16.
bool fp8_linear_fits(std::int64_t in_features, std::int64_t out_features);

// y = x W^T + b with the forward GEMM on e4m3 x and W, and in backward grad_x = grad W and grad_W = grad^T x on
// e5m2 grad; output and gradients of x in bfloat16 (the autocast dtype of fp8 training), of W and b in their
// own dtype (float32 master weights). x of any rank [..., in]; rows that are not a multiple of 16 (at::_scaled_mm's
// requirement for grad_W) take the bfloat16 linear instead.
at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias);

}  // namespace runner::nn
