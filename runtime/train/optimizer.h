// The trainer's optimizers (SGD with momentum, Adam, AdamW) over parameter groups, one multi-tensor launch
// per (device, dtype) bucket of a group instead of a host loop over parameters (optimizer.cpp); their state
// and hyperparameters as checkpoints store them (optimizer_state.cpp).
#pragma once

#include <ATen/core/Tensor.h>
#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace runner::train {

enum class OptimizerKind { sgd, adam, adamw };

// "sgd", "adam", "adamw"; parse throws std::invalid_argument listing the names.
std::string optimizer_kind_name(OptimizerKind kind);
OptimizerKind parse_optimizer_kind(const std::string& name);

struct ParamGroup;
// torch.optim's defaults for `kind`: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0 (AdamW: 1e-2).
ParamGroup default_param_group(OptimizerKind kind);

// One parameter group. Adam/AdamW read lr, weight_decay, beta1, beta2, eps, amsgrad; SGD reads lr,
// weight_decay, momentum, dampening, nesterov (amsgrad must stay false). As in torch.optim: Adam's weight_decay
// is an L2 term added to the gradient, AdamW's is decoupled (p *= 1 - lr * weight_decay before the moment
// update); amsgrad divides by the running maximum of exp_avg_sq instead of exp_avg_sq itself.
struct ParamGroup {
  std::vector<at::Tensor> params;
  double lr = 1e-3;
  double weight_decay = 0;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  double momentum = 0, dampening = 0;
  bool nesterov = false;
  bool amsgrad = false;
};

// Throws std::invalid_argument "optimizer group <index + 1>: ..." for a hyperparameter of `group` that `kind`
// does not accept (the rules listed at Optimizer's constructor).
// Throws std::invalid_argument "WHERE: lr must be ..." unless lr is a number >= 0 that float32 holds: the optimizer
// applies learning rates as float32 numbers (the step's device scalars, the parameters' dtype).
void check_learning_rate(double lr, const std::string& where);
void validate_param_group(OptimizerKind kind, const ParamGroup& group, std::size_t index);

// Which kernels step() uses. automatic: the fused kernels for CUDA parameters, the foreach math elsewhere.
// foreach / fused force one path for every parameter (fused on the CPU uses PyTorch's CPU fused kernels,
// which is how the fused calling convention is tested on machines without a GPU).
// When every parameter takes the fused path (CUDA parameters with automatic, any with fused) the optimizer
// is capturable, see below.
enum class OptimizerImplementation { automatic, foreach, fused };

// torch.optim.SGD / Adam / AdamW with foreach=True (off CUDA) or fused=True (on CUDA), reproduced exactly:
//   foreach: torch/optim/adam.py _multi_tensor_adam (decoupled_weight_decay for AdamW), torch/optim/sgd.py
//            _multi_tensor_sgd; the same _foreach_* ops in the same order with the same host scalars (bias
//            corrections 1 - beta^step computed on the host per parameter from its step, as PyTorch does), so
//            results on the CPU equal PyTorch's bit for bit. With amsgrad: _foreach_maximum_(max_exp_avg_sqs,
//            exp_avg_sqs), then the denominator from _foreach_sqrt(max_exp_avg_sqs).
//   fused:   adam.py _fused_adam (_foreach_add_(steps, 1), then at::_fused_adam_ / at::_fused_adamw_ with the
//            float32 step tensors on the parameters' device, and the max_exp_avg_sqs with amsgrad) and sgd.py
//            _fused_sgd (at::_fused_sgd_ with is_first_step when the momentum buffers are new).
// Capturable (every parameter on the fused path): step() reads nothing on the host, so that a CUDA graph can
// capture it. The learning rate of each group comes from a tensor (the tensor_lr overloads of _fused_adam_,
// _fused_adamw_ and _fused_sgd_, as torch.optim with lr=torch.tensor(...) and fused=True): the one given with
// set_lr(group, lr, device_lr), else the optimizer's own (lr_tensor). The step counts are the float32 device
// tensors of the fused path, and found_inf is read by the kernels (also SGD's). The CUDA kernels read the lr as
// a float32, so on CUDA the step uses the learning rate rounded to float32 (the non-capturable fused call takes
// it as a double). When found_inf skips the step that creates a parameter's SGD momentum buffer, the buffer
// stays zero and the parameter's next step starts from it (buf = (1 - dampening) * d_p; with dampening 0 that
// is PyTorch's first step, and PyTorch's fused SGD leaves such a buffer uninitialised).
// Otherwise (some parameter on the foreach path) every group uses its host lr and found_inf is read on the
// host before anything runs.
// Not supported: maximize, differentiable, sparse gradients, grad_scale, complex parameters.
//
// State (as PyTorch keeps it): per parameter, created at the first step() in which its grad is defined:
//   Adam/AdamW: step (float32 scalar; on the CPU for foreach, on the parameter's device for fused),
//               exp_avg and exp_avg_sq (shape, dtype and device of the parameter), and in amsgrad groups
//               max_exp_avg_sq (like the parameter: the elementwise maximum of every exp_avg_sq so far);
//   SGD with momentum != 0: momentum_buffer (like the parameter); SGD without momentum keeps no state.
// A parameter whose grad is undefined at a step() is skipped (its state, step included, does not advance).
// Nesterov SGD without weight decay does not modify the gradients (PyTorch's foreach path adds the momentum
// into p.grad in place; the values of the update are the same).
class Optimizer {
 public:
  // Error messages number groups and parameters from 1, as scripts do (opt:lr(1) is the first group); the
  // index arguments below and the state tensors' names count from 0.
  // Throws std::invalid_argument for invalid hyperparameters (negative lr, eps or weight decay, betas outside
  // [0, 1), negative momentum or dampening, nesterov without momentum or with dampening, amsgrad with SGD),
  // undefined or non-floating parameters, or a parameter that appears twice.
  Optimizer(OptimizerKind kind, std::vector<ParamGroup> groups,
            OptimizerImplementation implementation = OptimizerImplementation::automatic);

  // One optimizer step over every parameter with a defined grad, under NoGradGuard. With `found_inf` (a
  // one-element tensor, 1 when the gradients hold inf/NaN, else 0) the step is skipped: inside the fused
  // kernels when the optimizer is capturable (no host synchronisation, as GradScaler with a fused optimizer;
  // best a float32 tensor on the parameters' device), otherwise by reading the flag on the host first.
  void step(const at::Tensor& found_inf = at::Tensor());
  // Sets every parameter's grad to an undefined tensor (set_to_none), or to zeros in place.
  void zero_grad(bool set_to_none = true);

  // Steps `replacement(param)` in place of each parameter from now on (sharded data parallel: the rank's rows of
  // it, a tensor of the same dtype and device that shares its storage). Only before any state exists:
  // std::logic_error otherwise, std::invalid_argument for a replacement of another dtype or device.
  void replace_params(const std::function<at::Tensor(std::size_t group, std::size_t param)>& replacement);

  // Whether step() is capturable (every parameter takes the fused path), as described above.
  bool capturable() const;

  // Sets the group's learning rate: the number that lr(), hyperparameters() and the foreach path use. A
  // capturable step reads it from the optimizer's own lr tensor, which step() refills when the number changed
  // (a fill with the number in its launch: use the form below for a step that a CUDA graph captures).
  // Throws std::out_of_range / std::invalid_argument.
  void set_lr(std::size_t group, double lr);
  // The same, and a capturable step reads the group's learning rate from `device_lr` (a one-element floating
  // tensor that holds `lr` by the time the step runs on the stream: e.g. a view of a buffer that the caller
  // refreshes with one copy per step). It should be on the parameters' device, float32 on CUDA; otherwise each
  // step converts it. It is used until the next set_lr or load_hyperparameters.
  void set_lr(std::size_t group, double lr, const at::Tensor& device_lr);
  double lr(std::size_t group) const;
  // The tensor a capturable step reads the group's learning rate from: the one given to set_lr, else the
  // optimizer's own, created on the group's first parameter's device (float32 on CUDA, where the kernels read a
  // float; float64 elsewhere, so that the CPU kernels, which read a double, use lr(group) exactly) and filled
  // with lr(group) here when it is out of date.
  const at::Tensor& lr_tensor(std::size_t group);
  std::int64_t step_count() const { return step_count_; }  // calls of step() not skipped on the host
  // Counts a step that a CUDA graph replayed: the graph holds the device work of step(), not its count.
  void count_replayed_step() { ++step_count_; }

  OptimizerKind kind() const { return kind_; }
  const std::vector<ParamGroup>& groups() const { return groups_; }

  // The state and hyperparameters as checkpoints store them (optimizer_state.cpp).
  // The state tensors (the optimizer's own tensors, not copies), named "group<G>.param<P>.<entry>" with
  // entry step, exp_avg, exp_avg_sq, then max_exp_avg_sq in amsgrad groups (Adam/AdamW) or momentum_buffer
  // (SGD), in group, parameter, entry order; parameters without state are left out.
  std::vector<std::pair<std::string, at::Tensor>> state_tensors() const;
  // Replaces the whole state with the named tensors (any device; copied): parameters not named start with no
  // state. Everything is validated before anything changes; std::invalid_argument on an unknown or
  // duplicate name, a group or parameter index out of range, a wrong shape or dtype, a parameter with only
  // some of its entries (max_exp_avg_sq is one of them in amsgrad groups), or max_exp_avg_sq for a group
  // without amsgrad. Messages start with "optimizer state: ".
  void load_state_tensors(const std::vector<std::pair<std::string, at::Tensor>>& tensors);

  // {"kind", "step_count", "groups": [{"params": count, "lr", "weight_decay", then "beta1", "beta2", "eps",
  // "amsgrad" (Adam/AdamW) or "momentum", "dampening", "nesterov" (SGD)}]}.
  nlohmann::json hyperparameters() const;
  // Restores step_count and every group's hyperparameters. The kind, the number of groups and each group's
  // number of parameters must match; std::invalid_argument otherwise (messages start with
  // "optimizer hyperparameters: "). A missing "amsgrad" (JSON written before it existed) reads as false.
  // amsgrad cannot change in a group where a parameter has state (it would lack max_exp_avg_sq, or keep one
  // that is no longer updated): std::invalid_argument as well.
  void load_hyperparameters(const nlohmann::json& hyperparameters);

 private:
  struct ParamState {
    at::Tensor step, exp_avg, exp_avg_sq, max_exp_avg_sq, momentum_buffer;  // max_exp_avg_sq: amsgrad groups
    float step_value = 0;  // host copy of `step` (float32 as the tensor), for the foreach bias corrections
  };
  // The lr tensor of a group as the capturable step reads it.
  struct LrTensor {
    at::Tensor tensor;
    bool given = false;    // by set_lr(group, lr, device_lr); else the optimizer's own
    bool current = false;  // the optimizer's own holds the group's lr
  };
  bool use_fused(const at::Tensor& param) const;
  void check_group(std::size_t group) const;
  void init_state(const at::Tensor& param, bool amsgrad, ParamState& state) const;
  // The group's lr tensor on `device` as the fused kernels take it (float32 on CUDA).
  at::Tensor lr_tensor_on(std::size_t group, const at::Device& device);
  void step_adam_group(std::size_t group, bool capturable);
  void step_sgd_group(std::size_t group, bool capturable);

  OptimizerKind kind_;
  OptimizerImplementation implementation_;
  std::vector<ParamGroup> groups_;
  std::vector<std::vector<ParamState>> state_;  // [group][param]
  std::vector<LrTensor> lr_tensors_;            // [group]
  std::int64_t step_count_ = 0;
  at::Tensor found_inf_;  // the flag of the step in progress, when the fused kernels read it
};

}  // namespace runner::train
