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

// What a trainer step takes: a batch's tensors by name ("data" [B, ...], "label" [B], "index" [B], ...; from a
// data::Batch of the loader or a script's table) and its epoch (0-based: the epochs completed before it, as
// data::Batch counts; unset for a batch that did not come from a loader).
struct StepBatch {
  NamedTensorList tensors;
  std::optional<std::int64_t> epoch;
  double wait_seconds = 0;  // how long the loop waited for the loader to give it (its wait_s); 0 when unknown

  // The tensor of that name, or nullptr.
  const at::Tensor* find(const std::string& name) const;
};

// The `count` equal micro-batches of a batch, in order: every tensor whose first dimension is the batch size
// (that of "data") is narrowed, other tensors are shared. Throws std::invalid_argument when the batch has no
// "data" tensor or its size does not divide by `count`.
std::vector<StepBatch> split_batch(const StepBatch& batch, std::int64_t count);

class Objective {
 public:
  virtual ~Objective() = default;
  // The loss of one micro-batch: a floating-point scalar computed from the model's parameters.
  virtual at::Tensor loss(const StepBatch& micro) = 0;
  // What it computes, for messages: "diffusion loss (eps prediction, uniform timesteps)".
  virtual std::string describe() const = 0;
  // The host's part of a step, done once per batch before it is split into micro-batches: what loss() would
  // otherwise work out on the host (e.g. per-sample keys from the dataset indices and the epoch) added to the
  // batch as tensors, so that loss() of a prepared micro-batch only launches device work and a CUDA graph can
  // replay it with the next batch's values. The default returns the batch as it is.
  virtual StepBatch prepare(const StepBatch& batch) { return batch; }
  // Why loss() of a prepared batch cannot be captured in a CUDA graph (runner.trainer { graph = ... }) as things
  // stand, or nullopt when it can.
  virtual std::optional<std::string> capture_blocker() const { return describe() + " does not support CUDA graphs"; }
};

}  // namespace runner::train
