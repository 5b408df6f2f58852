// Optimizers with parameter groups: foreach math as torch.optim's _multi_tensor_* paths, fused kernels on CUDA.
#include "runtime/train/optimizer.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <iterator>
#include <set>
#include <stdexcept>

#include "runtime/core/dtype.h"
#include "runtime/core/enum_table.h"

namespace runner::train {
namespace {

// The parameters of a group that have a grad, split by (device, dtype) as
// torch.optim.Optimizer._group_tensors_by_device_and_dtype does; buckets in order of first appearance.
struct Bucket {
  at::Device device;
  at::ScalarType dtype;
  std::vector<std::size_t> indices;
};

std::vector<Bucket> buckets_with_grad(const std::vector<at::Tensor>& params) {
  std::vector<Bucket> buckets;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const at::Tensor& param = params[i];
    const at::Tensor& grad = param.grad();
    if (!grad.defined()) continue;
    if (grad.is_sparse()) throw std::invalid_argument("optimizer: sparse gradients are not supported");
    if (grad.scalar_type() != param.scalar_type() || grad.device() != param.device()) {
      throw std::invalid_argument(
          fmt::format("optimizer: a gradient of dtype {} on {} for a parameter of dtype {} on {}",
                      core::dtype_name(grad.scalar_type()), grad.device().str(), core::dtype_name(param.scalar_type()),
                      param.device().str()));
    }
    auto found = std::find_if(buckets.begin(), buckets.end(), [&](const Bucket& bucket) {
      return bucket.device == param.device() && bucket.dtype == param.scalar_type();
    });
    if (found == buckets.end()) {
      buckets.push_back(Bucket{param.device(), param.scalar_type(), {}});
      found = std::prev(buckets.end());
    }
    found->indices.push_back(i);
  }
  return buckets;
}

std::vector<at::Scalar> scalars(const std::vector<double>& values) { return {values.begin(), values.end()}; }

}  // namespace

void check_learning_rate(double lr, const std::string& where) {
  if (!(lr >= 0) || std::isinf(lr))
    throw std::invalid_argument(fmt::format("{}: lr must be a finite number >= 0, got {}", where,
                                            std::isnan(lr) ? std::string("nan") : fmt::format("{}", lr)));
  constexpr double kLargest = std::numeric_limits<float>::max();
  if (lr > kLargest)
    throw std::invalid_argument(
        fmt::format("{}: lr {} is more than float32, the dtype the optimizer applies learning rates in, holds (at most "
                    "{:.8g})",
                    where, lr, kLargest));
}

void validate_param_group(OptimizerKind kind, const ParamGroup& group, std::size_t index) {
  const auto fail = [&](const std::string& what) {
    throw std::invalid_argument(fmt::format("optimizer group {}: {}", index + 1, what));
  };
  check_learning_rate(group.lr, fmt::format("optimizer group {}", index + 1));
  if (!(group.weight_decay >= 0)) fail(fmt::format("weight_decay must be >= 0, got {}", group.weight_decay));
  if (kind == OptimizerKind::sgd) {
    if (!(group.momentum >= 0)) fail(fmt::format("momentum must be >= 0, got {}", group.momentum));
    if (!(group.dampening >= 0)) fail(fmt::format("dampening must be >= 0, got {}", group.dampening));
    if (group.nesterov && (group.momentum <= 0 || group.dampening != 0)) {
      fail("nesterov momentum requires a momentum and zero dampening");
    }
    if (group.amsgrad) fail("amsgrad requires Adam or AdamW, not SGD");
  } else {
    if (!(group.beta1 >= 0 && group.beta1 < 1)) fail(fmt::format("beta1 must be in [0, 1), got {}", group.beta1));
    if (!(group.beta2 >= 0 && group.beta2 < 1)) fail(fmt::format("beta2 must be in [0, 1), got {}", group.beta2));
    if (!(group.eps >= 0)) fail(fmt::format("eps must be >= 0, got {}", group.eps));
  }
}

const core::EnumTable<OptimizerKind, 3> kOptimizerKinds{
    {{{OptimizerKind::sgd, "sgd"}, {OptimizerKind::adam, "adam"}, {OptimizerKind::adamw, "adamw"}}},
    core::NameQuotes::none,
    "unknown optimizer '{got}' (expected {list})"};

std::string optimizer_kind_name(OptimizerKind kind) { return kOptimizerKinds.name(kind); }

OptimizerKind parse_optimizer_kind(const std::string& name) { return kOptimizerKinds.parse(name); }

ParamGroup default_param_group(OptimizerKind kind) {
  ParamGroup group;
  if (kind == OptimizerKind::adamw) group.weight_decay = 1e-2;
  return group;
}

Optimizer::Optimizer(OptimizerKind kind, std::vector<ParamGroup> groups, OptimizerImplementation implementation)
    : kind_(kind), implementation_(implementation), groups_(std::move(groups)) {
  std::set<const void*> seen;
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    validate_param_group(kind_, groups_[g], g);
    for (std::size_t p = 0; p < groups_[g].params.size(); ++p) {
      const at::Tensor& param = groups_[g].params[p];
      if (!param.defined())
        throw std::invalid_argument(fmt::format("optimizer group {}: parameter {} is undefined", g + 1, p + 1));
      if (!at::isFloatingType(param.scalar_type())) {
        throw std::invalid_argument(
            fmt::format("optimizer group {}: parameter {} has dtype {}; parameters must be floating point", g + 1,
                        p + 1, core::dtype_name(param.scalar_type())));
      }
      if (!seen.insert(param.unsafeGetTensorImpl()).second) {
        throw std::invalid_argument(
            fmt::format("optimizer group {}: parameter {} appears more than once", g + 1, p + 1));
      }
    }
    state_.emplace_back(groups_[g].params.size());
  }
  lr_tensors_.resize(groups_.size());
}

void Optimizer::replace_params(const std::function<at::Tensor(std::size_t group, std::size_t param)>& replacement) {
  for (const auto& group : state_)
    for (const ParamState& state : group)
      if (state.exp_avg.defined() || state.momentum_buffer.defined() || state.step.defined())
        throw std::logic_error("the optimizer's parameters can only be replaced before its first step");
  std::vector<ParamGroup> groups = groups_;
  for (std::size_t g = 0; g < groups.size(); ++g)
    for (std::size_t p = 0; p < groups[g].params.size(); ++p) {
      at::Tensor next = replacement(g, p);
      const at::Tensor& current = groups[g].params[p];
      if (!next.defined() || next.scalar_type() != current.scalar_type() || next.device() != current.device())
        throw std::invalid_argument(
            fmt::format("optimizer group {}: parameter {}'s replacement must have its dtype and device", g + 1, p + 1));
      groups[g].params[p] = std::move(next);
    }
  groups_ = std::move(groups);
}

bool Optimizer::use_fused(const at::Tensor& param) const {
  switch (implementation_) {
    case OptimizerImplementation::foreach:
      return false;
    case OptimizerImplementation::fused:
      return true;
    case OptimizerImplementation::automatic:
      return param.is_cuda();
  }
  return false;
}

bool Optimizer::capturable() const {
  for (const ParamGroup& group : groups_)
    for (const at::Tensor& param : group.params)
      if (!use_fused(param)) return false;
  return true;
}

void Optimizer::init_state(const at::Tensor& param, bool amsgrad, ParamState& state) const {
  if (kind_ == OptimizerKind::sgd) return;  // momentum buffers are created from the first grad
  // adam.py _init_group: a float32 step on the CPU for foreach, on the parameter's device for fused.
  state.step =
      at::zeros({}, at::TensorOptions().dtype(at::kFloat).device(use_fused(param) ? param.device() : at::kCPU));
  state.step_value = 0;
  state.exp_avg = at::zeros_like(param, at::MemoryFormat::Preserve);
  state.exp_avg_sq = at::zeros_like(param, at::MemoryFormat::Preserve);
  if (amsgrad) state.max_exp_avg_sq = at::zeros_like(param, at::MemoryFormat::Preserve);
}

void Optimizer::step(const at::Tensor& found_inf) {
  at::NoGradGuard no_grad;
  const bool is_capturable = capturable();
  if (found_inf.defined() && !is_capturable && found_inf.item<double>() != 0) return;
  // As GradScaler's found_inf, a float32 scalar (0-dim): the steps (0-dim) are taken back by subtracting it,
  // and an in-place op cannot broadcast them to shape [1] (LossScaler::unscale returns a [1] tensor).
  found_inf_ = found_inf.defined() && is_capturable ? found_inf.to(at::kFloat).reshape({}) : at::Tensor();
  for (std::size_t g = 0; g < groups_.size(); ++g) {
    if (kind_ == OptimizerKind::sgd) {
      step_sgd_group(g, is_capturable);
    } else {
      step_adam_group(g, is_capturable);
    }
  }
  ++step_count_;
}

at::Tensor Optimizer::lr_tensor_on(std::size_t group, const at::Device& device) {
  const at::Tensor& lr = lr_tensor(group);
  if (lr.device() == device && (!device.is_cuda() || lr.scalar_type() == at::kFloat)) return lr.reshape({});
  // adam.py _fused_adam moves a tensor lr to each device's bucket the same way (not asynchronously to the CPU,
  // whose kernels read it at once).
  const at::ScalarType dtype = device.is_cuda() ? at::kFloat : lr.scalar_type();
  return lr.to(lr.options().device(device).dtype(dtype), /*non_blocking=*/!device.is_cpu()).reshape({});
}

// adam.py _multi_tensor_adam (decoupled_weight_decay for AdamW) or _fused_adam, per (device, dtype) bucket.
void Optimizer::step_adam_group(std::size_t g, bool capturable) {
  const ParamGroup& group = groups_[g];
  const bool decoupled = kind_ == OptimizerKind::adamw;
  for (const Bucket& bucket : buckets_with_grad(group.params)) {
    std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps;
    std::vector<ParamState*> states;
    for (std::size_t i : bucket.indices) {
      ParamState& state = state_[g][i];
      if (!state.step.defined()) init_state(group.params[i], group.amsgrad, state);
      params.push_back(group.params[i]);
      grads.push_back(group.params[i].grad());
      exp_avgs.push_back(state.exp_avg);
      exp_avg_sqs.push_back(state.exp_avg_sq);
      if (group.amsgrad) max_exp_avg_sqs.push_back(state.max_exp_avg_sq);  // empty list without amsgrad
      steps.push_back(state.step);
      states.push_back(&state);
    }
    for (ParamState* state : states) state->step_value += 1.0f;

    if (use_fused(params.front())) {
      at::_foreach_add_(steps, 1);
      // adam.py _fused_adam: the kernels leave every tensor unchanged when found_inf is set, and the steps
      // taken back afterwards.
      const std::optional<at::Tensor> found_inf =
          found_inf_.defined() ? std::optional<at::Tensor>(found_inf_.to(params.front().device())) : std::nullopt;
      if (capturable) {
        const at::Tensor lr = lr_tensor_on(g, params.front().device());
        if (decoupled) {
          at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, group.beta1, group.beta2,
                            group.weight_decay, group.eps, group.amsgrad, /*maximize=*/false,
                            /*grad_scale=*/std::nullopt, found_inf);
        } else {
          at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, group.beta1, group.beta2,
                           group.weight_decay, group.eps, group.amsgrad, /*maximize=*/false,
                           /*grad_scale=*/std::nullopt, found_inf);
        }
      } else if (decoupled) {
        at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, group.lr, group.beta1,
                          group.beta2, group.weight_decay, group.eps, group.amsgrad, /*maximize=*/false,
                          /*grad_scale=*/std::nullopt, found_inf);
      } else {
        at::_fused_adam_(params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, group.lr, group.beta1,
                         group.beta2, group.weight_decay, group.eps, group.amsgrad, /*maximize=*/false,
                         /*grad_scale=*/std::nullopt, found_inf);
      }
      if (found_inf) at::_foreach_sub_(steps, std::vector<at::Tensor>(steps.size(), *found_inf));
      continue;
    }

    // Steps on the CPU: one wrapped 1.0 for all of them, as PyTorch does.
    if (steps.front().is_cpu()) {
      at::_foreach_add_(steps, at::scalar_tensor(1.0, at::kFloat), 1.0);
    } else {
      at::_foreach_add_(steps, 1);
    }
    if (group.weight_decay != 0) {
      if (decoupled) {
        at::_foreach_mul_(params, 1 - group.lr * group.weight_decay);
      } else {
        grads = at::_foreach_add(grads, params, group.weight_decay);
      }
    }
    at::_foreach_lerp_(exp_avgs, grads, 1 - group.beta1);
    at::_foreach_mul_(exp_avg_sqs, group.beta2);
    at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1 - group.beta2);
    grads.clear();

    std::vector<double> step_size, bias_correction2_sqrt;
    step_size.reserve(states.size());
    bias_correction2_sqrt.reserve(states.size());
    for (const ParamState* state : states) {
      const double step = state->step_value;
      const double bias_correction1 = 1 - std::pow(group.beta1, step);
      const double bias_correction2 = 1 - std::pow(group.beta2, step);
      step_size.push_back((group.lr / bias_correction1) * -1);
      bias_correction2_sqrt.push_back(std::pow(bias_correction2, 0.5));  // Python's bc ** 0.5
    }
    std::vector<at::Tensor> denominators;
    if (group.amsgrad) {
      // The running maximum of the second moments, and the denominator from it.
      at::_foreach_maximum_(max_exp_avg_sqs, exp_avg_sqs);
      denominators = at::_foreach_sqrt(max_exp_avg_sqs);
    } else {
      denominators = at::_foreach_sqrt(exp_avg_sqs);
    }
    at::_foreach_div_(denominators, scalars(bias_correction2_sqrt));
    at::_foreach_add_(denominators, group.eps);
    at::_foreach_addcdiv_(params, exp_avgs, denominators, scalars(step_size));
  }
}

// sgd.py _multi_tensor_sgd or _fused_sgd, per (device, dtype) bucket.
void Optimizer::step_sgd_group(std::size_t g, bool capturable) {
  const ParamGroup& group = groups_[g];
  const bool momentum = group.momentum != 0;
  for (const Bucket& bucket : buckets_with_grad(group.params)) {
    std::vector<at::Tensor> params, grads;
    std::vector<std::size_t> with_buffer, without_buffer;  // positions in params
    for (std::size_t k = 0; k < bucket.indices.size(); ++k) {
      const std::size_t i = bucket.indices[k];
      params.push_back(group.params[i]);
      grads.push_back(group.params[i].grad());
      (state_[g][i].momentum_buffer.defined() ? with_buffer : without_buffer).push_back(k);
    }
    const auto pick = [](const std::vector<at::Tensor>& all, const std::vector<std::size_t>& positions) {
      std::vector<at::Tensor> picked;
      picked.reserve(positions.size());
      for (std::size_t k : positions) picked.push_back(all[k]);
      return picked;
    };
    const auto buffers_at = [&](const std::vector<std::size_t>& positions) {
      std::vector<at::Tensor> buffers;
      buffers.reserve(positions.size());
      for (std::size_t k : positions) buffers.push_back(state_[g][bucket.indices[k]].momentum_buffer);
      return buffers;
    };

    if (use_fused(params.front())) {
      // The capturable form reads the lr from a tensor and found_inf in the kernel.
      const at::Tensor lr = capturable ? lr_tensor_on(g, params.front().device()) : at::Tensor();
      const std::optional<at::Tensor> found_inf =
          found_inf_.defined() ? std::optional<at::Tensor>(found_inf_.to(params.front().device())) : std::nullopt;
      const auto fused_sgd = [&](const std::vector<at::Tensor>& step_params, const std::vector<at::Tensor>& step_grads,
                                 const std::vector<at::Tensor>& buffers, bool is_first_step) {
        if (capturable) {
          at::_fused_sgd_(step_params, step_grads, buffers, group.weight_decay, group.momentum, lr, group.dampening,
                          group.nesterov, /*maximize=*/false, is_first_step, /*grad_scale=*/std::nullopt, found_inf);
        } else {
          at::_fused_sgd_(step_params, step_grads, buffers, group.weight_decay, group.momentum, group.lr,
                          group.dampening, group.nesterov, /*maximize=*/false, is_first_step);
        }
      };
      if (!momentum) {
        fused_sgd(params, grads, /*buffers=*/{}, /*is_first_step=*/false);
        continue;
      }
      // PyTorch sets is_first_step when no parameter of the group has a buffer yet and creates them with
      // empty_like(grad); parameters whose first grad comes later get their own call with is_first_step. The
      // buffers start as zeros here: what a step skipped by found_inf leaves (see the header).
      if (!with_buffer.empty()) {
        fused_sgd(pick(params, with_buffer), pick(grads, with_buffer), buffers_at(with_buffer),
                  /*is_first_step=*/false);
      }
      if (!without_buffer.empty()) {
        for (std::size_t k : without_buffer) state_[g][bucket.indices[k]].momentum_buffer = at::zeros_like(grads[k]);
        fused_sgd(pick(params, without_buffer), pick(grads, without_buffer), buffers_at(without_buffer),
                  /*is_first_step=*/true);
      }
      continue;
    }

    std::vector<at::Tensor> directions =
        group.weight_decay != 0 ? at::_foreach_add(grads, params, group.weight_decay) : grads;
    if (momentum) {
      if (!with_buffer.empty()) {
        std::vector<at::Tensor> buffers = buffers_at(with_buffer);
        at::_foreach_mul_(buffers, group.momentum);
        at::_foreach_add_(buffers, pick(directions, with_buffer), 1 - group.dampening);
      }
      if (!without_buffer.empty()) {
        // buf = d_p.detach().clone() for a parameter's first momentum step.
        std::vector<at::Tensor> fresh;
        fresh.reserve(without_buffer.size());
        for (std::size_t k : without_buffer) {
          fresh.push_back(at::empty_like(directions[k]));
          state_[g][bucket.indices[k]].momentum_buffer = fresh.back();
        }
        at::_foreach_copy_(fresh, pick(directions, without_buffer));
      }
      std::vector<at::Tensor> buffers;
      buffers.reserve(bucket.indices.size());
      for (std::size_t i : bucket.indices) buffers.push_back(state_[g][i].momentum_buffer);
      if (group.nesterov) {
        directions = at::_foreach_add(directions, buffers, group.momentum);  // out of place: grads stay as they are
      } else {
        directions = std::move(buffers);
      }
    }
    at::_foreach_add_(params, directions, -group.lr);
  }
}

void Optimizer::zero_grad(bool set_to_none) {
  for (ParamGroup& group : groups_) {
    for (at::Tensor& param : group.params) {
      if (set_to_none)
        param.mutable_grad().reset();
      else if (param.grad().defined())
        param.mutable_grad().detach_().zero_();
    }
  }
}

void Optimizer::check_group(std::size_t group) const {
  if (group >= groups_.size()) {
    throw std::out_of_range(
        fmt::format("optimizer: group {} does not exist (the optimizer has {} groups)", group + 1, groups_.size()));
  }
}

void Optimizer::set_lr(std::size_t group, double lr) {
  check_group(group);
  check_learning_rate(lr, fmt::format("optimizer group {}", group + 1));
  groups_[group].lr = lr;
  LrTensor& lr_tensor = lr_tensors_[group];
  if (lr_tensor.given) lr_tensor = LrTensor{};
  lr_tensor.current = false;
}

void Optimizer::set_lr(std::size_t group, double lr, const at::Tensor& device_lr) {
  check_group(group);
  if (!device_lr.defined() || device_lr.numel() != 1 || !at::isFloatingType(device_lr.scalar_type())) {
    throw std::invalid_argument(
        fmt::format("optimizer group {}: the lr tensor must be a one-element floating tensor", group + 1));
  }
  set_lr(group, lr);
  lr_tensors_[group] = LrTensor{device_lr, /*given=*/true, /*current=*/true};
}

double Optimizer::lr(std::size_t group) const {
  check_group(group);
  return groups_[group].lr;
}

const at::Tensor& Optimizer::lr_tensor(std::size_t group) {
  check_group(group);
  LrTensor& lr = lr_tensors_[group];
  if (lr.given) return lr.tensor;
  const at::Device device =
      groups_[group].params.empty() ? at::Device(at::kCPU) : groups_[group].params.front().device();
  if (!lr.tensor.defined() || lr.tensor.device() != device) {
    lr.tensor = at::empty({}, at::TensorOptions().dtype(device.is_cuda() ? at::kFloat : at::kDouble).device(device));
    lr.current = false;
  }
  if (!lr.current) {
    lr.tensor.fill_(groups_[group].lr);
    lr.current = true;
  }
  return lr.tensor;
}

}  // namespace runner::train
