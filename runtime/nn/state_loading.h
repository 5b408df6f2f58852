// Copying named weights from a file into a built-in module, strictly: every problem is listed in one error.
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
  // Module tensors that may be absent from the file (they keep their values).
  std::function<bool(const std::string&)> optional;
  // Accept [O, I, 1, 1] for a [O, I] tensor (1x1 convolutions stored for linear layers).
  bool squeeze_1x1 = false;
};

// Throws std::invalid_argument "<origin>: the weights do not fit <model>; shapes differ: ...; missing: ...; not
// in the model: ..." naming up to six of each.
void load_state(torch::nn::Module& module, const std::vector<ckpt::NamedTensor>& tensors, const std::string& origin,
                const std::string& model, const StateLoadOptions& options = {});

}  // namespace runner::nn
