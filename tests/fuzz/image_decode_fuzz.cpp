// libFuzzer target for JPEG/PNG decoding: any input must decode to h*w*3 RGB bytes covering the requested
// window, or throw DataError. The last 4 bytes choose the DCT scale target and the window.
#include "runtime/data/image_decoder.h"

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/data/data_error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 4) return 0;
  const std::uint8_t* knobs = data + size - 4;
  size -= 4;
  runner::data::DecodeHint hint;
  hint.min_shorter_side = knobs[0] & 1 ? knobs[1] : 0;
  runner::data::PixelWindow wanted;
  if (knobs[0] & 2) {
    hint.window = [&](int height, int width) {
      wanted.top = knobs[2] % std::max(height, 1);
      wanted.left = knobs[3] % std::max(width, 1);
      wanted.height = std::max(1, (height - wanted.top) / (1 + (knobs[0] >> 4)));
      wanted.width = std::max(1, (width - wanted.left) / (1 + (knobs[0] >> 6)));
      return wanted;
    };
  }
  try {
    runner::data::DecodedImage image;
    runner::data::decode_image(data, size, "fuzz", image, hint);
    if (image.height <= 0 || image.width <= 0 || image.channels != 3 ||
        image.pixels.size() != static_cast<std::size_t>(image.height) * image.width * 3)
      std::abort();
    // A JPEG window decode must cover what was asked (PNG decodes ignore windows and cover everything).
    if (hint.window && (image.top > wanted.top || image.left > wanted.left ||
                        image.top + image.height < std::min(wanted.top + wanted.height, image.full_height) ||
                        image.left + image.width < std::min(wanted.left + wanted.width, image.full_width)))
      std::abort();
  } catch (const runner::data::DataError&) {
  }
  return 0;
}
