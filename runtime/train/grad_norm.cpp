// The global gradient norm and clipping by it (torch.nn.utils.clip_grad_norm_, foreach).
#include "runtime/train/grad_norm.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <map>
#include <stdexcept>
#include <string>
#include <utility>

namespace runner::train {

at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type, std::vector<at::Tensor>* per_tensor) {
  if (grads.empty()) throw std::invalid_argument("the gradient norm of no tensors");
  std::map<std::pair<std::string, at::ScalarType>, std::vector<std::size_t>> buckets;
  for (std::size_t i = 0; i < grads.size(); ++i)
    buckets[{grads[i].device().str(), grads[i].scalar_type()}].push_back(i);
  if (per_tensor) per_tensor->assign(grads.size(), at::Tensor());
  std::vector<at::Tensor> norms;
  for (auto& [key, members] : buckets) {
    std::vector<at::Tensor> bucket;
    for (const std::size_t i : members) bucket.push_back(grads[i]);
    const std::vector<at::Tensor> bucket_norms = at::_foreach_norm(bucket, norm_type);
    for (std::size_t j = 0; j < members.size(); ++j) {
      if (per_tensor) (*per_tensor)[members[j]] = bucket_norms[j];
      norms.push_back(bucket_norms[j].to(grads.front().device()));
    }
  }
  return at::linalg_vector_norm(at::stack(norms), norm_type);
}

void clip_by_norm(const std::vector<at::Tensor>& grads, double max_norm, const at::Tensor& norm) {
  if (grads.empty()) return;
  const at::Tensor coefficient = (max_norm / (norm + 1e-6)).clamp_max(1.0);
  std::map<std::pair<std::string, at::ScalarType>, std::vector<at::Tensor>> buckets;
  for (const auto& g : grads) buckets[{g.device().str(), g.scalar_type()}].push_back(g);
  for (auto& [key, bucket] : buckets) at::_foreach_mul_(bucket, coefficient.to(bucket.front().device()));
}

at::Tensor clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm_type) {
  if (!(max_norm > 0)) throw std::invalid_argument(fmt::format("max_norm must be positive, got {}", max_norm));
  const at::Tensor norm = total_norm(grads, norm_type);
  clip_by_norm(grads, max_norm, norm);
  return norm;
}

}  // namespace runner::train
