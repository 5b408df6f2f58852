// Sliced Wasserstein distance between two image sets.
#include "runtime/eval/sliced_wasserstein.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

namespace runner::eval {
namespace {

at::Tensor low_resolution_rows(const at::Tensor& images, std::int64_t resolution) {
  auto x = images.detach().to(at::kCPU).to(at::kFloat);
  if (x.size(2) != resolution || x.size(3) != resolution) x = at::adaptive_avg_pool2d(x, {resolution, resolution});
  return x.reshape({x.size(0), -1}).to(at::kDouble);
}

}  // namespace

double sliced_wasserstein(const at::Tensor& a, const at::Tensor& b, const SlicedWassersteinOptions& options) {
  if (a.dim() != 4 || a.sizes() != b.sizes()) {
    throw std::invalid_argument(fmt::format("sliced Wasserstein: both image sets must be [N, C, H, W] of the same shape, got [{}] and [{}]",
                                            fmt::join(a.sizes(), ", "), fmt::join(b.sizes(), ", ")));
  }
  if (a.size(0) < 2) throw std::invalid_argument("sliced Wasserstein: each set needs at least 2 images");
  if (options.resolution < 1 || options.resolution > a.size(2) || options.resolution > a.size(3)) {
    throw std::invalid_argument(fmt::format("sliced Wasserstein: resolution must be in 1..{}, got {}",
                                            std::min(a.size(2), a.size(3)), options.resolution));
  }
  if (options.projections < 1) throw std::invalid_argument("sliced Wasserstein: projections must be at least 1");
  at::NoGradGuard no_grad;
  const auto rows_a = low_resolution_rows(a, options.resolution);
  const auto rows_b = low_resolution_rows(b, options.resolution);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(options.seed);
  auto directions = at::randn({options.projections, rows_a.size(1)}, generator, at::TensorOptions().dtype(at::kFloat)).to(at::kDouble);
  directions = directions / directions.norm(2, {1}, true);
  const auto projected_a = std::get<0>(at::sort(at::matmul(rows_a, directions.t()), 0));
  const auto projected_b = std::get<0>(at::sort(at::matmul(rows_b, directions.t()), 0));
  return (projected_a - projected_b).abs().mean().item<double>();
}

}  // namespace runner::eval
