// Data-parallel gradients: every rank's gradients replaced by their mean over the ranks, in buckets of about
// 25 MB (flattened, one all-reduce each, all in flight together), as PyTorch DDP's reducer averages them.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "runtime/dist/process_group.h"

namespace runner::dist {

class GradientAverager {
 public:
  // `parameters` in the same order on every rank. Buckets hold parameters of one dtype and device, filled
  // from the last parameter backwards (the order backward produces their gradients).
  GradientAverager(ProcessGroup& group, std::vector<at::Tensor> parameters, std::size_t bucket_bytes = 25u << 20);

  // Averages the parameters' gradients in place; a parameter without a gradient on this rank counts as zeros
  // (and gets a gradient), so every rank launches the same collectives.
  void average();
  // The mean of a scalar over the ranks (the step's loss).
  at::Tensor mean(const at::Tensor& scalar);
  std::size_t bucket_count() const { return buckets_.size(); }
  // Whether every rank holds the same parameters: a float64 checksum compared over the ranks (they apply the
  // same averaged gradients, so they agree bit for bit). Throws std::runtime_error naming `step` otherwise.
  void check_in_step(std::int64_t step);

 private:
  ProcessGroup& group_;
  std::vector<at::Tensor> parameters_;
  std::vector<std::vector<std::size_t>> buckets_;  // indices into parameters_
};

// Sets every rank's tensors to rank 0's (parameters and buffers at the start of training).
void broadcast_from_rank0(ProcessGroup& group, const std::vector<at::Tensor>& tensors);

}  // namespace runner::dist
