// runner::modulate: the schema, the CPU implementation (the ATen ops, which are also the CUDA kernel's
// reference), the backward, the CUDA registration and the function models call.
#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/library.h>

#include <array>
#include <cstdint>

#include "runtime/kernels/ops.h"
#if RUNNER_WITH_CUDA
#include "runtime/kernels/modulate_cuda.h"
#endif

namespace runner::kernels {
namespace {

using ModulateSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);

void check_inputs(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  TORCH_CHECK(x.dim() == 3, "modulate: x must be [batch, tokens, channels], got ", x.sizes());
  const std::array<std::int64_t, 2> per_sample{x.size(0), x.size(2)};
  TORCH_CHECK(shift.sizes() == per_sample, "modulate: shift must be [batch, channels] = ", at::IntArrayRef(per_sample),
              " for x of ", x.sizes(), ", got ", shift.sizes());
  TORCH_CHECK(scale.sizes() == per_sample, "modulate: scale must be [batch, channels] = ", at::IntArrayRef(per_sample),
              " for x of ", x.sizes(), ", got ", scale.sizes());
  TORCH_CHECK(x.is_floating_point() && shift.is_floating_point() && scale.is_floating_point(),
              "modulate: x, shift and scale must be floating point, got ", x.scalar_type(), ", ", shift.scalar_type(),
              " and ", scale.scalar_type());
  TORCH_CHECK(shift.device() == x.device() && scale.device() == x.device(),
              "modulate: x, shift and scale must be on one device, got ", x.device(), ", ", shift.device(), " and ",
              scale.device());
}

at::Tensor modulate_aten(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1);
}

at::Tensor modulate_cpu(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  check_inputs(x, shift, scale);
  return modulate_aten(x, shift, scale);
}

#if RUNNER_WITH_CUDA
at::Tensor modulate_on_cuda(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  check_inputs(x, shift, scale);
  if (!modulate_cuda_supports(x.scalar_type(), shift.scalar_type(), scale.scalar_type())) {
    return modulate_aten(x, shift, scale);
  }
  return modulate_cuda(x, shift, scale);
}
#endif

const c10::TypedOperatorHandle<ModulateSignature>& modulate_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("runner::modulate", "").typed<ModulateSignature>();
  return op;
}

// The gradients of the ATen ops' graph, computed by the same ops (so on the CPU they are equal bit for bit):
// x: grad * (1 + scale); shift: grad summed over the tokens; scale: grad * x summed over the tokens. The engine
// casts each to its input's dtype, as it does for the ATen ops' graph.
class ModulateFunction : public torch::autograd::Function<ModulateFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& shift,
                            const at::Tensor& scale) {
    // Kept as the ATen ops' graph keeps them: x only for scale's gradient, scale only for x's.
    ctx->save_for_backward({scale.requires_grad() ? x : at::Tensor(), x.requires_grad() ? scale : at::Tensor()});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return modulate_op().call(x, shift, scale);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const auto& scale = saved[1];
    const auto& grad = grads[0];
    const std::array<std::int64_t, 3> per_sample{grad.size(0), 1, grad.size(2)};
    at::Tensor grad_x, grad_shift, grad_scale;
    if (ctx->needs_input_grad(0)) grad_x = grad * (1 + scale.unsqueeze(1));
    if (ctx->needs_input_grad(1)) grad_shift = at::sum_to(grad, per_sample).squeeze(1);
    if (ctx->needs_input_grad(2)) grad_scale = at::sum_to(grad * x, per_sample).squeeze(1);
    return {grad_x, grad_shift, grad_scale};
  }
};

at::Tensor modulate_autograd(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return ModulateFunction::apply(x, shift, scale);
}

}  // namespace
}  // namespace runner::kernels

TORCH_LIBRARY_FRAGMENT(runner, m) { m.def("modulate(Tensor x, Tensor shift, Tensor scale) -> Tensor"); }

TORCH_LIBRARY_IMPL(runner, CPU, m) { m.impl("modulate", TORCH_FN(runner::kernels::modulate_cpu)); }

TORCH_LIBRARY_IMPL(runner, Autograd, m) { m.impl("modulate", TORCH_FN(runner::kernels::modulate_autograd)); }

#if RUNNER_WITH_CUDA
TORCH_LIBRARY_IMPL(runner, CUDA, m) { m.impl("modulate", TORCH_FN(runner::kernels::modulate_on_cuda)); }
#endif

namespace runner::ops {

at::Tensor modulate(const at::Tensor& x, const at::Tensor& shift, const at::Tensor& scale) {
  return kernels::modulate_op().call(x, shift, scale);
}

}  // namespace runner::ops
