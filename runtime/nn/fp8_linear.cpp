// fp8_linear: the tensorwise casts and the autograd function whose forward and backward are three scaled GEMMs.
#include "runtime/nn/fp8_linear.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <optional>
#include <vector>

namespace runner::nn {
namespace {

constexpr double kAmaxFloor = 1e-12;

double float8_max(c10::ScalarType dtype) { return dtype == at::kFloat8_e4m3fn ? 448.0 : 57344.0; }

// at::_scaled_mm takes its second operand column-major: the transpose of a contiguous tensor.
at::Tensor column_major(const at::Tensor& t) { return t.t().contiguous().t(); }

at::Tensor scaled_mm(const Fp8Tensor& a, const Fp8Tensor& b_column_major, const at::Tensor& bias,
                     c10::ScalarType out_dtype, bool fast_accumulation) {
  return at::_scaled_mm(a.data, b_column_major.data, a.inverse_scale, b_column_major.inverse_scale,
                        bias.defined() ? std::optional<at::Tensor>(bias.to(out_dtype)) : std::nullopt, std::nullopt,
                        out_dtype, fast_accumulation);
}

class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  // x2d [rows, in], weight [out, in].
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x2d, const at::Tensor& weight,
                            const at::Tensor& bias) {
    const Fp8Tensor x8 = cast_to_fp8(x2d, at::kFloat8_e4m3fn);
    const Fp8Tensor w8 = cast_to_fp8(weight, at::kFloat8_e4m3fn);
    // x W^T: W^T is the transpose of the contiguous W, column-major as _scaled_mm wants it. torchao's recipe
    // accumulates the forward GEMM fast and the two gradient GEMMs exactly.
    const at::Tensor out = scaled_mm(x8, {w8.data.t(), w8.inverse_scale}, bias, at::kBFloat16, true);
    ctx->save_for_backward({x8.data, x8.inverse_scale, w8.data, w8.inverse_scale});
    ctx->saved_data["has_bias"] = bias.defined();
    ctx->saved_data["weight_dtype"] = static_cast<int64_t>(weight.scalar_type());
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const Fp8Tensor x8{saved[0], saved[1]}, w8{saved[2], saved[3]};
    const Fp8Tensor grad8 = cast_to_fp8(grads[0], at::kFloat8_e5m2);
    at::Tensor grad_x, grad_weight, grad_bias;
    if (ctx->needs_input_grad(0)) {
      // [rows, out] @ [out, in]: W column-major.
      grad_x = scaled_mm(grad8, {column_major(w8.data), w8.inverse_scale}, {}, at::kBFloat16, false);
    }
    if (ctx->needs_input_grad(1)) {
      // [out, rows] @ [rows, in]: grad^T row-major, x column-major.
      grad_weight =
          scaled_mm({grad8.data.t().contiguous(), grad8.inverse_scale}, {column_major(x8.data), x8.inverse_scale}, {},
                    static_cast<c10::ScalarType>(ctx->saved_data["weight_dtype"].toInt()), false);
    }
    if (ctx->needs_input_grad(2) && ctx->saved_data["has_bias"].toBool()) {
      grad_bias = grads[0].sum(0, false, at::kFloat);
    }
    return {grad_x, grad_weight, grad_bias};
  }
};

}  // namespace

Fp8Tensor cast_to_fp8(const at::Tensor& t, c10::ScalarType dtype) {
  const double most = float8_max(dtype);
  const at::Tensor amax = t.abs().amax().to(at::kFloat);
  const at::Tensor scale = most / amax.clamp_min(kAmaxFloor);
  const at::Tensor data = (t.to(at::kFloat) * scale).clamp(-most, most).to(dtype);
  return {data, scale.reciprocal()};
}

bool fp8_linear_fits(std::int64_t in_features, std::int64_t out_features) {
  return in_features % 16 == 0 && out_features % 16 == 0;
}

at::Tensor fp8_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  const auto in = weight.size(1), out = weight.size(0);
  TORCH_CHECK(x.size(-1) == in, "fp8_linear: the input's last dimension is ", x.size(-1), ", the weight takes ", in);
  const at::Tensor x2d = x.reshape({-1, in});
  if (x2d.size(0) % 16 != 0 || !fp8_linear_fits(in, out)) {
    return at::linear(x.to(at::kBFloat16), weight.to(at::kBFloat16),
                      bias.defined() ? bias.to(at::kBFloat16) : at::Tensor());
  }
  std::vector<std::int64_t> sizes(x.sizes().begin(), x.sizes().end());
  sizes.back() = out;
  return Fp8LinearFunction::apply(x2d, weight, bias).view(sizes);
}

}  // namespace runner::nn
