// Internal to runtime/kernels: the dtype combinations the CUDA kernels of the token ops are compiled for.
#pragma once

#include <c10/core/ScalarType.h>

namespace runner::kernels {

// Tokens float32 with per-sample parameters float32, bfloat16 or float16 (autocast: the residual stream in
// float32, the adaLN projection in half precision); or tokens and parameters all bfloat16, all float16 or all
// float64. Other combinations run the ATen ops on the device.
inline bool cuda_kernel_supports(c10::ScalarType tokens, c10::ScalarType parameters) {
  if (tokens == c10::kFloat) {
    return parameters == c10::kFloat || parameters == c10::kBFloat16 || parameters == c10::kHalf;
  }
  return tokens == parameters && (tokens == c10::kBFloat16 || tokens == c10::kHalf || tokens == c10::kDouble);
}

}  // namespace runner::kernels
