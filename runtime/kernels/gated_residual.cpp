// runner::gated_residual: the schemas of the op and its backward, their CPU implementations (the ATen ops, also
// the CUDA kernels' reference and the path of second derivatives), the autograd function, the CUDA registration
// and the function models call.
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
#include "runtime/kernels/gated_residual_cuda.h"
#endif

namespace runner::kernels {
namespace {

using Pair = std::tuple<at::Tensor, at::Tensor>;
using ForwardSignature = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&);
using BackwardSignature = Pair(const at::Tensor&, const at::Tensor&, const at::Tensor&, std::array<bool, 2>);

constexpr const char* kOp = "gated_residual";

void check_inputs(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  check_token_tensor(kOp, {"x", x});
  check_per_sample(kOp, {"gate", gate}, {"x", x});
  check_same_shape(kOp, {"y", y}, {"x", x});
  check_floating_on_one_device(kOp, {{"x", x}, {"gate", gate}, {"y", y}});
}

// The gradients of gate and y in the ATen ops' graph, by the same ops: the sum's gradient reaches the product in
// the product's dtype, then the product's backward. x's gradient is the output's gradient itself.
Pair backward_aten(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& y, std::array<bool, 2> mask) {
  const auto grad_product = grad.to(at::promote_types(gate.scalar_type(), y.scalar_type()));
  at::Tensor grad_gate, grad_y;
  const std::array<std::int64_t, 3> per_sample{y.size(0), 1, y.size(2)};
  if (mask[0]) grad_gate = at::sum_to(grad_product * y, per_sample).squeeze(1);
  if (mask[1]) grad_y = grad_product * gate.unsqueeze(1);
  return {grad_gate, grad_y};
}

at::Tensor forward_cpu(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  check_inputs(x, gate, y);
  return ops::gated_residual_unfused(x, gate, y);
}

#if RUNNER_WITH_CUDA
bool kernel_runs(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return gate.scalar_type() == y.scalar_type() && cuda_kernel_supports(x.scalar_type(), y.scalar_type());
}

at::Tensor forward_on_cuda(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  check_inputs(x, gate, y);
  if (!kernel_runs(x, gate, y)) return ops::gated_residual_unfused(x, gate, y);
  return gated_residual_cuda(x, gate, y);
}

Pair backward_on_cuda(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& y, std::array<bool, 2> mask) {
  if (!kernel_runs(grad, gate, y)) return backward_aten(grad, gate, y, mask);
  return gated_residual_backward_cuda(grad, gate, y, mask);
}
#endif

const c10::TypedOperatorHandle<ForwardSignature>& forward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("runner::gated_residual", "").typed<ForwardSignature>();
  return op;
}

const c10::TypedOperatorHandle<BackwardSignature>& backward_op() {
  static const auto op =
      c10::Dispatcher::singleton().findSchemaOrThrow("runner::gated_residual_backward", "").typed<BackwardSignature>();
  return op;
}

// Keeps gate and y (the ATen ops' graph keeps each when the other needs its gradient, which in training is
// always); x is not needed.
class GatedResidualFunction : public torch::autograd::Function<GatedResidualFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, const at::Tensor& gate,
                            const at::Tensor& y) {
    ctx->save_for_backward({gate, y});
    const at::AutoDispatchBelowADInplaceOrView below_autograd;
    return forward_op().call(x, gate, y);
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const std::array<bool, 2> mask{ctx->needs_input_grad(1), ctx->needs_input_grad(2)};
    at::Tensor grad_gate, grad_y;
    if (mask[0] || mask[1]) {
      const auto& gate = saved[0];
      const auto& y = saved[1];
      // create_graph: the ATen ops, whose own backward gives the second derivatives.
      std::tie(grad_gate, grad_y) = at::GradMode::is_enabled() ? backward_aten(grads[0], gate, y, mask)
                                                               : backward_op().call(grads[0], gate, y, mask);
    }
    return {ctx->needs_input_grad(0) ? grads[0] : at::Tensor(), grad_gate, grad_y};
  }
};

at::Tensor autograd_kernel(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return GatedResidualFunction::apply(x, gate, y);
}

}  // namespace
}  // namespace runner::kernels

TORCH_LIBRARY_FRAGMENT(runner, m) {
  m.def("gated_residual(Tensor x, Tensor gate, Tensor y) -> Tensor");
  m.def("gated_residual_backward(Tensor grad_out, Tensor gate, Tensor y, bool[2] output_mask) -> (Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(runner, CPU, m) {
  m.impl("gated_residual", TORCH_FN(runner::kernels::forward_cpu));
  m.impl("gated_residual_backward", TORCH_FN(runner::kernels::backward_aten));
}

TORCH_LIBRARY_IMPL(runner, Autograd, m) { m.impl("gated_residual", TORCH_FN(runner::kernels::autograd_kernel)); }

#if RUNNER_WITH_CUDA
TORCH_LIBRARY_IMPL(runner, CUDA, m) {
  m.impl("gated_residual", TORCH_FN(runner::kernels::forward_on_cuda));
  m.impl("gated_residual_backward", TORCH_FN(runner::kernels::backward_on_cuda));
}
#endif

namespace runner::ops {

at::Tensor gated_residual(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return kernels::forward_op().call(x, gate, y);
}

at::Tensor gated_residual_unfused(const at::Tensor& x, const at::Tensor& gate, const at::Tensor& y) {
  return x + gate.unsqueeze(1) * y;
}

}  // namespace runner::ops
