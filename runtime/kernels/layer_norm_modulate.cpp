// runner::layer_norm_modulate: the schemas of the op and its backward, their CPU implementations (the ATen ops,
// also the CUDA kernels' reference and the path of second derivatives), the autograd function, the CUDA
// registration and the function models call.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cstdint>
#include <tuple>

#include "runtime/kernels/input_checks.h"
#include "runtime/kernels/kernel_dtypes.h"
#include "runtime/kernels/ops.h"
#if RUNNER_WITH_CUDA
#include "runtime/kernels/layer_norm_modulate_cuda.h"
#endif

namespace runner::kernels {
namespace {

using Triple = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using ForwardSignature = Triple(const at::Tensor&, const at::Tensor&, const at::Tensor&, double);
using BackwardSignature = Triple(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                                 const at::Tensor&, double, std::array<bool, 3>);

constexpr const char* kOp = "layer_norm_modulate";

void check_inputs(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  check_token_tensor(kOp, {"x", x});
  check_per_sample(kOp, {"shift", shift}, {"x", x});
  check_per_sample(kOp, {"scale", scale}, {"x", x});
  check_floating_on_one_device(kOp, {{"x", x}, {"shift", shift}, {"scale", scale}});
  TORCH_CHECK(eps > 0, kOp, ": eps must be positive, got ", eps);
}

// The adaLN modulation of the normalized x, shift and scale broadcast over the tokens.
at::Tensor modulate_aten(const at::Tensor& normalized, const at::Tensor& shift, const at::Tensor& scale) {
  return normalized * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

Triple forward_aten(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  auto [normalized, mean, rstd] = at::native_layer_norm(x, {x.size(2)}, {}, {}, eps);
  return {modulate_aten(normalized, shift, scale), mean, rstd};
}

// The gradients of the ATen ops' graph (native_layer_norm, then the modulation), by the same ops: equal bit for
// bit on the CPU, and differentiable. The normalized x is computed again rather than kept from the forward.
Triple backward_aten(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
                     const at::Tensor& scale, double eps, std::array<bool, 3> mask) {
  const std::array<std::int64_t, 3> per_sample{grad.size(0), 1, grad.size(2)};
  at::Tensor grad_x, grad_shift, grad_scale;
  if (mask[0]) {
    const auto grad_normalized = (grad * (1 + scale.unsqueeze(1))).to(x.scalar_type());
    grad_x = std::get<0>(
        at::native_layer_norm_backward(grad_normalized, x, {x.size(2)}, mean, rstd, {}, {}, {true, false, false}));
  }
  if (mask[1]) grad_shift = at::sum_to(grad, per_sample).squeeze(1);
  if (mask[2]) {
    const auto normalized = std::get<0>(at::native_layer_norm(x, {x.size(2)}, {}, {}, eps));
    grad_scale = at::sum_to(grad * normalized, per_sample).squeeze(1);
  }
  return {grad_x, grad_shift, grad_scale};
}

Triple forward_cpu(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  check_inputs(x, shift, scale, eps);
  return forward_aten(x, shift, scale, eps);
}

#if RUNNER_WITH_CUDA
bool kernel_runs(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return shift.scalar_type() == scale.scalar_type() && cuda_kernel_supports(x.scalar_type(), scale.scalar_type());
}

Triple forward_on_cuda(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  check_inputs(x, shift, scale, eps);
  if (!kernel_runs(x, shift, scale)) return forward_aten(x, shift, scale, eps);
  return layer_norm_modulate_cuda(x, shift, scale, eps);
}

Triple backward_on_cuda(const at::Tensor& grad, const at::Tensor& x, const at::Tensor& mean, const at::Tensor& rstd,
                        const at::Tensor& scale, double eps, std::array<bool, 3> mask) {
  // The kernel's statistics are in float (float64 for float64 x); ATen's, from the fallback, may not be.
  if (!kernel_runs(x, scale, scale) || grad.scalar_type() != x.scalar_type() ||
      mean.scalar_type() != (x.scalar_type() == at::kDouble ? at::kDouble : at::kFloat)) {
    return backward_aten(grad, x, mean, rstd, scale, eps, mask);
  }
  return layer_norm_modulate_backward_cuda(grad, x, mean, rstd, scale, mask);
}
#endif

const c10::TypedOperatorHandle<ForwardSignature>& forward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("runner::layer_norm_modulate", "").typed<ForwardSignature>();
  return op;
}

const c10::TypedOperatorHandle<BackwardSignature>& backward_op() {
  static const auto op = c10::Dispatcher::singleton()
                             .findSchemaOrThrow("runner::layer_norm_modulate_backward", "")
                             .typed<BackwardSignature>();
  return op;
}

// Keeps x, the statistics (as PyTorch's layer_norm does) and scale; not the normalized x. The statistics are
// outputs without gradients.
class LayerNormModulateFunction : public torch::autograd::Function<LayerNormModulateFunction> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& shift, const at::Tensor& scale, double eps) {
    Triple result;
    {
      const at::AutoDispatchBelowADInplaceOrView below_autograd;
      result = forward_op().call(x, shift, scale, eps);
    }
    const auto& [out, mean, rstd] = result;
    ctx->save_for_backward({x, mean, rstd, scale});
    ctx->saved_data["eps"] = eps;
    ctx->mark_non_differentiable({mean, rstd});
    ctx->set_materialize_grads(false);  // no zero-filled gradients for the statistics
    return {out, mean, rstd};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    if (!grads[0].defined()) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
    const auto saved = ctx->get_saved_variables();
    const double eps = ctx->saved_data["eps"].toDouble();
    const std::array<bool, 3> mask{ctx->needs_input_grad(0), ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
    // create_graph: the ATen ops, whose own backward gives the second derivatives.
    const auto [grad_x, grad_shift, grad_scale] =
        at::GradMode::is_enabled()
            ? backward_aten(grads[0], saved[0], saved[1], saved[2], saved[3], eps, mask)
            : backward_op().call(grads[0].contiguous(), saved[0], saved[1], saved[2], saved[3], eps, mask);
    return {grad_x, grad_shift, grad_scale, at::Tensor()};
  }
};

Triple autograd_kernel(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  auto outputs = LayerNormModulateFunction::apply(x, shift, scale, eps);
  return {outputs[0], outputs[1], outputs[2]};
}

}  // namespace
}  // namespace runner::kernels

TORCH_LIBRARY_FRAGMENT(runner, m) {
  m.def("layer_norm_modulate(Tensor x, Tensor shift, Tensor scale, float eps) -> (Tensor, Tensor, Tensor)");
  m.def(
      "layer_norm_modulate_backward(Tensor grad_out, Tensor x, Tensor mean, Tensor rstd, Tensor scale, float eps, "
      "bool[3] output_mask) -> (Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(runner, CPU, m) {
  m.impl("layer_norm_modulate", TORCH_FN(runner::kernels::forward_cpu));
  m.impl("layer_norm_modulate_backward", TORCH_FN(runner::kernels::backward_aten));
}

TORCH_LIBRARY_IMPL(runner, Autograd, m) { m.impl("layer_norm_modulate", TORCH_FN(runner::kernels::autograd_kernel)); }

#if RUNNER_WITH_CUDA
TORCH_LIBRARY_IMPL(runner, CUDA, m) {
  m.impl("layer_norm_modulate", TORCH_FN(runner::kernels::forward_on_cuda));
  m.impl("layer_norm_modulate_backward", TORCH_FN(runner::kernels::backward_on_cuda));
}
#endif

namespace runner::ops {

at::Tensor layer_norm_modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale, double eps) {
  return std::get<0>(kernels::forward_op().call(x, shift, scale, eps));
}

at::Tensor layer_norm_modulate_unfused(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale,
                                       double eps) {
  return kernels::modulate_aten(at::layer_norm(x, {x.size(-1)}, {}, {}, eps), shift, scale);
}

}  // namespace runner::ops
