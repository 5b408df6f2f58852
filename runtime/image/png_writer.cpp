// PNG encoding through libpng into memory, then one atomic file write.
#include "runtime/image/png_writer.h"

#include <ATen/ATen.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <png.h>

#include <csetjmp>
#include <stdexcept>
#include <vector>

#include "runtime/core/atomic_file.h"

namespace runner::image {
namespace {

struct Encoder {
  png_structp png = nullptr;
  png_infop info = nullptr;
  std::vector<unsigned char> bytes;
  std::string error;
  ~Encoder() { png_destroy_write_struct(&png, info ? &info : nullptr); }
};

void append(png_structp png, png_bytep data, png_size_t length) {
  auto* encoder = static_cast<Encoder*>(png_get_io_ptr(png));
  encoder->bytes.insert(encoder->bytes.end(), data, data + length);
}

void flush(png_structp) {}

void on_error(png_structp png, png_const_charp message) {
  static_cast<Encoder*>(png_get_error_ptr(png))->error = message;
  std::longjmp(png_jmpbuf(png), 1);
}

void on_warning(png_structp, png_const_charp) {}

std::vector<unsigned char> encode(const at::Tensor& pixels, int color_type) {
  Encoder encoder;
  encoder.png = png_create_write_struct(PNG_LIBPNG_VER_STRING, &encoder, on_error, on_warning);
  if (!encoder.png) throw std::runtime_error("PNG encoder could not be created");
  encoder.info = png_create_info_struct(encoder.png);
  if (!encoder.info) throw std::runtime_error("PNG encoder could not be created");
  const auto height = static_cast<png_uint_32>(pixels.size(0));
  const auto width = static_cast<png_uint_32>(pixels.size(1));
  const auto row_bytes = static_cast<std::size_t>(pixels.stride(0));
  std::vector<png_bytep> rows(height);
  auto* base = const_cast<png_bytep>(pixels.data_ptr<std::uint8_t>());
  for (png_uint_32 y = 0; y < height; ++y) rows[y] = base + y * row_bytes;
  // No C++ objects with destructors are created between setjmp and the libpng calls below.
  if (setjmp(png_jmpbuf(encoder.png))) throw std::runtime_error("PNG encoding failed: " + encoder.error);
  png_set_write_fn(encoder.png, &encoder, append, flush);
  png_set_IHDR(encoder.png, encoder.info, width, height, 8, color_type, PNG_INTERLACE_NONE,
               PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
  png_set_rows(encoder.png, encoder.info, rows.data());
  png_write_png(encoder.png, encoder.info, PNG_TRANSFORM_IDENTITY, nullptr);
  return std::move(encoder.bytes);
}

}  // namespace

void write_png(const std::string& path, const at::Tensor& pixels) {
  if (pixels.scalar_type() != at::kByte) {
    throw std::invalid_argument(
        fmt::format("write_png: pixels must be uint8, got {}", c10::toString(pixels.scalar_type())));
  }
  const bool gray = pixels.dim() == 2 || (pixels.dim() == 3 && pixels.size(2) == 1);
  const bool rgb = pixels.dim() == 3 && pixels.size(2) == 3;
  if ((!gray && !rgb) || pixels.size(0) < 1 || pixels.size(1) < 1) {
    throw std::invalid_argument(
        fmt::format("write_png: pixels must be [H, W, 3] or [H, W], got [{}]", fmt::join(pixels.sizes(), ", ")));
  }
  const auto host = pixels.to(at::kCPU).contiguous();
  const auto bytes = encode(host, gray ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB);
  core::AtomicFileWriter file(path);
  file.write(bytes.data(), bytes.size(), "PNG data");
  file.commit();
}

}  // namespace runner::image
