// Tiling a batch of images into a grid, as torchvision's make_grid and save_image do.
#include "runtime/image/image_grid.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <stdexcept>

#include "runtime/image/png_writer.h"

namespace runner::image {

at::Tensor make_grid(const at::Tensor& images, const GridOptions& options) {
  if (images.dim() != 4 || (images.size(1) != 1 && images.size(1) != 3) || images.size(0) < 1) {
    throw std::invalid_argument(fmt::format("image grid: images must be [N, 1 or 3, H, W] with N >= 1, got [{}]",
                                            fmt::join(images.sizes(), ", ")));
  }
  if (options.columns < 1)
    throw std::invalid_argument(fmt::format("image grid: columns must be at least 1, got {}", options.columns));
  if (options.padding < 0)
    throw std::invalid_argument(fmt::format("image grid: padding must be 0 or more, got {}", options.padding));
  if (!(options.high > options.low)) {
    throw std::invalid_argument(
        fmt::format("image grid: value range must have low < high, got [{}, {}]", options.low, options.high));
  }
  at::NoGradGuard no_grad;
  at::Tensor unit;  // values in [0, 1], float32 on the CPU
  if (images.scalar_type() == at::kByte) {
    unit = images.to(at::kCPU).to(at::kFloat) / 255.0;
  } else {
    unit = (images.detach().to(at::kCPU).to(at::kFloat).clamp(options.low, options.high) - options.low) /
           (options.high - options.low);
  }
  const auto count = unit.size(0), channels = unit.size(1), height = unit.size(2), width = unit.size(3);
  const auto pad = count == 1 ? 0 : options.padding;  // a single image is saved as it is, as torchvision does
  const auto columns = std::min(options.columns, count);
  const auto rows = (count + columns - 1) / columns;
  auto grid = at::full({channels, rows * (height + pad) + pad, columns * (width + pad) + pad}, options.pad_value,
                       unit.options());
  for (std::int64_t i = 0; i < count; ++i) {
    const auto row = i / columns, column = i % columns;
    grid.narrow(1, row * (height + pad) + pad, height).narrow(2, column * (width + pad) + pad, width).copy_(unit[i]);
  }
  return grid.mul(255).add_(0.5).clamp_(0, 255).permute({1, 2, 0}).to(at::kByte).contiguous();
}

void save_grid(const std::string& path, const at::Tensor& images, const GridOptions& options) {
  write_png(path, make_grid(images, options));
}

}  // namespace runner::image
