// Bucketed gradient averaging over the process group (overlapped with backward through hooks on the
// parameters' gradient accumulators) on gradients that are views of the buckets, and the broadcast of the
// starting weights.
#include "runtime/dist/gradient_averager.h"

#include <ATen/ATen.h>
#include <c10/util/strides.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>

#include "runtime/core/shape_text.h"
#include "runtime/dist/parameter_shards.h"

namespace runner::dist {

GradientAverager::GradientAverager(ProcessGroup& group, std::vector<at::Tensor> parameters,
                                   GradientAveragingOptions options)
    : group_(group), parameters_(std::move(parameters)), bucket_of_(parameters_.size()), views_(parameters_.size()) {
  if (!(options.bucket_mb > 0))
    throw std::invalid_argument(fmt::format("bucket_mb must be positive, got {}", options.bucket_mb));
  const auto bucket_bytes = static_cast<std::size_t>(options.bucket_mb * 1024 * 1024);
  std::vector<std::size_t> bucket;
  std::size_t bytes = 0;
  for (std::size_t i = parameters_.size(); i-- > 0;) {
    const at::Tensor& p = parameters_[i];
    const std::size_t size = static_cast<std::size_t>(p.numel()) * p.element_size();
    const bool fits =
        bucket.empty() || (parameters_[bucket.front()].scalar_type() == p.scalar_type() &&
                           parameters_[bucket.front()].device() == p.device() && bytes + size <= bucket_bytes);
    if (!fits) {
      buckets_.push_back({std::move(bucket), {}});
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(i);
    bytes += size;
  }
  if (!bucket.empty()) buckets_.push_back({std::move(bucket), {}});
  at::NoGradGuard no_grad;
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    Bucket& bucket = buckets_[b];
    const at::Tensor& first = parameters_[bucket.parameters.front()];
    // Slots start at 16-byte boundaries: vectorized kernels (the fused optimizers') need aligned gradients.
    const std::int64_t alignment = std::max<std::int64_t>(1, 16 / static_cast<std::int64_t>(first.element_size()));
    std::vector<std::int64_t> offsets;
    std::int64_t length = 0;
    for (std::size_t i : bucket.parameters) {
      offsets.push_back(length);
      length += (parameters_[i].numel() + alignment - 1) / alignment * alignment;
    }
    bucket.gradients = at::zeros({length}, first.options().requires_grad(false));
    for (std::size_t k = 0; k < bucket.parameters.size(); ++k) {
      const std::size_t i = bucket.parameters[k];
      const at::Tensor& p = parameters_[i];
      bucket_of_[i] = b;
      // The parameter's own strides where it is dense (what AccumulateGrad's layout contract asks for). set_
      // rather than narrow().view(): an autograd view could not be detached in place (Optimizer::zero_grad).
      const c10::DimVector strides =
          p.is_non_overlapping_and_dense() ? c10::DimVector(p.strides()) : c10::contiguous_strides(p.sizes());
      views_[i] =
          at::empty({0}, bucket.gradients.options()).set_(bucket.gradients.storage(), offsets[k], p.sizes(), strides);
      parameters_[i].mutable_grad() = views_[i];
    }
  }
  if (!options.overlap) return;
  for (std::size_t i = 0; i < parameters_.size(); ++i) {
    std::shared_ptr<torch::autograd::Node> accumulator = torch::autograd::impl::grad_accumulator(parameters_[i]);
    if (!accumulator) continue;  // not a leaf that requires grad: average() handles it
    hook_keys_.push_back(accumulator->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [this, i](const torch::autograd::variable_list& outputs, const torch::autograd::variable_list&) {
          gradient_ready(i);
          return outputs;
        })));
    accumulators_.push_back(std::move(accumulator));
  }
}

GradientAverager::~GradientAverager() {
  for (std::size_t h = 0; h < accumulators_.size(); ++h) accumulators_[h]->del_post_hook(hook_keys_[h]);
}

void GradientAverager::start_step() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = false;
  // A step whose backward failed may have left all-reduces writing into the buckets.
  for (auto& pending : pending_)
    if (pending) pending->wait();
  pending_.clear();
  at::NoGradGuard no_grad;
  for (Bucket& bucket : buckets_) bucket.gradients.zero_();
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    if (!parameters_[i].grad().is_same(views_[i])) parameters_[i].mutable_grad() = views_[i];
}

void GradientAverager::expect_last_backward() {
  std::lock_guard<std::mutex> lock(mutex_);
  armed_ = true;
  missing_.clear();
  for (const Bucket& bucket : buckets_) missing_.push_back(bucket.parameters.size());
  next_bucket_ = 0;
  pending_.clear();
  pending_.resize(buckets_.size());
}

void GradientAverager::gradient_ready(std::size_t parameter) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (!armed_) return;  // an earlier micro-batch: gradients only accumulate
  std::size_t& missing = missing_[bucket_of_[parameter]];
  if (missing > 0) --missing;
  start_ready_buckets();
}

void GradientAverager::start_ready_buckets() {
  while (next_bucket_ < buckets_.size() && missing_[next_bucket_] == 0) start(next_bucket_++);
}

void GradientAverager::restore_view(std::size_t i) {
  at::Tensor& grad = parameters_[i].mutable_grad();
  if (grad.is_same(views_[i])) return;
  if (!grad.defined()) {
    views_[i].zero_();
  } else {
    if (grad.sizes() != views_[i].sizes())
      throw std::invalid_argument(fmt::format("a parameter of shape {} was given a gradient of shape {}",
                                              core::shape_text(views_[i].sizes()), core::shape_text(grad.sizes())));
    views_[i].copy_(grad);
  }
  grad = views_[i];
}

void GradientAverager::start(std::size_t b) {
  at::NoGradGuard no_grad;
  for (std::size_t i : buckets_[b].parameters) restore_view(i);
  std::vector<at::Tensor> one{buckets_[b].gradients};
  pending_[b].emplace(group_.all_reduce_async(one));
}

void GradientAverager::average() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (!armed_) {  // no hooks (overlap off) or expect_last_backward() not called: nothing started yet
    lock.unlock();
    expect_last_backward();
    lock.lock();
  }
  armed_ = false;
  while (next_bucket_ < buckets_.size()) start(next_bucket_++);
  lock.unlock();
  at::NoGradGuard no_grad;
  const double scale = 1.0 / static_cast<double>(group_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending_[b]->wait();
    buckets_[b].gradients.mul_(scale);
  }
  pending_.clear();
}

at::Tensor GradientAverager::mean(const at::Tensor& scalar) {
  std::vector<at::Tensor> one{scalar.detach().reshape({1}).clone()};
  group_.all_reduce(one, ReduceOp::mean);
  return one[0].reshape({});
}

void GradientAverager::check_in_step(std::int64_t step) { check_ranks_agree(group_, parameters_, step); }

void broadcast_from_rank0(ProcessGroup& group, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& tensor : tensors) {
    std::vector<at::Tensor> one{tensor.is_contiguous() ? tensor : tensor.contiguous()};
    group.broadcast(one, 0);
    if (!tensor.is_contiguous()) const_cast<at::Tensor&>(tensor).copy_(one[0]);
  }
}

}  // namespace runner::dist
