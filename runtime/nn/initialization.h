// Weight initialisers shared by the built-in networks (applied without recording autograd history).
#pragma once

#include <ATen/core/Tensor.h>

namespace runner::nn {

// Xavier-uniform weight (fan-average; for a conv, fans include the kernel area), bias zero (if defined).
void xavier_uniform_with_zero_bias(at::Tensor& weight, at::Tensor& bias);
// Weight and bias (if defined) zero.
void zero_(at::Tensor& weight, at::Tensor& bias);
void normal_(at::Tensor& weight, double std);

}  // namespace runner::nn
