// JPEG decoding with libjpeg-turbo: errors and corrupt-data warnings become DataError, optional DCT scaling.
#include <algorithm>
#include <csetjmp>
#include <cstdio>
#include <string>
#include <vector>

#include <jpeglib.h>
#include <jerror.h>

#include "runtime/data/data_error.h"
#include "runtime/data/image_decoder.h"

namespace runner::data {
namespace {

constexpr std::uint64_t kMaxPixels = 1ull << 28;

struct ErrorManager {
  jpeg_error_mgr base;
  std::jmp_buf jump;
  char message[JMSG_LENGTH_MAX];
};

[[noreturn]] void on_error(j_common_ptr info) {
  auto* manager = reinterpret_cast<ErrorManager*>(info->err);
  (*info->err->format_message)(info, manager->message);
  std::longjmp(manager->jump, 1);
}

// Warnings that mean the pixels are wrong (truncated or corrupt entropy data) are errors here; benign
// ones (extraneous bytes between markers, odd metadata) are ignored as PIL does.
void on_message(j_common_ptr info, int level) {
  if (level >= 0) return;
  const int code = info->err->msg_code;
  if (code == JWRN_JPEG_EOF || code == JWRN_HIT_MARKER || code == JWRN_MUST_RESYNC || code == JWRN_HUFF_BAD_CODE ||
      code == JWRN_NOT_SEQUENTIAL || code == JWRN_BOGUS_PROGRESSION) {
    on_error(info);
  }
}

// The smallest k/8 (k = 1, 2, 4: the scales libjpeg-turbo decodes with SIMD) whose scaled shorter side is
// still >= min_shorter_side.
unsigned scale_eighths(unsigned width, unsigned height, int min_shorter_side) {
  if (min_shorter_side <= 0) return 8;
  const unsigned shorter = width < height ? width : height;
  for (unsigned k = 1; k < 8; k *= 2) {
    if ((shorter * k + 7) / 8 >= static_cast<unsigned>(min_shorter_side)) return k;
  }
  return 8;
}

// Everything that may be live across setjmp/longjmp lives here, outside the function with the setjmp.
struct Decompressor {
  jpeg_decompress_struct info{};
  ErrorManager errors{};
  PixelWindow window;
  std::vector<std::uint8_t> skipped_row;
  ~Decompressor() { jpeg_destroy_decompress(&info); }
};

// Reads the next `count` scanlines into `out` as RGB rows of `width` pixels.
void read_rows(Decompressor& d, DecodedImage& out, int count, int width) {
  const int channels = d.info.output_components;
  for (int y = 0; y < count; ++y) {
    std::uint8_t* rgb = out.pixels.data() + static_cast<std::size_t>(y) * width * 3;
    if (channels == 3) {
      JSAMPROW row = rgb;
      jpeg_read_scanlines(&d.info, &row, 1);
    } else {
      // Grayscale: decode into the end of the RGB row, then replicate from left to right.
      JSAMPROW row = rgb + 2 * width;
      jpeg_read_scanlines(&d.info, &row, 1);
      for (int x = 0; x < width; ++x) {
        const std::uint8_t v = rgb[2 * width + x];
        rgb[3 * x] = v;
        rgb[3 * x + 1] = v;
        rgb[3 * x + 2] = v;
      }
    }
  }
}

// Returns false with errors.message set when libjpeg reported an error. No C++ objects with destructors
// are created between setjmp and the end of this function; the window callback runs before any row is read.
bool run_decode(Decompressor& d, const std::uint8_t* data, std::size_t size, DecodedImage& out,
                const DecodeHint& hint) {
  if (setjmp(d.errors.jump)) return false;
  jpeg_mem_src(&d.info, data, static_cast<unsigned long>(size));
  jpeg_read_header(&d.info, TRUE);
  if (d.info.jpeg_color_space == JCS_CMYK || d.info.jpeg_color_space == JCS_YCCK) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "CMYK JPEGs are not supported (convert to RGB)");
    return false;
  }
  // Checked before jpeg_start_decompress, which allocates whole-image buffers for progressive files.
  if (static_cast<std::uint64_t>(d.info.image_width) * d.info.image_height > 4 * kMaxPixels) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "%ux%u pixels is more than the limit of 2^30",
                  d.info.image_width, d.info.image_height);
    return false;
  }
  d.info.out_color_space = d.info.jpeg_color_space == JCS_GRAYSCALE ? JCS_GRAYSCALE : JCS_RGB;
  d.info.dct_method = JDCT_ISLOW;
  const int min_shorter_side = hint.min_shorter_side;
  d.info.scale_num = scale_eighths(d.info.image_width, d.info.image_height, min_shorter_side);
  d.info.scale_denom = 8;
  jpeg_start_decompress(&d.info);
  const int full_width = static_cast<int>(d.info.output_width);
  const int full_height = static_cast<int>(d.info.output_height);
  if (static_cast<std::uint64_t>(full_width) * full_height > kMaxPixels) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "%dx%d pixels is more than the limit of 2^28", full_width,
                  full_height);
    return false;
  }
  d.window = PixelWindow{0, 0, full_height, full_width};
  if (hint.window) {
    d.window = hint.window(full_height, full_width);  // may throw DataError (a crop that does not fit)
    d.window.top = std::clamp(d.window.top, 0, full_height);
    d.window.left = std::clamp(d.window.left, 0, full_width);
    d.window.height = std::clamp(d.window.height, 0, full_height - d.window.top);
    d.window.width = std::clamp(d.window.width, 0, full_width - d.window.left);
  }
  // Fancy upsampling treats the edges of a cropped column range like image edges: a margin of one iMCU
  // (up to 16 pixels, scaled) on each side keeps the window's pixels equal to those of a full decode.
  const int margin = 16 * static_cast<int>(d.info.scale_num) / 8 + 1;
  if (d.window.width + 2 * margin < full_width) {
    const int lo = std::max(d.window.left - margin, 0);
    const int hi = std::min(d.window.left + d.window.width + margin, full_width);
    JDIMENSION left = static_cast<JDIMENSION>(lo);
    JDIMENSION width = static_cast<JDIMENSION>(hi - lo);
    jpeg_crop_scanline(&d.info, &left, &width);  // widens to iMCU column boundaries
    d.window.left = static_cast<int>(left);
    d.window.width = static_cast<int>(width);
  } else {
    d.window.left = 0;
    d.window.width = full_width;
  }
  if (d.window.width != static_cast<int>(d.info.output_width)) {
    std::snprintf(d.errors.message, sizeof d.errors.message, "internal error: decoded width %u is not the window's %d",
                  d.info.output_width, d.window.width);
    return false;
  }
  out.resize(d.window.height, d.window.width, 3);
  out.full_height = full_height;
  out.full_width = full_width;
  out.top = d.window.top;
  out.left = d.window.left;
  // Rows above the window are decoded and dropped: jpeg_skip_scanlines saves no time, as the entropy
  // decoding that dominates cannot be skipped. Rows below the window are not decoded at all.
  d.skipped_row.resize(static_cast<std::size_t>(d.window.width) * 3);
  for (int y = 0; y < d.window.top; ++y) {
    JSAMPROW row = d.skipped_row.data();
    jpeg_read_scanlines(&d.info, &row, 1);
  }
  read_rows(d, out, d.window.height, d.window.width);
  if (d.info.output_scanline == d.info.output_height) {
    jpeg_finish_decompress(&d.info);
  } else {
    jpeg_abort_decompress(&d.info);  // the rows below the window are not needed
  }
  return true;
}

}  // namespace

void decode_jpeg(const std::uint8_t* data, std::size_t size, const std::string& origin, DecodedImage& out,
                 const DecodeHint& hint) {
  Decompressor d;
  d.info.err = jpeg_std_error(&d.errors.base);
  d.errors.base.error_exit = on_error;
  d.errors.base.emit_message = on_message;
  d.errors.message[0] = '\0';
  jpeg_create_decompress(&d.info);
  if (!run_decode(d, data, size, out, hint)) {
    throw DataError(origin, std::string("corrupt or truncated JPEG: ") + d.errors.message);
  }
}

}  // namespace runner::data
