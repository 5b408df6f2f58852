// Sample grids: a batch of images tiled into one picture (torchvision's make_grid layout) and saved as PNG.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>

namespace runner::image {

struct GridOptions {
  std::int64_t columns = 8;  // images per row (fewer if the batch is smaller)
  std::int64_t padding = 2;  // pixels between images and around the border
  double low = -1.0;         // the value shown as black
  double high = 1.0;         // the value shown as white
  double pad_value = 0.0;    // border brightness in [0, 1]
};

// images [N, C, H, W] (C = 1 or 3), float (values clamped to [low, high]) or uint8; returns uint8 [H', W', C]
// on the CPU. Pixel values are round(255 * (v - low) / (high - low)) as torchvision's save_image computes.
at::Tensor make_grid(const at::Tensor& images, const GridOptions& options = {});

// make_grid + write_png: one call that writes a sample grid.
void save_grid(const std::string& path, const at::Tensor& images, const GridOptions& options = {});

}  // namespace runner::image
