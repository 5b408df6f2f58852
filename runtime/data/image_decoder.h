// JPEG (libjpeg-turbo) and PNG (libpng) decoding from memory into 8-bit RGB (or grayscale) pixels.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace runner::data {

// Interleaved pixels, row-major: pixels[(y * width + x) * channels + c]. The pixels may be a window of a
// larger decoded image: rows top .. top + height - 1 and columns left .. left + width - 1 of a
// full_height x full_width image.
struct DecodedImage {
  int height = 0;
  int width = 0;
  int channels = 0;
  int full_height = 0;
  int full_width = 0;
  int top = 0;
  int left = 0;
  std::vector<std::uint8_t> pixels;
  void resize(int h, int w, int c) {
    height = full_height = h;
    width = full_width = w;
    channels = c;
    top = left = 0;
    pixels.resize(static_cast<std::size_t>(h) * w * c);
  }
};

struct PixelWindow {
  int top = 0;
  int left = 0;
  int height = 0;
  int width = 0;
};

// What the caller will use of the image, so that decoding can take shortcuts.
struct DecodeHint {
  // > 0 lets JPEG decoding downscale in the DCT domain (by 1/2, 1/4 or 1/8) to the smallest size whose
  // shorter side is still at least that many pixels, as PIL's draft mode does. 0 decodes exactly as PIL.
  int min_shorter_side = 0;
  // Called with the (scaled) image size; returns the window that will be used. JPEG decoding then stops
  // after its last row and skips the iMCU columns outside it, with the same pixels as a full decode.
  std::function<PixelWindow(int height, int width)> window;
};

enum class ImageFormat { unknown, jpeg, png };
ImageFormat sniff_image_format(const std::uint8_t* data, std::size_t size);

// Decodes to 3-channel RGB as PIL's Image.convert("RGB") does: grayscale is replicated, alpha dropped,
// palettes expanded, 16-bit RGB reduced to the high byte of each sample. (16-bit grayscale is reduced to its
// high byte too, where PIL clips values above 255 to 255.) Every malformation, truncation or
// corrupt-data warning throws DataError naming `origin`; never crashes on any input.
void decode_image(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                  const DecodeHint& hint = {});
void decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                 const DecodeHint& hint = {});
void decode_png(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out);

}  // namespace runner::data
