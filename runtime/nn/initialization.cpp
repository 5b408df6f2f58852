// Weight initialisers shared by the built-in networks.
#include "runtime/nn/initialization.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

namespace runner::nn {

void xavier_uniform_with_zero_bias(at::Tensor& weight, at::Tensor& bias) {
  at::NoGradGuard no_grad;
  torch::nn::init::xavier_uniform_(weight);
  if (bias.defined()) bias.zero_();
}

void zero_(at::Tensor& weight, at::Tensor& bias) {
  at::NoGradGuard no_grad;
  weight.zero_();
  if (bias.defined()) bias.zero_();
}

void normal_(at::Tensor& weight, double std) {
  at::NoGradGuard no_grad;
  weight.normal_(0.0, std);
}

}  // namespace runner::nn
