// Internal to runtime/kernels: the CUDA launcher of runner::modulate (modulate.cu), registered in modulate.cpp.
#pragma once

#include <ATen/core/Tensor.h>

namespace runner::kernels {

// Whether modulate.cu has a kernel for these dtypes: x float32 with parameters float32, bfloat16 or float16;
// x and parameters all bfloat16, all float16 or all float64. Other combinations run the ATen ops on the device.
bool modulate_cuda_supports(at::ScalarType x, at::ScalarType shift, at::ScalarType scale);

// x * (1 + scale) + shift in one pass over x on the current stream, rounded as the ATen ops round it. The
// inputs are checked and on one CUDA device, their dtypes supported; x may be any layout, the result is contiguous.
at::Tensor modulate_cuda(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale);

}  // namespace runner::kernels
