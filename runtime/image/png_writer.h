// Writes 8-bit RGB or grayscale images as PNG files, atomically.
#pragma once

#include <ATen/core/Tensor.h>

#include <string>

namespace runner::image {

// pixels: uint8 [H, W, 3] (RGB) or [H, W] / [H, W, 1] (gray), any device. Throws std::invalid_argument for
// other shapes and core::AtomicFileError (naming the path) when the file cannot be written.
void write_png(const std::string& path, const at::Tensor& pixels);

}  // namespace runner::image
