// JPEG (libjpeg-turbo) and PNG (libpng) decoding from memory into 8-bit RGB (or grayscale) pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace runner::data {

// Interleaved pixels, row-major: pixels[(y * width + x) * channels + c].
struct DecodedImage {
  int height = 0;
  int width = 0;
  int channels = 0;
  std::vector<std::uint8_t> pixels;
  void resize(int h, int w, int c) {
    height = h;
    width = w;
    channels = c;
    pixels.resize(static_cast<std::size_t>(h) * w * c);
  }
};

enum class ImageFormat { unknown, jpeg, png };
ImageFormat sniff_image_format(const std::uint8_t* data, std::size_t size);

// Decodes to 3-channel RGB as PIL's Image.convert("RGB") does: grayscale is replicated, alpha dropped,
// palettes expanded, 16-bit samples reduced to their high byte. Every malformation, truncation or
// corrupt-data warning throws DataError naming `origin`; never crashes on any input.
//
// min_shorter_side > 0 lets JPEG decoding downscale in the DCT domain (by k/8) to the smallest size whose
// shorter side is still at least that many pixels, as PIL's draft mode does; 0 decodes at full size.
void decode_image(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                  int min_shorter_side = 0);
void decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                 int min_shorter_side = 0);
void decode_png(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out);

}  // namespace runner::data
