// Data-parallel gradients: every rank's gradients replaced by their mean over the ranks, in buckets of about
// 25 MB (one all-reduce each) started while backward still runs, as PyTorch DDP's reducer with
// gradient_as_bucket_view=True: each bucket is one flat buffer allocated once, every parameter's .grad a view
// of its slot for the whole run, so backward accumulates into the buckets and they are averaged in place.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "runtime/dist/process_group.h"

namespace torch::autograd {
struct Node;
}

namespace runner::dist {

struct GradientAveragingOptions {
  double bucket_mb = 25;  // the size of one all-reduce
  bool overlap = true;    // start a bucket's all-reduce during backward as soon as all its gradients are in
};

class GradientAverager {
 public:
  // `parameters` in the same order on every rank. Buckets hold parameters of one dtype and device, filled
  // from the last parameter backwards (the order backward produces their gradients). Sets every parameter's
  // .grad to its bucket view (zeros).
  GradientAverager(ProcessGroup& group, std::vector<at::Tensor> parameters, GradientAveragingOptions options = {});
  ~GradientAverager();
  GradientAverager(const GradientAverager&) = delete;
  GradientAverager& operator=(const GradientAverager&) = delete;

  // Called when a step starts, in place of the optimizer's zero_grad (set_to_none would drop the views): waits
  // for the all-reduces of a step whose backward failed, zeroes the buckets (one op each) and gives a
  // parameter whose .grad was replaced its view back.
  void start_step();
  // Called before the backward of a step's last micro-batch (earlier micro-batches only accumulate): with
  // overlap, each bucket starts its all-reduce once backward has accumulated all of its gradients. Buckets
  // start in the same order on every rank (a bucket waits for the ones before it).
  void expect_last_backward();
  // After that backward: starts the buckets not started yet (a parameter without a gradient on this rank
  // counts as zeros, so every rank launches the same collectives), waits for all and scales them to the mean.
  // A .grad that is no longer its bucket view when its bucket starts (`p.grad = t`, zero_grad with
  // set_to_none during the step) is copied into the bucket (none: zeros) and the view put back; one of
  // another shape throws std::invalid_argument.
  void average();
  // The mean of a scalar over the ranks (the step's loss).
  at::Tensor mean(const at::Tensor& scalar);
  std::size_t bucket_count() const { return buckets_.size(); }
  // Bucket `b`'s flat gradient buffer: the same memory for the averager's lifetime.
  const at::Tensor& bucket_gradients(std::size_t b) const { return buckets_.at(b).gradients; }
  // Whether every rank holds the same parameters: a float64 checksum compared over the ranks (they apply the
  // same averaged gradients, so they agree bit for bit). Throws std::runtime_error naming `step` otherwise.
  void check_in_step(std::int64_t step);

 private:
  void gradient_ready(std::size_t parameter);
  void start_ready_buckets();  // with mutex_ held
  void start(std::size_t bucket);
  void restore_view(std::size_t parameter);

  struct Bucket {
    std::vector<std::size_t> parameters;  // indices into parameters_
    at::Tensor gradients;                 // flat, every parameter's gradient at a 16-byte aligned offset
  };

  ProcessGroup& group_;
  std::vector<at::Tensor> parameters_;
  std::vector<Bucket> buckets_;
  std::vector<std::size_t> bucket_of_;  // parameter -> bucket
  // Per parameter: its slot of its bucket, shaped and strided as the parameter (the .grad it should have).
  std::vector<at::Tensor> views_;
  // The parameters' gradient accumulators (kept alive: the hooks live on them) and the hooks' keys.
  std::vector<std::shared_ptr<torch::autograd::Node>> accumulators_;
  std::vector<std::uintptr_t> hook_keys_;

  std::mutex mutex_;  // the hooks run on autograd's threads
  bool armed_ = false;
  std::vector<std::size_t> missing_;  // per bucket: gradients not in yet
  std::size_t next_bucket_ = 0;       // buckets start in order
  std::vector<std::optional<PendingCollective>> pending_;
};

// Sets every rank's tensors to rank 0's (parameters and buffers at the start of training).
void broadcast_from_rank0(ProcessGroup& group, const std::vector<at::Tensor>& tensors);

}  // namespace runner::dist
