// Bucketed gradient averaging over the process group, and the broadcast of the starting weights.
#include "runtime/dist/gradient_averager.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

namespace runner::dist {

GradientAverager::GradientAverager(ProcessGroup& group, std::vector<at::Tensor> parameters, std::size_t bucket_bytes)
    : group_(group), parameters_(std::move(parameters)) {
  std::vector<std::size_t> bucket;
  std::size_t bytes = 0;
  for (std::size_t i = parameters_.size(); i-- > 0;) {
    const at::Tensor& p = parameters_[i];
    const std::size_t size = static_cast<std::size_t>(p.numel()) * p.element_size();
    const bool fits = bucket.empty() || (parameters_[bucket.front()].scalar_type() == p.scalar_type() &&
                                         parameters_[bucket.front()].device() == p.device() && bytes + size <= bucket_bytes);
    if (!fits) {
      buckets_.push_back(std::move(bucket));
      bucket.clear();
      bytes = 0;
    }
    bucket.push_back(i);
    bytes += size;
  }
  if (!bucket.empty()) buckets_.push_back(std::move(bucket));
}

void GradientAverager::average() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> flats;
  std::vector<PendingCollective> pending;
  flats.reserve(buckets_.size());
  pending.reserve(buckets_.size());
  for (const auto& bucket : buckets_) {
    std::vector<at::Tensor> pieces;
    for (std::size_t i : bucket) {
      at::Tensor& p = parameters_[i];
      if (!p.grad().defined()) p.mutable_grad() = at::zeros_like(p);
      pieces.push_back(p.grad().reshape({-1}));
    }
    flats.push_back(at::cat(pieces));
    std::vector<at::Tensor> one{flats.back()};
    pending.push_back(group_.all_reduce_async(one));
  }
  const double scale = 1.0 / static_cast<double>(group_.size());
  for (std::size_t b = 0; b < buckets_.size(); ++b) {
    pending[b].wait();
    at::Tensor& flat = flats[b];
    flat.mul_(scale);
    std::int64_t offset = 0;
    for (std::size_t i : buckets_[b]) {
      at::Tensor grad = parameters_[i].grad();
      const std::int64_t n = grad.numel();
      grad.copy_(flat.narrow(0, offset, n).view_as(grad));
      offset += n;
    }
  }
}

at::Tensor GradientAverager::mean(const at::Tensor& scalar) {
  std::vector<at::Tensor> one{scalar.detach().reshape({1}).clone()};
  group_.all_reduce(one, ReduceOp::mean);
  return one[0].reshape({});
}

void GradientAverager::check_in_step(std::int64_t step) {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;
  for (const at::Tensor& p : parameters_) sums.push_back(p.detach().sum(at::kDouble));
  const at::Tensor checksum = sums.empty() ? at::zeros({1}, at::kDouble) : at::stack(sums).sum().reshape({1});
  std::vector<at::Tensor> high{checksum.clone()}, low{checksum.clone()};
  group_.all_reduce(high, ReduceOp::max);
  group_.all_reduce(low, ReduceOp::min);
  const double mine = checksum.item<double>(), top = high[0].item<double>(), bottom = low[0].item<double>();
  if (top != bottom)
    throw std::runtime_error(fmt::format(
        "the ranks' weights differ after step {} (parameter checksums from {:.17g} to {:.17g}; rank {} has {:.17g}): "
        "something made a rank train differently (a rank-dependent model change, or a step skipped on one rank)",
        step, bottom, top, group_.rank(), mine));
}

void broadcast_from_rank0(ProcessGroup& group, const std::vector<at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  for (const at::Tensor& tensor : tensors) {
    std::vector<at::Tensor> one{tensor.is_contiguous() ? tensor : tensor.contiguous()};
    group.broadcast(one, 0);
    if (!tensor.is_contiguous()) const_cast<at::Tensor&>(tensor).copy_(one[0]);
  }
}

}  // namespace runner::dist
