// The global gradient norm and clipping by it, as torch.nn.utils.clip_grad_norm_ (foreach) computes them:
// one _foreach_norm per (device, dtype) bucket, the norm of the per-tensor norms, one _foreach_mul_ by
// min(1, max_norm / (total + 1e-6)). No host synchronisation.
#pragma once

#include <ATen/core/Tensor.h>

#include <vector>

namespace runner::train {

// The norm_type norm (2, inf, any p > 0) of all the tensors together, on the first tensor's device in its
// dtype. `grads` must not be empty. With `per_tensor`, it receives each tensor's norm, in the order of `grads`
// (a tensor holding NaN has a NaN norm, one holding inf but no NaN an inf norm).
at::Tensor total_norm(const std::vector<at::Tensor>& grads, double norm_type = 2.0,
                      std::vector<at::Tensor>* per_tensor = nullptr);

// Scales the tensors in place by min(1, max_norm / (norm + 1e-6)).
void clip_by_norm(const std::vector<at::Tensor>& grads, double max_norm, const at::Tensor& norm);

// Both: returns the norm before clipping. Throws std::invalid_argument for an empty list or max_norm <= 0.
at::Tensor clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, double norm_type = 2.0);

}  // namespace runner::train
