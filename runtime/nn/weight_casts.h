// Weights cast to autocast's dtype once per training step instead of at every use (the trainer's
// cast_weights_once): one multi-tensor pass copies them, and linear_forward multiplies with the copies while a
// WeightCastScope is open on the thread. The numbers are autocast's: the same cast, and in backward the
// gradient cast back to the weight's dtype, as autocast's cast does.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <optional>
#include <unordered_map>
#include <vector>

namespace runner::nn {

class WeightCasts {
 public:
  // Copies in `dtype` of the float32 tensors among `weights` (the others are left to autocast).
  WeightCasts(const std::vector<at::Tensor>& weights, c10::ScalarType dtype);
  // Copies every weight's current value into its copy: one multi-tensor pass.
  void refresh();
  // The copy of `weight` as a differentiable cast of it (its gradient reaches `weight` in weight's dtype), or
  // nullopt when `weight` has none.
  std::optional<at::Tensor> cast_of(const at::Tensor& weight) const;
  std::size_t size() const { return weights_.size(); }

 private:
  std::vector<at::Tensor> weights_, copies_;
  std::unordered_map<const c10::TensorImpl*, std::size_t> index_;
};

// While alive, weight_for_matmul on this thread gives `casts`' copies (scopes nest; the innermost wins).
class WeightCastScope {
 public:
  explicit WeightCastScope(const WeightCasts& casts);
  ~WeightCastScope();
  WeightCastScope(const WeightCastScope&) = delete;
  WeightCastScope& operator=(const WeightCastScope&) = delete;

 private:
  const WeightCasts* previous_;
};

// The open scope's cast of `weight` when autocast is on and it has one; else `weight` itself (autocast casts it).
at::Tensor weight_for_matmul(const at::Tensor& weight);

}  // namespace runner::nn
