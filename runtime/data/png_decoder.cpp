// PNG decoding with libpng from memory into 8-bit RGB, matching PIL's convert("RGB").
#include <csetjmp>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include <png.h>

#include "runtime/data/data_error.h"
#include "runtime/data/image_decoder.h"

namespace runner::data {
namespace {

constexpr std::uint64_t kMaxPixels = 1ull << 28;

struct MemoryReader {
  const std::uint8_t* data;
  std::size_t size;
  std::size_t at;
};

struct ErrorState {
  char message[256];
};

void read_from_memory(png_structp png, png_bytep destination, png_size_t length) {
  auto* reader = static_cast<MemoryReader*>(png_get_io_ptr(png));
  if (length > reader->size - reader->at) png_error(png, "file ends early (truncated?)");
  std::memcpy(destination, reader->data + reader->at, length);
  reader->at += length;
}

void on_error(png_structp png, png_const_charp message) {
  auto* state = static_cast<ErrorState*>(png_get_error_ptr(png));
  std::snprintf(state->message, sizeof state->message, "%s", message);
  png_longjmp(png, 1);
}

void on_warning(png_structp, png_const_charp) {}

struct Decompressor {
  png_structp png = nullptr;
  png_infop info = nullptr;
  ErrorState errors{};
  MemoryReader reader{};
  std::vector<png_bytep> rows;
  ~Decompressor() { png_destroy_read_struct(&png, &info, nullptr); }
};

bool run_decode(Decompressor& d, DecodedImage& out) {
  if (setjmp(png_jmpbuf(d.png))) return false;
  png_set_read_fn(d.png, &d.reader, read_from_memory);
  png_set_user_limits(d.png, 1u << 16, 1u << 16);
  png_read_info(d.png, d.info);
  const png_uint_32 width = png_get_image_width(d.png, d.info);
  const png_uint_32 height = png_get_image_height(d.png, d.info);
  if (static_cast<std::uint64_t>(width) * height > kMaxPixels) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "%ux%u pixels is more than the limit of 2^28", width,
                  height);
    return false;
  }
  const int color_type = png_get_color_type(d.png, d.info);
  png_set_expand(d.png);  // palette -> RGB, gray < 8 bits -> 8 bits, tRNS -> alpha
  png_set_strip_16(d.png);
  png_set_strip_alpha(d.png);
  if (color_type == PNG_COLOR_TYPE_GRAY || color_type == PNG_COLOR_TYPE_GRAY_ALPHA) png_set_gray_to_rgb(d.png);
  png_set_interlace_handling(d.png);
  png_read_update_info(d.png, d.info);
  if (png_get_channels(d.png, d.info) != 3 || png_get_bit_depth(d.png, d.info) != 8) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "unsupported PNG layout");
    return false;
  }
  out.resize(static_cast<int>(height), static_cast<int>(width), 3);
  d.rows.resize(height);
  for (png_uint_32 y = 0; y < height; ++y) d.rows[y] = out.pixels.data() + static_cast<std::size_t>(y) * width * 3;
  png_read_image(d.png, d.rows.data());
  png_read_end(d.png, nullptr);
  return true;
}

}  // namespace

void decode_png(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out) {
  Decompressor d;
  d.reader = MemoryReader{data, size, 0};
  d.png = png_create_read_struct(PNG_LIBPNG_VER_STRING, &d.errors, on_error, on_warning);
  if (d.png == nullptr) throw DataError(origin, "cannot create a PNG decoder");
  d.info = png_create_info_struct(d.png);
  if (d.info == nullptr) throw DataError(origin, "cannot create a PNG decoder");
  if (!run_decode(d, out)) throw DataError(origin, std::string("corrupt or truncated PNG: ") + d.errors.message);
}

}  // namespace runner::data
