// A custom autograd function that recomputes a block in backward.
#include "runtime/nn/activation_checkpoint.h"

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>
#include <optional>

namespace runner::nn {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct AutocastState {
  at::DeviceType device;
  bool enabled;
  at::ScalarType dtype;

  static AutocastState capture(at::DeviceType device) {
    return {device, at::autocast::is_autocast_enabled(device), at::autocast::get_autocast_dtype(device)};
  }
  void apply() const {
    at::autocast::set_autocast_enabled(device, enabled);
    at::autocast::set_autocast_dtype(device, dtype);
  }
};

// What the forward saw, kept for the recomputation.
struct RecomputeState : torch::CustomClassHolder {
  BlockFunction block;
  std::vector<bool> input_requires_grad;
  at::Tensor cpu_rng_state;
  std::optional<at::Device> accelerator;
  at::Tensor accelerator_rng_state;
  AutocastState cpu_autocast{at::kCPU, false, at::kBFloat16};
  AutocastState cuda_autocast{at::kCUDA, false, at::kHalf};
};

at::Generator default_generator(at::Device device) { return at::globalContext().defaultGenerator(device); }

// Swaps generator states in for the recomputation and puts the caller's back afterwards.
class RngFork {
 public:
  explicit RngFork(const RecomputeState& state) {
    swap_in(at::Device(at::kCPU), state.cpu_rng_state, saved_cpu_);
    if (state.accelerator) swap_in(*state.accelerator, state.accelerator_rng_state, saved_accelerator_);
    accelerator_ = state.accelerator;
  }
  ~RngFork() {
    restore(at::Device(at::kCPU), saved_cpu_);
    if (accelerator_) restore(*accelerator_, saved_accelerator_);
  }
  RngFork(const RngFork&) = delete;
  RngFork& operator=(const RngFork&) = delete;

 private:
  static void swap_in(at::Device device, const at::Tensor& state, at::Tensor& saved) {
    auto generator = default_generator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    saved = generator.get_state();
    generator.set_state(state);
  }
  static void restore(at::Device device, const at::Tensor& saved) {
    auto generator = default_generator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    generator.set_state(saved);
  }
  at::Tensor saved_cpu_, saved_accelerator_;
  std::optional<at::Device> accelerator_;
};

class AutocastRestore {
 public:
  explicit AutocastRestore(const RecomputeState& state)
      : cpu_(AutocastState::capture(at::kCPU)), cuda_(AutocastState::capture(at::kCUDA)) {
    state.cpu_autocast.apply();
    state.cuda_autocast.apply();
  }
  ~AutocastRestore() {
    cpu_.apply();
    cuda_.apply();
  }
  AutocastRestore(const AutocastRestore&) = delete;
  AutocastRestore& operator=(const AutocastRestore&) = delete;

 private:
  AutocastState cpu_, cuda_;
};

struct CheckpointFunction : torch::autograd::Function<CheckpointFunction> {
  // Inputs come as a TensorList: autograd records the tensors of a TensorList argument as inputs (one
  // gradient each), but not those of a std::vector.
  static variable_list forward(AutogradContext* ctx, c10::intrusive_ptr<RecomputeState> state, at::TensorList inputs) {
    variable_list input_list(inputs.begin(), inputs.end());
    ctx->save_for_backward(input_list);
    ctx->saved_data["state"] = at::IValue::make_capsule(state);
    return state->block(input_list);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_outputs) {
    auto state = c10::static_intrusive_pointer_cast<RecomputeState>(ctx->saved_data["state"].toCapsule());
    const auto saved = ctx->get_saved_variables();
    variable_list inputs;
    inputs.reserve(saved.size());
    for (std::size_t i = 0; i < saved.size(); ++i) {
      inputs.push_back(saved[i].detach().requires_grad_(state->input_requires_grad[i]));
    }
    variable_list outputs;
    {
      RngFork rng(*state);
      AutocastRestore autocast(*state);
      at::AutoGradMode grad_mode(true);
      outputs = state->block(inputs);
    }
    variable_list differentiable, gradients;
    for (std::size_t i = 0; i < outputs.size(); ++i) {
      if (outputs[i].requires_grad() && i < grad_outputs.size() && grad_outputs[i].defined()) {
        differentiable.push_back(outputs[i]);
        gradients.push_back(grad_outputs[i]);
      }
    }
    if (!differentiable.empty()) torch::autograd::backward(differentiable, gradients);
    // One gradient per forward argument: none for the state, then one per input.
    variable_list result{at::Tensor()};
    for (const auto& input : inputs) result.push_back(input.requires_grad() ? input.grad() : at::Tensor());
    return result;
  }
};

}  // namespace

TensorList checkpointed(const BlockFunction& block, const TensorList& inputs) {
  const bool any_input_needs_grad =
      std::any_of(inputs.begin(), inputs.end(), [](const at::Tensor& input) { return input.requires_grad(); });
  // The recomputation is reached through the inputs' graph: without one, parameters would get no gradient.
  if (!at::GradMode::is_enabled() || !any_input_needs_grad) return block(inputs);
  auto state = c10::make_intrusive<RecomputeState>();
  state->block = block;
  for (const auto& input : inputs) {
    state->input_requires_grad.push_back(input.requires_grad());
    if (input.device().type() == at::kCUDA && !state->accelerator) state->accelerator = input.device();
  }
  {
    auto generator = default_generator(at::Device(at::kCPU));
    std::lock_guard<std::mutex> lock(generator.mutex());
    state->cpu_rng_state = generator.get_state();
  }
  if (state->accelerator) {
    auto generator = default_generator(*state->accelerator);
    std::lock_guard<std::mutex> lock(generator.mutex());
    state->accelerator_rng_state = generator.get_state();
  }
  state->cpu_autocast = AutocastState::capture(at::kCPU);
  state->cuda_autocast = AutocastState::capture(at::kCUDA);
  return CheckpointFunction::apply(state, at::TensorList(inputs));
}

}  // namespace runner::nn
