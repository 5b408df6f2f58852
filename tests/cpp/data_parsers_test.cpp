// Tests for the binary parsers in runtime/data: .npy headers, IDX, CIFAR-10 batches, JPEG/PNG decoding.
#include <ATen/ATen.h>
#include <catch2/catch.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/data/data_error.h"
#include "runtime/data/datasets.h"
#include "runtime/data/image_decoder.h"
#include "runtime/data/npy.h"

using Catch::Matchers::StartsWith;
using runner::data::DataError;
using runner::data::DecodedImage;

namespace {

using Bytes = std::vector<std::uint8_t>;

Bytes bytes_of(std::string_view text) { return Bytes(text.begin(), text.end()); }

Bytes concat(Bytes a, const Bytes& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// A .npy file image: magic, version, little-endian header length (2 bytes for version 1, else 4), the dict
// padded with spaces and a newline to a multiple of 64 bytes as NumPy writes it, then `data_size` zero bytes.
Bytes npy_file(std::string_view dict, std::size_t data_size, int version = 1) {
  const std::size_t prefix = version == 1 ? 10 : 12;
  std::string text(dict);
  text.resize((prefix + text.size() + 1 + 63) / 64 * 64 - prefix - 1, ' ');
  text += '\n';
  Bytes out = bytes_of(std::string_view("\x93NUMPY", 6));
  out.push_back(static_cast<std::uint8_t>(version));
  out.push_back(0);
  for (std::size_t i = 0; i < prefix - 8; ++i) out.push_back(static_cast<std::uint8_t>(text.size() >> (8 * i)));
  out = concat(std::move(out), bytes_of(text));
  out.resize(out.size() + data_size, 0);
  return out;
}

runner::data::NpyHeader parse_npy(const Bytes& bytes) {
  return runner::data::parse_npy_header(bytes.data(), bytes.size(), "mem");
}

std::string dict_with(std::string_view descr, std::string_view fortran, std::string_view shape) {
  return "{'descr': '" + std::string(descr) + "', 'fortran_order': " + std::string(fortran) +
         ", 'shape': " + std::string(shape) + ", }";
}

// An IDX file image: magic (0, 0, type, rank), big-endian dims, then `data_size` zero bytes.
Bytes idx_file(int type, const std::vector<std::uint32_t>& dims, std::size_t data_size) {
  Bytes out{0, 0, static_cast<std::uint8_t>(type), static_cast<std::uint8_t>(dims.size())};
  for (const std::uint32_t dim : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) out.push_back(static_cast<std::uint8_t>(dim >> shift));
  }
  out.resize(out.size() + data_size, 0);
  return out;
}

runner::data::IdxHeader parse_idx(const Bytes& bytes) {
  return runner::data::parse_idx_header(bytes.data(), bytes.size(), "mem");
}

std::int64_t parse_cifar(const Bytes& bytes) {
  return runner::data::parse_cifar10_batch(bytes.data(), bytes.size(), "mem");
}

DecodedImage decode_jpeg(const Bytes& bytes, const std::string& origin = "dir/img.jpg") {
  DecodedImage image;
  runner::data::decode_jpeg(bytes.data(), bytes.size(), origin, image);
  return image;
}

DecodedImage decode_png(const Bytes& bytes, const std::string& origin = "dir/img.png") {
  DecodedImage image;
  runner::data::decode_png(bytes.data(), bytes.size(), origin, image);
  return image;
}

DecodedImage decode_image(const Bytes& bytes, const std::string& origin = "dir/img") {
  DecodedImage image;
  runner::data::decode_image(bytes.data(), bytes.size(), origin, image);
  return image;
}

// Tiny images written once with PIL 13 (scripts in the comments), and the pixels PIL's convert("RGB") gives.
// rgb = Image.new("RGB", (4, 3)); rgb.putdata([(10, 20, 30), (40, 50, 60), ..., (255, 255, 255)])
// (the pixels of kRgbPngRgb); rgb.save(f, "PNG")
const Bytes kRgbPng = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00,
    0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x03, 0x08, 0x02, 0x00, 0x00, 0x00, 0x3b, 0x96, 0x39, 0x91, 0x00,
    0x00, 0x00, 0x1c, 0x49, 0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0xe4, 0x12, 0x91, 0x83, 0x03, 0xc6, 0xa6,
    0x9e, 0x69, 0x70, 0x0e, 0xc3, 0x7f, 0x06, 0x06, 0x08, 0xfe, 0xff, 0xff, 0x3f, 0x00, 0x81, 0xdc, 0x09,
    0xf9, 0x97, 0xa3, 0xb2, 0xdf, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
};
const Bytes kRgbPngRgb = {
    10,  20,  30,  40,  50,  60,  70,  80, 90, 100, 110, 120, 130, 140, 150, 160, 170, 180,
    190, 200, 210, 220, 230, 240, 255, 0,  0,  0,   255, 0,   0,   0,   255, 255, 255, 255,
};

// pal = Image.new("P", (4, 3)); pal.putpalette([255, 0, 0, 0, 128, 255, 12, 34, 56, 200, 200, 0])
// pal.putdata([0, 1, 2, 3, 3, 2, 1, 0, 1, 1, 2, 2]); pal.save(f, "PNG", transparency=1)  (a tRNS chunk)
const Bytes kPalettePng = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x03, 0x02, 0x03, 0x00, 0x00, 0x00, 0xc9, 0x9a, 0x46, 0x55, 0x00, 0x00, 0x00, 0x0c, 0x50,
    0x4c, 0x54, 0x45, 0xff, 0x00, 0x00, 0x00, 0x80, 0xff, 0x0c, 0x22, 0x38, 0xc8, 0xc8, 0x00, 0xa7, 0x3e, 0x7f, 0xf6,
    0x00, 0x00, 0x00, 0x02, 0x74, 0x52, 0x4e, 0x53, 0xff, 0x00, 0xe5, 0xb7, 0x30, 0x4a, 0x00, 0x00, 0x00, 0x0e, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x90, 0x66, 0x78, 0xc2, 0x10, 0x05, 0x00, 0x03, 0x93, 0x01, 0x5a, 0xb9, 0x45,
    0xa3, 0x09, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
};
const Bytes kPalettePngRgb = {
    255, 0,   0,   0,   128, 255, 12, 34,  56,  200, 200, 0,   200, 200, 0,  12, 34, 56,
    0,   128, 255, 255, 0,   0,   0,  128, 255, 0,   128, 255, 12,  34,  56, 12, 34, 56,
};

// la = Image.new("LA", (4, 3)); la.putdata([(0, 255), (50, 0), (100, 128), (150, 255), (200, 10), (250, 255),
//                                        (1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12)]); la.save(f, "PNG")
const Bytes kGrayAlphaPng = {
    0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a, 0x00, 0x00, 0x00, 0x0d, 0x49, 0x48, 0x44, 0x52, 0x00, 0x00, 0x00,
    0x04, 0x00, 0x00, 0x00, 0x03, 0x08, 0x04, 0x00, 0x00, 0x00, 0x1e, 0xfd, 0x66, 0x4d, 0x00, 0x00, 0x00, 0x23, 0x49,
    0x44, 0x41, 0x54, 0x78, 0x9c, 0x63, 0x60, 0xf8, 0x6f, 0xc4, 0x90, 0xd2, 0x30, 0xed, 0x3f, 0xc3, 0x09, 0xae, 0x5f,
    0xff, 0x19, 0x99, 0x98, 0x59, 0x18, 0x59, 0xd9, 0x98, 0x98, 0x98, 0x98, 0x98, 0x98, 0x00, 0x7a, 0xe2, 0x06, 0x98,
    0x79, 0x30, 0xb8, 0xec, 0x00, 0x00, 0x00, 0x00, 0x49, 0x45, 0x4e, 0x44, 0xae, 0x42, 0x60, 0x82,
};
const Bytes kGrayAlphaPngRgb = {
    0, 0, 0, 50, 50, 50, 100, 100, 100, 150, 150, 150, 200, 200, 200, 250, 250, 250,
    1, 1, 1, 3,  3,  3,  5,   5,   5,   7,   7,   7,   9,   9,   9,   11,  11,  11,
};

// rgb.save(f, "JPEG", quality=90, subsampling=0, optimize=True)
const Bytes kRgbJpeg = {
    0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00, 0x01, 0x00,
    0x00, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x03, 0x02, 0x02, 0x03, 0x02, 0x02, 0x03, 0x03, 0x03, 0x03, 0x04, 0x03, 0x03,
    0x04, 0x05, 0x08, 0x05, 0x05, 0x04, 0x04, 0x05, 0x0a, 0x07, 0x07, 0x06, 0x08, 0x0c, 0x0a, 0x0c, 0x0c, 0x0b, 0x0a,
    0x0b, 0x0b, 0x0d, 0x0e, 0x12, 0x10, 0x0d, 0x0e, 0x11, 0x0e, 0x0b, 0x0b, 0x10, 0x16, 0x10, 0x11, 0x13, 0x14, 0x15,
    0x15, 0x15, 0x0c, 0x0f, 0x17, 0x18, 0x16, 0x14, 0x18, 0x12, 0x14, 0x15, 0x14, 0xff, 0xdb, 0x00, 0x43, 0x01, 0x03,
    0x04, 0x04, 0x05, 0x04, 0x05, 0x09, 0x05, 0x05, 0x09, 0x14, 0x0d, 0x0b, 0x0d, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14,
    0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14,
    0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0x14,
    0x14, 0x14, 0x14, 0x14, 0x14, 0x14, 0xff, 0xc0, 0x00, 0x11, 0x08, 0x00, 0x03, 0x00, 0x04, 0x03, 0x01, 0x11, 0x00,
    0x02, 0x11, 0x01, 0x03, 0x11, 0x01, 0xff, 0xc4, 0x00, 0x14, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0xff, 0xc4, 0x00, 0x21, 0x10, 0x00, 0x01, 0x04, 0x01, 0x03,
    0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x11, 0x06, 0x07,
    0x22, 0x08, 0x12, 0x15, 0x23, 0x31, 0xff, 0xc4, 0x00, 0x14, 0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0xff, 0xc4, 0x00, 0x1e, 0x11, 0x00, 0x02, 0x02, 0x02, 0x03,
    0x01, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x02, 0x03, 0x11, 0x04, 0x05, 0x21, 0x31,
    0x51, 0x00, 0x22, 0xff, 0xda, 0x00, 0x0c, 0x03, 0x01, 0x00, 0x02, 0x11, 0x03, 0x11, 0x00, 0x3f, 0x00, 0x45, 0x74,
    0x2d, 0xb7, 0xda, 0x4f, 0x5a, 0xed, 0x7d, 0xeb, 0x97, 0x3a, 0x52, 0x86, 0x62, 0xe0, 0xdb, 0xb5, 0x16, 0x39, 0xf1,
    0x51, 0xdb, 0xec, 0x6d, 0x55, 0x90, 0x1f, 0x29, 0xe2, 0x81, 0x9f, 0x63, 0xce, 0xab, 0x27, 0x27, 0x96, 0x3e, 0x00,
    0x02, 0xe2, 0x4a, 0xf2, 0xe9, 0x75, 0xd9, 0x6e, 0x6e, 0x49, 0x52, 0x42, 0xc7, 0xd2, 0xb9, 0x39, 0x11, 0x8e, 0x3a,
    0x14, 0x88, 0xa3, 0x80, 0x3a, 0xb3, 0xc9, 0x24, 0x9c, 0xd1, 0xaa, 0x6c, 0xb6, 0x38, 0xea, 0x3f, 0x11, 0x65, 0x64,
    0xc6, 0xa3, 0xc4, 0x8e, 0x79, 0x11, 0x07, 0xa6, 0x95, 0x40, 0xb3, 0x64, 0xd5, 0x92, 0x4f, 0x3f, 0x7f, 0xff, 0xd9,
};
const Bytes kRgbJpegRgb = {
    11,  23,  35,  28,  49,  66,  55,  78, 110, 106, 105, 113, 130, 137, 143, 164, 165, 183,
    199, 204, 208, 216, 234, 222, 255, 8,  6,   0,   255, 0,   0,   0,   249, 249, 255, 255,
};

// rgb.convert("L").save(f, "JPEG", quality=90, optimize=True)
const Bytes kGrayJpeg = {
    0xff, 0xd8, 0xff, 0xe0, 0x00, 0x10, 0x4a, 0x46, 0x49, 0x46, 0x00, 0x01, 0x01, 0x00, 0x00, 0x01, 0x00, 0x01,
    0x00, 0x00, 0xff, 0xdb, 0x00, 0x43, 0x00, 0x03, 0x02, 0x02, 0x03, 0x02, 0x02, 0x03, 0x03, 0x03, 0x03, 0x04,
    0x03, 0x03, 0x04, 0x05, 0x08, 0x05, 0x05, 0x04, 0x04, 0x05, 0x0a, 0x07, 0x07, 0x06, 0x08, 0x0c, 0x0a, 0x0c,
    0x0c, 0x0b, 0x0a, 0x0b, 0x0b, 0x0d, 0x0e, 0x12, 0x10, 0x0d, 0x0e, 0x11, 0x0e, 0x0b, 0x0b, 0x10, 0x16, 0x10,
    0x11, 0x13, 0x14, 0x15, 0x15, 0x15, 0x0c, 0x0f, 0x17, 0x18, 0x16, 0x14, 0x18, 0x12, 0x14, 0x15, 0x14, 0xff,
    0xc0, 0x00, 0x0b, 0x08, 0x00, 0x03, 0x00, 0x04, 0x01, 0x01, 0x11, 0x00, 0xff, 0xc4, 0x00, 0x14, 0x00, 0x01,
    0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x08, 0xff, 0xc4,
    0x00, 0x21, 0x10, 0x00, 0x01, 0x04, 0x01, 0x03, 0x05, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    0x00, 0x01, 0x02, 0x03, 0x04, 0x05, 0x11, 0x06, 0x07, 0x22, 0x08, 0x12, 0x15, 0x23, 0x31, 0xff, 0xda, 0x00,
    0x08, 0x01, 0x01, 0x00, 0x00, 0x3f, 0x00, 0x45, 0x74, 0x2d, 0xb7, 0xda, 0x4f, 0x5a, 0xed, 0x7d, 0xeb, 0x97,
    0x3a, 0x52, 0x86, 0x62, 0xe0, 0xdb, 0xb5, 0x16, 0x39, 0xf1, 0x51, 0xdb, 0xec, 0x6d, 0x55, 0x90, 0x1f, 0x29,
    0xe2, 0x81, 0x9f, 0x63, 0xce, 0xab, 0x27, 0x27, 0x96, 0x3e, 0x00, 0x07, 0xff, 0xd9,
};
const Bytes kGrayJpegRgb = {
    21,  21,  21,  45,  45,  45,  75, 75, 75, 106, 106, 106, 136, 136, 136, 167, 167, 167,
    203, 203, 203, 227, 227, 227, 82, 82, 82, 148, 148, 148, 26,  26,  26,  255, 255, 255,
};

}  // namespace

// ---- .npy ----------------------------------------------------------------------------------------

TEST_CASE("npy: header bytes round-trip through the parser for every shape rank", "[data]") {
  struct Case {
    at::ScalarType dtype;
    std::vector<std::int64_t> shape;
    std::string descr;
    std::string shape_text;
  };
  const std::vector<Case> cases = {
      {at::kFloat, {}, "<f4", "()"},
      {at::kByte, {5}, "|u1", "(5,)"},
      {at::kDouble, {2, 3}, "<f8", "(2, 3)"},
      {at::kLong, {0}, "<i8", "(0,)"},
      {at::kHalf, {2, 1, 3}, "<f2", "(2, 1, 3)"},
      {at::kBool, {3}, "|b1", "(3,)"},
      {at::kChar, {4, 0, 2}, "|i1", "(4, 0, 2)"},
      {at::kShort, {1, 1, 1, 1}, "<i2", "(1, 1, 1, 1)"},
      {at::kInt, {7}, "<i4", "(7,)"},
      {at::kComplexFloat, {2}, "<c8", "(2,)"},
      {at::kComplexDouble, {}, "<c16", "()"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.descr, c.shape_text);
    const std::string header = runner::data::npy_header_bytes(c.dtype, c.shape);
    CHECK(header.size() % 64 == 0);
    CHECK(header.substr(0, 8) == std::string("\x93NUMPY\x01\x00", 8));
    CHECK(static_cast<std::size_t>(static_cast<std::uint8_t>(header[8]) | static_cast<std::uint8_t>(header[9]) << 8) ==
          header.size() - 10);
    CHECK(header.back() == '\n');
    CHECK(header.find("{'descr': '" + c.descr + "', 'fortran_order': False, 'shape': " + c.shape_text + ", }") == 10);

    std::int64_t count = 1;
    for (const std::int64_t dim : c.shape) count *= dim;
    const std::size_t data_bytes = static_cast<std::size_t>(count) * at::elementSize(c.dtype);
    Bytes file = bytes_of(header);
    file.resize(file.size() + data_bytes, 0xAB);
    const runner::data::NpyHeader parsed = parse_npy(file);
    CHECK(parsed.dtype == c.dtype);
    CHECK(parsed.shape == c.shape);
    CHECK(parsed.data_offset == header.size());
    CHECK(parsed.data_bytes == data_bytes);
  }
}

TEST_CASE("npy: headers as NumPy writes them are accepted in all versions", "[data]") {
  const std::string dict = dict_with("<f4", "False", "(2, 3)");
  for (const int version : {1, 2, 3}) {
    const runner::data::NpyHeader header = parse_npy(npy_file(dict, 24, version));
    CHECK(header.dtype == at::kFloat);
    CHECK(header.shape == std::vector<std::int64_t>{2, 3});
    CHECK(header.data_offset == 128);
    CHECK(header.data_bytes == 24);
  }
  // Double quotes, any key order, no trailing comma, Python 2 long suffixes, single-byte '>' and '=' orders.
  CHECK(parse_npy(npy_file(R"({"shape": (3L,), "fortran_order": False, "descr": "<i2"})", 6)).dtype == at::kShort);
  CHECK(parse_npy(npy_file(dict_with(">u1", "False", "(4,)"), 4)).dtype == at::kByte);
  CHECK(parse_npy(npy_file(dict_with("=f8", "False", "(1,)"), 8)).dtype == at::kDouble);
  // Fortran order is the same layout for 0-d and 1-d arrays.
  CHECK(parse_npy(npy_file(dict_with("<f4", "True", "(5,)"), 20)).shape == std::vector<std::int64_t>{5});
}

TEST_CASE("npy: malformed headers are rejected with a message saying what is wrong", "[data]") {
  const std::string dict = dict_with("<f4", "False", "(2, 3)");
  SECTION("bad magic") {
    REQUIRE_THROWS_AS(parse_npy(bytes_of("PK\x03\x04 not a numpy file")), DataError);
    REQUIRE_THROWS_WITH(parse_npy(bytes_of("PK\x03\x04 not a numpy file")),
                        "mem: not a .npy file (the magic bytes \\x93NUMPY are missing)");
    REQUIRE_THROWS_WITH(parse_npy(bytes_of(std::string_view("\x93NUMPY\x01\x00\x10", 9))),
                        "mem: not a .npy file (the magic bytes \\x93NUMPY are missing)");
    REQUIRE_THROWS_WITH(parse_npy({}), "mem: not a .npy file (the magic bytes \\x93NUMPY are missing)");
  }
  SECTION("unsupported version") {
    Bytes file = npy_file(dict, 24);
    file[6] = 4;
    file[7] = 1;
    REQUIRE_THROWS_WITH(parse_npy(file), "mem: unsupported .npy format version 4.1");
    file[6] = 0;
    REQUIRE_THROWS_WITH(parse_npy(file), "mem: unsupported .npy format version 0.1");
  }
  SECTION("truncated header") {
    const Bytes file = npy_file(dict, 24);
    for (const int keep : {127, 60, 10}) {
      CAPTURE(keep);
      REQUIRE_THROWS_WITH(parse_npy(Bytes(file.begin(), file.begin() + keep)),
                          "mem: file ends inside the header (truncated?)");
    }
    const Bytes v2 = npy_file(dict, 24, 2);
    REQUIRE_THROWS_WITH(parse_npy(Bytes(v2.begin(), v2.begin() + 11)), "mem: file ends inside the header length");
    Bytes huge = v2;
    huge[10] = 0x20;  // header length 0x200000 + ...
    REQUIRE_THROWS_WITH(parse_npy(huge), "mem: header of 2097268 bytes is too large");
  }
  SECTION("missing key") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file("{'descr': '<f4', 'shape': (2, 3), }", 24)),
                        "mem: the header lacks 'descr', 'fortran_order' or 'shape'");
    REQUIRE_THROWS_WITH(parse_npy(npy_file("{}", 4)), "mem: the header lacks 'descr', 'fortran_order' or 'shape'");
  }
  SECTION("unknown key") {
    REQUIRE_THROWS_WITH(
        parse_npy(npy_file("{'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), 'extra': 1}", 24)),
        "mem: unexpected key 'extra' in the header");
  }
  SECTION("big-endian dtype") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with(">f4", "False", "(2, 3)"), 24)),
                        "mem: big-endian dtype '>f4' is not supported "
                        "(convert with arr.astype(arr.dtype.newbyteorder('<')))");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with(">i8", "False", "(3,)"), 24)),
                        StartsWith("mem: big-endian dtype '>i8' is not supported"));
  }
  SECTION("unsupported dtypes") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<U4", "False", "(2,)"), 32)),
                        "mem: unsupported dtype '<U4' (supported: bool, int8/16/32/64, uint8/16/32/64, float16/32/64, "
                        "complex64/128)");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("|O", "False", "(2,)"), 16)), "mem: unsupported dtype '|O'");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("!f4", "False", "(2,)"), 8)), "mem: unsupported dtype '!f4'");
  }
  SECTION("Fortran order") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<f4", "True", "(2, 3)"), 24)),
                        "mem: Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
  }
  SECTION("structured dtype") {
    REQUIRE_THROWS_WITH(
        parse_npy(npy_file("{'descr': [('x', '<f4'), ('y', '<i4')], 'fortran_order': False, 'shape': (2,), }", 16)),
        "mem: structured dtypes are not supported");
  }
  SECTION("shape overflow") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("|u1", "False", "(4294967296, 4294967296)"), 0)),
                        "mem: shape (4294967296, 4294967296) is too large");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<f8", "False", "(4611686018427387904,)"), 0)),
                        "mem: shape (4611686018427387904,) is too large");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<f4", "False", "(99999999999999999999,)"), 0)),
                        "mem: a dimension in 'shape' is too large");
  }
  SECTION("malformed dict text") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<f4", "false", "(2, 3)"), 24)),
                        "mem: malformed header: 'fortran_order' must be True or False");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<f4", "False", "(2, -3)"), 24)),
                        "mem: malformed header: 'shape' must be a tuple of non-negative integers");
    REQUIRE_THROWS_WITH(parse_npy(npy_file("{'descr: '<f4'}", 0)), "mem: malformed header: expected ':' at byte 10");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict + " x", 24)), "mem: malformed header: text after the closing '}'");
  }
  SECTION("data shorter or longer than the header says") {
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict, 20)),
                        "mem: holds 20 bytes of data but its header (shape (2, 3), Float) needs 24 (truncated?)");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict_with("<i8", "False", "()"), 0)),
                        "mem: holds 0 bytes of data but its header (shape (), Long) needs 8 (truncated?)");
    REQUIRE_THROWS_WITH(parse_npy(npy_file(dict, 28)),
                        "mem: holds 28 bytes of data but its header (shape (2, 3), Float) needs 24");
  }
}

// ---- IDX -----------------------------------------------------------------------------------------

TEST_CASE("idx: a valid file parses to its type, shape and data offset", "[data]") {
  const runner::data::IdxHeader images = parse_idx(idx_file(0x08, {2, 3, 4}, 24));
  CHECK(images.type_code == 0x08);
  CHECK(images.shape == std::vector<std::int64_t>{2, 3, 4});
  CHECK(images.data_offset == 16);
  const runner::data::IdxHeader doubles = parse_idx(idx_file(0x0E, {3}, 24));
  CHECK(doubles.type_code == 0x0E);
  CHECK(doubles.shape == std::vector<std::int64_t>{3});
  CHECK(doubles.data_offset == 8);
  CHECK(parse_idx(idx_file(0x08, {0, 28, 28}, 0)).shape == std::vector<std::int64_t>{0, 28, 28});
}

TEST_CASE("idx: malformed files are rejected with a message saying what is wrong", "[data]") {
  SECTION("bad magic") {
    REQUIRE_THROWS_AS(parse_idx(bytes_of("\x1f\x8b\x08\x00 gzip")), DataError);
    REQUIRE_THROWS_WITH(parse_idx(bytes_of("\x1f\x8b\x08\x00 gzip")), "mem: not an IDX file (bad magic number)");
    REQUIRE_THROWS_WITH(parse_idx(Bytes{0, 0, 8}), "mem: not an IDX file (bad magic number)");
  }
  SECTION("unknown element type") {
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x07, {4}, 4)), "mem: unknown IDX element type 0x07");
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0xFF, {4}, 4)), "mem: unknown IDX element type 0xff");
  }
  SECTION("rank") {
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {}, 0)), "mem: IDX file with 0 dimensions");
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {1, 1, 1, 1, 1, 1, 1, 1, 1}, 1)), "mem: IDX file with 9 dimensions");
  }
  SECTION("truncated") {
    const Bytes file = idx_file(0x08, {2, 28, 28}, 2 * 28 * 28);
    REQUIRE_THROWS_WITH(parse_idx(Bytes(file.begin(), file.begin() + 10)),
                        "mem: file ends inside the IDX header (truncated?)");
    REQUIRE_THROWS_WITH(parse_idx(Bytes(file.begin(), file.end() - 1)),
                        "mem: holds 1567 bytes of data but its header needs 1568 (truncated?)");
  }
  SECTION("size mismatch") {
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {2, 2, 2}, 9)), "mem: holds 9 bytes of data but its header needs 8");
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x0C, {3}, 3)),
                        "mem: holds 3 bytes of data but its header needs 12 (truncated?)");
  }
  SECTION("dimensions too large") {
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {0x80000000u}, 0)), "mem: IDX dimension 2147483648 is too large");
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {0x7fffffff, 0x7fffffff}, 0)), "mem: IDX shape is too large");
    // 2^20 * 2^20 * 2^24 elements is 2^64: the count must not wrap around to 0 and match an empty file.
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {1u << 20, 1u << 20, 1u << 24}, 0)), "mem: IDX shape is too large");
    REQUIRE_THROWS_WITH(parse_idx(idx_file(0x08, {1u << 20, 1u << 20, 1u << 24, 0}, 0)), "mem: IDX shape is too large");
    // What idx_fuzz found: 2^11 * 2^27 * 2^28 elements wrapped to 0, so the 16-byte header alone was accepted.
    REQUIRE_THROWS_WITH(parse_idx(Bytes{0, 0, 8, 3, 0, 0, 8, 0, 8, 0, 0, 0, 0x10, 0, 0, 0}),
                        "mem: IDX shape is too large");
  }
}

// ---- CIFAR-10 ------------------------------------------------------------------------------------

TEST_CASE("cifar10: batches are validated record by record", "[data]") {
  Bytes two(2 * 3073, 0x80);
  two[0] = 3;
  two[3073] = 9;
  CHECK(parse_cifar(two) == 2);

  REQUIRE_THROWS_AS(parse_cifar({}), DataError);
  REQUIRE_THROWS_WITH(parse_cifar({}), "mem: empty file, not a CIFAR-10 batch");
  REQUIRE_THROWS_WITH(parse_cifar(Bytes(two.begin(), two.end() - 1)),
                      "mem: size 6145 is not a multiple of the 3073-byte CIFAR-10 record "
                      "(truncated, or not the binary version?)");
  REQUIRE_THROWS_WITH(parse_cifar(Bytes(3072, 0)),
                      "mem: size 3072 is not a multiple of the 3073-byte CIFAR-10 record "
                      "(truncated, or not the binary version?)");
  two[3073] = 10;
  REQUIRE_THROWS_WITH(parse_cifar(two), "mem: record 1 has label 10 (CIFAR-10 labels are 0..9; is this CIFAR-100?)");
}

// ---- JPEG and PNG --------------------------------------------------------------------------------

TEST_CASE("png: RGB, palette and grayscale+alpha images decode to PIL's convert('RGB') pixels", "[data]") {
  const std::vector<std::pair<const Bytes*, const Bytes*>> images = {
      {&kRgbPng, &kRgbPngRgb}, {&kPalettePng, &kPalettePngRgb}, {&kGrayAlphaPng, &kGrayAlphaPngRgb}};
  for (std::size_t i = 0; i < images.size(); ++i) {
    CAPTURE(i);
    for (const DecodedImage& image : {decode_png(*images[i].first), decode_image(*images[i].first)}) {
      CHECK(image.height == 3);
      CHECK(image.width == 4);
      CHECK(image.channels == 3);
      CHECK(image.pixels == *images[i].second);
    }
  }
}

TEST_CASE("jpeg: RGB and grayscale images decode to PIL's convert('RGB') pixels", "[data]") {
  for (const auto& [jpeg, rgb] : {std::pair{&kRgbJpeg, &kRgbJpegRgb}, std::pair{&kGrayJpeg, &kGrayJpegRgb}}) {
    for (const DecodedImage& image : {decode_jpeg(*jpeg), decode_image(*jpeg)}) {
      CHECK(image.height == 3);
      CHECK(image.width == 4);
      CHECK(image.channels == 3);
      CHECK(image.pixels == *rgb);
    }
  }
}

TEST_CASE("jpeg and png: truncated and garbage files throw DataError naming the file", "[data]") {
  SECTION("truncated JPEG") {
    for (const std::size_t keep : {kRgbJpeg.size() - 2, kRgbJpeg.size() / 2, std::size_t{100}, std::size_t{3}}) {
      CAPTURE(keep);
      const Bytes cut(kRgbJpeg.begin(), kRgbJpeg.begin() + static_cast<std::ptrdiff_t>(keep));
      REQUIRE_THROWS_AS(decode_jpeg(cut), DataError);
      REQUIRE_THROWS_WITH(decode_jpeg(cut), StartsWith("dir/img.jpg: corrupt or truncated JPEG: "));
      REQUIRE_THROWS_WITH(decode_image(cut, "a/b.jpeg"), StartsWith("a/b.jpeg: corrupt or truncated JPEG: "));
    }
    const Bytes cut(kRgbJpeg.begin(), kRgbJpeg.begin() + static_cast<std::ptrdiff_t>(kRgbJpeg.size() / 2));
    REQUIRE_THROWS_WITH(decode_jpeg(cut), "dir/img.jpg: corrupt or truncated JPEG: Premature end of JPEG file");
  }
  SECTION("garbage JPEG") {
    Bytes garbage{0xFF, 0xD8, 0xFF};
    for (int i = 0; i < 200; ++i) garbage.push_back(static_cast<std::uint8_t>(i * 37 + 11));
    REQUIRE_THROWS_WITH(decode_jpeg(garbage), StartsWith("dir/img.jpg: corrupt or truncated JPEG: "));
    REQUIRE_THROWS_WITH(decode_image(garbage), StartsWith("dir/img: corrupt or truncated JPEG: "));
    REQUIRE_THROWS_WITH(decode_jpeg(kRgbPng),
                        "dir/img.jpg: corrupt or truncated JPEG: Not a JPEG file: starts with 0x89 0x50");
    REQUIRE_THROWS_WITH(decode_jpeg({}), StartsWith("dir/img.jpg: corrupt or truncated JPEG: "));
    Bytes corrupt = kRgbJpeg;  // entropy-coded data overwritten
    for (std::size_t i = corrupt.size() - 60; i < corrupt.size() - 2; ++i) corrupt[i] = 0xFF;
    REQUIRE_THROWS_WITH(decode_jpeg(corrupt), StartsWith("dir/img.jpg: corrupt or truncated JPEG: "));
  }
  SECTION("truncated PNG") {
    for (const std::size_t keep : {kRgbPng.size() - 1, kRgbPng.size() - 13, std::size_t{40}, std::size_t{8}}) {
      CAPTURE(keep);
      const Bytes cut(kRgbPng.begin(), kRgbPng.begin() + static_cast<std::ptrdiff_t>(keep));
      REQUIRE_THROWS_AS(decode_png(cut), DataError);
      REQUIRE_THROWS_WITH(decode_png(cut), StartsWith("dir/img.png: corrupt or truncated PNG: "));
      REQUIRE_THROWS_WITH(decode_image(cut, "a/b.png"), StartsWith("a/b.png: corrupt or truncated PNG: "));
    }
    const Bytes cut(kRgbPng.begin(), kRgbPng.begin() + 40);
    REQUIRE_THROWS_WITH(decode_png(cut), "dir/img.png: corrupt or truncated PNG: file ends early (truncated?)");
  }
  SECTION("garbage PNG") {
    Bytes garbage(kRgbPng.begin(), kRgbPng.begin() + 8);
    for (int i = 0; i < 200; ++i) garbage.push_back(static_cast<std::uint8_t>(i * 37 + 11));
    REQUIRE_THROWS_WITH(decode_png(garbage), StartsWith("dir/img.png: corrupt or truncated PNG: "));
    REQUIRE_THROWS_WITH(decode_image(garbage), StartsWith("dir/img: corrupt or truncated PNG: "));
    REQUIRE_THROWS_WITH(decode_png(kRgbJpeg), StartsWith("dir/img.png: corrupt or truncated PNG: "));
    REQUIRE_THROWS_WITH(decode_png({}), StartsWith("dir/img.png: corrupt or truncated PNG: "));
    Bytes corrupt = kRgbPng;  // a flipped bit in the image data fails the chunk's CRC
    corrupt[corrupt.size() - 20] ^= 0x01;
    REQUIRE_THROWS_WITH(decode_png(corrupt), StartsWith("dir/img.png: corrupt or truncated PNG: "));
  }
}

TEST_CASE("decode_image: files that are neither JPEG nor PNG", "[data]") {
  REQUIRE_THROWS_AS(decode_image(bytes_of("GIF89a...")), DataError);
  REQUIRE_THROWS_WITH(decode_image(bytes_of("GIF89a..."), "x/y.gif"),
                      "x/y.gif: not a JPEG or PNG image (unrecognised first bytes)");
  REQUIRE_THROWS_WITH(decode_image(Bytes{0xFF, 0xD8}), "dir/img: not a JPEG or PNG image (unrecognised first bytes)");
  REQUIRE_THROWS_WITH(decode_image(Bytes(kRgbPng.begin(), kRgbPng.begin() + 7)),
                      "dir/img: not a JPEG or PNG image (unrecognised first bytes)");
  REQUIRE_THROWS_WITH(decode_image({}), "dir/img: empty file, not an image");
}
