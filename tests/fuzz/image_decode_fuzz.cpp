// libFuzzer target for JPEG/PNG decoding: any input must decode to h*w*3 RGB bytes or throw DataError.
#include "runtime/data/image_decoder.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "runtime/data/data_error.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    runner::data::DecodedImage image;
    runner::data::decode_image(data, size, "fuzz", image);
    if (image.height <= 0 || image.width <= 0 || image.channels != 3 ||
        image.pixels.size() != static_cast<std::size_t>(image.height) * image.width * 3)
      std::abort();
  } catch (const runner::data::DataError&) {
  }
  return 0;
}
