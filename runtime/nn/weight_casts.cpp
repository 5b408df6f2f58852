// WeightCasts: the per-step copies, their scope on the thread, and the cast that routes gradients back.
#include "runtime/nn/weight_casts.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/custom_function.h>

namespace runner::nn {
namespace {

thread_local const WeightCasts* open_casts = nullptr;

// Forward: the precomputed copy (a view, no kernel). Backward: the gradient in the weight's dtype, which is
// what autograd does for autocast's cast (ToCopyBackward).
class PrecomputedCast : public torch::autograd::Function<PrecomputedCast> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& weight, const at::Tensor& copy) {
    ctx->saved_data["dtype"] = static_cast<std::int64_t>(weight.scalar_type());
    return copy.alias();
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto dtype = static_cast<c10::ScalarType>(ctx->saved_data["dtype"].toInt());
    return {grads[0].defined() ? grads[0].to(dtype) : at::Tensor(), at::Tensor()};
  }
};

}  // namespace

WeightCasts::WeightCasts(const std::vector<at::Tensor>& weights, c10::ScalarType dtype) {
  for (const auto& weight : weights) {
    if (!weight.defined() || weight.scalar_type() != at::kFloat) continue;
    index_.emplace(weight.unsafeGetTensorImpl(), weights_.size());
    weights_.push_back(weight);
    copies_.push_back(at::empty_like(weight, weight.options().dtype(dtype)));
  }
}

void WeightCasts::refresh() {
  if (weights_.empty()) return;
  const at::NoGradGuard no_grad;
  at::_foreach_copy_(copies_, weights_);
}

std::optional<at::Tensor> WeightCasts::cast_of(const at::Tensor& weight) const {
  const auto found = index_.find(weight.unsafeGetTensorImpl());
  if (found == index_.end()) return std::nullopt;
  return PrecomputedCast::apply(weight, copies_[found->second]);
}

WeightCastScope::WeightCastScope(const WeightCasts& casts) : previous_(open_casts) { open_casts = &casts; }

WeightCastScope::~WeightCastScope() { open_casts = previous_; }

at::Tensor weight_for_matmul(const at::Tensor& weight) {
  if (open_casts == nullptr || !weight.defined() || !at::autocast::is_autocast_enabled(weight.device().type())) {
    return weight;
  }
  return open_casts->cast_of(weight).value_or(weight);
}

}  // namespace runner::nn
