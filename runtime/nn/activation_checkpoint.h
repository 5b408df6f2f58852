// Activation (gradient) checkpointing: run a block without keeping its activations and recompute them in
// backward, with the autocast settings and RNG states (CPU and the inputs' CUDA device) of the forward.
#pragma once

#include <ATen/core/Tensor.h>

#include <functional>
#include <vector>

namespace runner::nn {

using TensorList = std::vector<at::Tensor>;
using BlockFunction = std::function<TensorList(const TensorList&)>;

// Returns block(inputs). When grad mode is on and some input or parameter needs gradients, the block runs
// without recording its graph; backward runs it again (reentrant) and accumulates parameter gradients
// into .grad as a plain backward would. `block` must stay callable until backward has run. Without an
// input that requires grad the block runs plainly (no graph would reach the recomputation).
TensorList checkpointed(const BlockFunction& block, const TensorList& inputs);

}  // namespace runner::nn
