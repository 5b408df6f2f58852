// Loader batches and their micro-batches.
#include "runtime/train/objective.h"

#include <fmt/format.h>

#include <stdexcept>

namespace runner::train {

const at::Tensor* StepBatch::find(const std::string& name) const {
  for (const auto& [key, tensor] : tensors)
    if (key == name) return &tensor;
  return nullptr;
}

std::vector<StepBatch> split_batch(const StepBatch& batch, std::int64_t count) {
  if (count == 1) return {batch};
  const at::Tensor* data = batch.find("data");
  if (data == nullptr || data->dim() == 0)
    throw std::invalid_argument("train:step: cannot split a batch without a 'data' tensor into micro-batches");
  const std::int64_t size = data->size(0);
  if (size % count != 0)
    throw std::invalid_argument(
        fmt::format("train:step: a batch of {} does not split into {} equal micro-batches (accumulate)", size, count));
  const std::int64_t part = size / count;
  std::vector<StepBatch> micro(static_cast<std::size_t>(count));
  for (std::int64_t i = 0; i < count; ++i) {
    StepBatch& m = micro[static_cast<std::size_t>(i)];
    m.epoch = batch.epoch;
    for (const auto& [name, tensor] : batch.tensors) {
      const bool per_sample = tensor.dim() > 0 && tensor.size(0) == size;
      m.tensors.emplace_back(name, per_sample ? tensor.narrow(0, i * part, part) : tensor);
    }
  }
  return micro;
}

}  // namespace runner::train
