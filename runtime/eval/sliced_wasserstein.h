// A sample-quality number that needs no download: the sliced Wasserstein distance between two image sets,
// compared as pixels at low resolution.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace runner::eval {

struct SlicedWassersteinOptions {
  std::int64_t resolution = 16;    // images are average-pooled to resolution x resolution first
  std::int64_t projections = 512;  // random unit directions
  std::uint64_t seed = 0;          // directions: torch.randn(projections, C*r*r) from a CPU generator with this seed
};

// a, b: [N, C, H, W] with the same N, C, H, W (values in any common range, e.g. [-1, 1]). Returns the mean over
// directions of the 1-D Wasserstein-1 distance between the projected sets (sorted projections compared in
// order). 0 for identical sets; grows as the distributions drift apart. Computed in float64 on the CPU.
double sliced_wasserstein(const at::Tensor& a, const at::Tensor& b, const SlicedWassersteinOptions& options = {});

}  // namespace runner::eval
