// What a training step minimises, as the trainer sees it: an Objective gives the loss of one micro-batch of a
// loader batch. The diffusion loss is one (runtime/diffusion/diffusion_objective.h).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace runner::train {

using NamedTensorList = std::vector<std::pair<std::string, at::Tensor>>;

// A loader batch: its tensors by name ("data" [B, ...], "label" [B], "index" [B], ...) and its epoch (0-based:
// the epochs completed before it, as data::Batch counts; unset for a batch that did not come from a loader).
struct Batch {
  NamedTensorList tensors;
  std::optional<std::int64_t> epoch;

  // The tensor of that name, or nullptr.
  const at::Tensor* find(const std::string& name) const;
};

// The `count` equal micro-batches of a batch, in order: every tensor whose first dimension is the batch size
// (that of "data") is narrowed, other tensors are shared. Throws std::invalid_argument when the batch has no
// "data" tensor or its size does not divide by `count`.
std::vector<Batch> split_batch(const Batch& batch, std::int64_t count);

class Objective {
 public:
  virtual ~Objective() = default;
  // The loss of one micro-batch: a floating-point scalar computed from the model's parameters.
  virtual at::Tensor loss(const Batch& micro) = 0;
  // What it computes, for messages: "diffusion loss (eps prediction, uniform timesteps)".
  virtual std::string describe() const = 0;
};

}  // namespace runner::train
