// A sample-quality number that needs no download: the sliced Wasserstein distance between two image sets,
// compared level by level on a Laplacian pyramid at low resolution (colours and layout on the coarsest
// level, edges and detail on the finer ones).
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>

namespace runner::eval {

struct SlicedWassersteinOptions {
  std::int64_t resolution = 16;    // images are average-pooled to resolution x resolution first
  std::int64_t projections = 512;  // random unit directions per pyramid level
  std::uint64_t seed = 0;          // directions: torch.randn(projections, D_level) per level, in level order,
                                   // from one CPU generator with this seed
};

// a, b: [N, C, H, W] with the same N, C, H, W (values in any common range, e.g. [-1, 1]).
// After pooling to r = resolution, the levels are: while the side s >= 8, the detail x - up(down(x))
// (down: 2x2 average, up: nearest) and x becomes down(x); then the remaining low-pass image. Each level,
// flattened per image and divided by the standard deviation of both sets' values at that level, is
// projected on unit directions; the level's distance is the mean over directions of the 1-D Wasserstein-1
// distance between the sorted projections. The result is the mean over levels: 0 for identical sets,
// growing as the distributions drift apart. Computed in float64 on the CPU.
double sliced_wasserstein(const at::Tensor& a, const at::Tensor& b, const SlicedWassersteinOptions& options = {});

}  // namespace runner::eval
