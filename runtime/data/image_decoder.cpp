// Dispatch of image decoding by the file's magic bytes.
#include "runtime/data/image_decoder.h"

#include <cstring>

#include "runtime/data/data_error.h"

namespace runner::data {

ImageFormat sniff_image_format(const std::uint8_t* data, std::size_t size) {
  if (size >= 3 && data[0] == 0xFF && data[1] == 0xD8 && data[2] == 0xFF) return ImageFormat::jpeg;
  static const std::uint8_t kPngMagic[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (size >= 8 && std::memcmp(data, kPngMagic, 8) == 0) return ImageFormat::png;
  return ImageFormat::unknown;
}

void decode_image(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                  const DecodeHint& hint) {
  switch (sniff_image_format(data, size)) {
    case ImageFormat::jpeg:
      return decode_jpeg(data, size, origin, out, hint);
    case ImageFormat::png:
      return decode_png(data, size, origin, out);
    case ImageFormat::unknown:
      break;
  }
  throw DataError(origin,
                  size == 0 ? "empty file, not an image" : "not a JPEG or PNG image (unrecognised first bytes)");
}

}  // namespace runner::data
