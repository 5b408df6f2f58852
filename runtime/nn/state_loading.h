// The one strict state-dict loader: by-name copying of stored tensors into a module's parameters and buffers,
// behind module:load / load_state_dict in Lua, the weights files of built-in models and a checkpoint's model.
// Every problem is listed in one error, and nothing changes unless everything fits.
#pragma once

#include <torch/nn/module.h>

#include <functional>
#include <string>
#include <vector>

#include "runtime/ckpt/safetensors.h"

namespace runner::nn {

struct StateLoadOptions {
  // The module's name for a stored name (e.g. older checkpoints' names); identity when empty.
  std::function<std::string(const std::string&)> rename;
  // Module tensors that may be absent from the state (they keep their values).
  std::function<bool(const std::string&)> optional;
  // Accept [O, I, 1, 1] for a [O, I] tensor (1x1 convolutions stored for linear layers).
  bool squeeze_1x1 = false;
  // false: missing and unexpected names are not errors (PyTorch's strict=False); shapes must fit either way.
  bool strict = true;
  // A dtype difference is an error too, not a conversion (a run's checkpoint restores bit for bit).
  bool same_dtype = false;
};

// A module tensor and the stored tensor that fills it (squeezed where squeeze_1x1 allows).
struct StateCopy {
  at::Tensor target;
  at::Tensor source;
};

// The module's tensors by name: parameters, then buffers.
std::vector<ckpt::NamedTensor> named_state(const torch::nn::Module& module);

// Checks `stored` against the module tensors `targets` and returns the copies to make. Throws
// std::invalid_argument, listing up to six names of each kind:
// "<origin>: [the weights do not fit <model>: ]missing keys: a, b; shape mismatch for c: state has [7], module has
// [3]; dtype mismatch for d: state has Half, module has Float; unexpected keys: e" (`model` empty: no fit clause).
std::vector<StateCopy> match_state(const std::vector<ckpt::NamedTensor>& targets,
                                   const std::vector<ckpt::NamedTensor>& stored, const std::string& origin,
                                   const std::string& model, const StateLoadOptions& options = {});

// match_state, then the copies (without autograd).
void load_state(const std::vector<ckpt::NamedTensor>& targets, const std::vector<ckpt::NamedTensor>& stored,
                const std::string& origin, const std::string& model, const StateLoadOptions& options = {});
void load_state(torch::nn::Module& module, const std::vector<ckpt::NamedTensor>& stored, const std::string& origin,
                const std::string& model, const StateLoadOptions& options = {});

}  // namespace runner::nn
