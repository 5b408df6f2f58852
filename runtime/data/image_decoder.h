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
// palettes expanded, 16-bit RGB reduced to the high byte of each sample. (16-bit grayscale is reduced to its
// high byte too, where PIL clips values above 255 to 255.) Every malformation, truncation or
// corrupt-data warning throws DataError naming `origin`; never crashes on any input.
//
// min_shorter_side > 0 lets JPEG decoding downscale in the DCT domain (by 1/2, 1/4 or 1/8) to the smallest
// size whose shorter side is still at least that many pixels, as PIL's draft mode does, and to skip chroma
// interpolation when the decoded image is still larger than that; 0 decodes exactly as PIL does.
void decode_image(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                  int min_shorter_side = 0);
void decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                 int min_shorter_side = 0);
void decode_png(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out);

}  // namespace runner::data
