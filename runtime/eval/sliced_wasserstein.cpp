// Sliced Wasserstein distance between two image sets over a Laplacian pyramid.
#include "runtime/eval/sliced_wasserstein.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

namespace runner::eval {
namespace {

at::Tensor pooled(const at::Tensor& images, std::int64_t resolution) {
  auto x = images.detach().to(at::kCPU).to(at::kFloat);
  if (x.size(2) != resolution || x.size(3) != resolution) x = at::adaptive_avg_pool2d(x, {resolution, resolution});
  return x.to(at::kDouble);
}

// Detail levels from fine to coarse, then the low-pass remainder.
std::vector<at::Tensor> laplacian_levels(at::Tensor x) {
  std::vector<at::Tensor> levels;
  while (x.size(2) >= 8 && x.size(3) >= 8) {
    const auto down = at::avg_pool2d(x, {2, 2});
    levels.push_back(x - at::upsample_nearest2d(down, {x.size(2), x.size(3)}));
    x = down;
  }
  levels.push_back(x);
  return levels;
}

double level_distance(const at::Tensor& level_a, const at::Tensor& level_b, std::int64_t projections,
                      at::Generator& generator) {
  auto rows_a = level_a.reshape({level_a.size(0), -1});
  auto rows_b = level_b.reshape({level_b.size(0), -1});
  // The standard deviation of both sets' values, from sums that do not depend on the order of a and b.
  const double count = static_cast<double>(rows_a.numel() + rows_b.numel());
  const double mean = (rows_a.sum().item<double>() + rows_b.sum().item<double>()) / count;
  const double mean_square = (rows_a.square().sum().item<double>() + rows_b.square().sum().item<double>()) / count;
  const double scale = std::sqrt(std::max(0.0, mean_square - mean * mean));
  if (scale > 0) {
    rows_a = rows_a / scale;
    rows_b = rows_b / scale;
  }
  auto directions =
      at::randn({projections, rows_a.size(1)}, generator, at::TensorOptions().dtype(at::kFloat)).to(at::kDouble);
  directions = directions / directions.norm(2, {1}, true);
  const auto projected_a = std::get<0>(at::sort(at::matmul(rows_a, directions.t()), 0));
  const auto projected_b = std::get<0>(at::sort(at::matmul(rows_b, directions.t()), 0));
  return (projected_a - projected_b).abs().mean().item<double>();
}

}  // namespace

double sliced_wasserstein(const at::Tensor& a, const at::Tensor& b, const SlicedWassersteinOptions& options) {
  if (a.dim() != 4 || a.sizes() != b.sizes()) {
    throw std::invalid_argument(
        fmt::format("sliced Wasserstein: both image sets must be [N, C, H, W] of the same shape, got [{}] and [{}]",
                    fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", ")));
  }
  if (a.size(0) < 2) throw std::invalid_argument("sliced Wasserstein: each set needs at least 2 images");
  if (options.resolution < 1 || options.resolution > a.size(2) || options.resolution > a.size(3)) {
    throw std::invalid_argument(fmt::format("sliced Wasserstein: resolution must be in 1..{}, got {}",
                                            std::min(a.size(2), a.size(3)), options.resolution));
  }
  if (options.projections < 1) throw std::invalid_argument("sliced Wasserstein: projections must be at least 1");
  at::NoGradGuard no_grad;
  const auto levels_a = laplacian_levels(pooled(a, options.resolution));
  const auto levels_b = laplacian_levels(pooled(b, options.resolution));
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  double total = 0;
  for (std::size_t i = 0; i < levels_a.size(); ++i)
    total += level_distance(levels_a[i], levels_b[i], options.projections, generator);
  return total / static_cast<double>(levels_a.size());
}

}  // namespace runner::eval
