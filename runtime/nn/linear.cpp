// linear_forward and the matmul precision of runner's Linear layers.
#include "runtime/nn/linear.h"

#include <ATen/ops/linear.h>

#include "runtime/nn/fp8_linear.h"
#include "runtime/nn/weight_casts.h"

namespace runner::nn {

at::Tensor linear_forward(const torch::nn::LinearImpl& layer, const at::Tensor& x) {
  const auto* lowered = dynamic_cast<const LinearImpl*>(&layer);
  if (lowered != nullptr && lowered->precision == MatmulPrecision::fp8) return fp8_linear(x, layer.weight, layer.bias);
  return at::linear(x, weight_for_matmul(layer.weight), weight_for_matmul(layer.bias));
}

std::int64_t set_matmul_precision(torch::nn::Module& model, MatmulPrecision precision) {
  std::int64_t count = 0;
  for (const auto& module : model.modules(/*include_self=*/true)) {
    auto* layer = dynamic_cast<LinearImpl*>(module.get());
    if (layer == nullptr) continue;
    const bool fits = precision != MatmulPrecision::fp8 ||
                      fp8_linear_fits(layer->options.in_features(), layer->options.out_features());
    if (!fits) continue;
    layer->precision = precision;
    ++count;
  }
  return count;
}

}  // namespace runner::nn
