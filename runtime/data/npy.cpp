// NumPy .npy files: header parser, memory-mapped reader, atomic writer.
#include "runtime/data/npy.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cctype>
#include <cstring>
#include <limits>
#include <optional>
#include <string_view>

#include "runtime/core/atomic_file.h"
#include "runtime/data/data_error.h"
#include "runtime/data/mapped_file.h"

namespace runner::data {

static_assert(std::endian::native == std::endian::little, "the .npy reader assumes a little-endian host");

namespace {

constexpr std::string_view kMagic("\x93NUMPY", 6);
constexpr std::size_t kMaxHeaderText = 1 << 20;

struct DescrEntry {
  const char* code;  // kind + item size, e.g. "f4"
  at::ScalarType dtype;
};

constexpr std::array<DescrEntry, 14> kDescrs{{
    {"b1", at::kBool},
    {"u1", at::kByte},
    {"i1", at::kChar},
    {"i2", at::kShort},
    {"i4", at::kInt},
    {"i8", at::kLong},
    {"u2", at::kUInt16},
    {"u4", at::kUInt32},
    {"u8", at::kUInt64},
    {"f2", at::kHalf},
    {"f4", at::kFloat},
    {"f8", at::kDouble},
    {"c8", at::kComplexFloat},
    {"c16", at::kComplexDouble},
}};

[[noreturn]] void fail(const std::string& origin, const std::string& what) { throw DataError(origin, what); }

at::ScalarType dtype_of_descr(const std::string& descr, const std::string& origin) {
  if (descr.size() < 3) fail(origin, "unsupported dtype '" + descr + "'");
  const char order = descr[0];
  const std::string code = descr.substr(1);
  for (const DescrEntry& entry : kDescrs) {
    if (code != entry.code) continue;
    const bool single_byte = code == "b1" || code == "u1" || code == "i1";
    if (order == '>' && !single_byte)
      fail(origin,
           "big-endian dtype '" + descr + "' is not supported (convert with arr.astype(arr.dtype.newbyteorder('<')))");
    if (order != '<' && order != '|' && order != '=' && !(order == '>' && single_byte))
      fail(origin, "unsupported dtype '" + descr + "'");
    return entry.dtype;
  }
  fail(origin, "unsupported dtype '" + descr +
                   "' (supported: bool, int8/16/32/64, uint8/16/32/64, float16/32/64, complex64/128)");
}

// A parser for the Python dict literal of the header, e.g. {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderDictParser {
 public:
  HeaderDictParser(std::string_view text, const std::string& origin) : text_(text), origin_(origin) {}

  NpyHeader parse() {
    std::optional<std::string> descr;
    std::optional<bool> fortran_order;
    std::optional<std::vector<std::int64_t>> shape;
    expect('{');
    while (true) {
      skip_space();
      if (peek() == '}') {
        ++at_;
        break;
      }
      const std::string key = parse_string();
      expect(':');
      if (key == "descr") {
        skip_space();
        if (peek() == '[') fail(origin_, "structured dtypes are not supported");
        descr = parse_string();
      } else if (key == "fortran_order") {
        fortran_order = parse_bool();
      } else if (key == "shape") {
        shape = parse_shape();
      } else {
        fail(origin_, "unexpected key '" + key + "' in the header");
      }
      skip_space();
      if (peek() == ',') {
        ++at_;
      } else if (peek() != '}') {
        fail(origin_, "malformed header: expected ',' or '}' at byte " + std::to_string(at_));
      }
    }
    skip_space();
    if (at_ != text_.size()) fail(origin_, "malformed header: text after the closing '}'");
    if (!descr || !fortran_order || !shape) fail(origin_, "the header lacks 'descr', 'fortran_order' or 'shape'");
    if (*fortran_order && shape->size() > 1)
      fail(origin_, "Fortran-ordered arrays are not supported (save with np.ascontiguousarray)");
    NpyHeader header;
    header.dtype = dtype_of_descr(*descr, origin_);
    header.shape = std::move(*shape);
    return header;
  }

 private:
  char peek() const { return at_ < text_.size() ? text_[at_] : '\0'; }
  void skip_space() {
    while (at_ < text_.size() && (text_[at_] == ' ' || text_[at_] == '\n' || text_[at_] == '\t')) ++at_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c)
      fail(origin_, std::string("malformed header: expected '") + c + "' at byte " + std::to_string(at_));
    ++at_;
  }
  std::string parse_string() {
    skip_space();
    const char quote = peek();
    if (quote != '\'' && quote != '"')
      fail(origin_, "malformed header: expected a string at byte " + std::to_string(at_));
    const std::size_t end = text_.find(quote, at_ + 1);
    if (end == std::string_view::npos) fail(origin_, "malformed header: unterminated string");
    std::string value(text_.substr(at_ + 1, end - at_ - 1));
    at_ = end + 1;
    return value;
  }
  bool parse_bool() {
    skip_space();
    if (text_.substr(at_, 4) == "True") {
      at_ += 4;
      return true;
    }
    if (text_.substr(at_, 5) == "False") {
      at_ += 5;
      return false;
    }
    fail(origin_, "malformed header: 'fortran_order' must be True or False");
  }
  std::vector<std::int64_t> parse_shape() {
    expect('(');
    std::vector<std::int64_t> dims;
    while (true) {
      skip_space();
      if (peek() == ')') {
        ++at_;
        return dims;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek())))
        fail(origin_, "malformed header: 'shape' must be a tuple of non-negative integers");
      std::int64_t value = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (value > (std::numeric_limits<std::int64_t>::max() - 9) / 10)
          fail(origin_, "a dimension in 'shape' is too large");
        value = value * 10 + (text_[at_++] - '0');
      }
      while (peek() == 'L') ++at_;  // Python 2 long suffix
      dims.push_back(value);
      if (dims.size() > 32) fail(origin_, "'shape' has more than 32 dimensions");
      skip_space();
      if (peek() == ',')
        ++at_;
      else if (peek() != ')')
        fail(origin_, "malformed header: expected ',' or ')' in 'shape'");
    }
  }

  std::string_view text_;
  const std::string& origin_;
  std::size_t at_ = 0;
};

std::string shape_tuple_text(const std::vector<std::int64_t>& shape) {
  std::string text = "(";
  for (std::size_t i = 0; i < shape.size(); ++i) {
    text += std::to_string(shape[i]);
    if (i + 1 < shape.size() || shape.size() == 1) text += ",";
    if (i + 1 < shape.size()) text += " ";
  }
  return text + ")";
}

}  // namespace

NpyHeader parse_npy_header(const std::uint8_t* data, std::size_t size, const std::string& origin) {
  if (size < 10 || std::string_view(reinterpret_cast<const char*>(data), 6) != kMagic)
    fail(origin, "not a .npy file (the magic bytes \\x93NUMPY are missing)");
  const int major = data[6];
  std::size_t header_length = 0;
  std::size_t prefix = 0;
  if (major == 1) {
    header_length = data[8] | (std::size_t{data[9]} << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (size < 12) fail(origin, "file ends inside the header length");
    header_length =
        data[8] | (std::size_t{data[9]} << 8) | (std::size_t{data[10]} << 16) | (std::size_t{data[11]} << 24);
    prefix = 12;
  } else {
    fail(origin, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(data[7]));
  }
  if (header_length > kMaxHeaderText)
    fail(origin, "header of " + std::to_string(header_length) + " bytes is too large");
  if (prefix + header_length > size) fail(origin, "file ends inside the header (truncated?)");
  const std::string_view text(reinterpret_cast<const char*>(data + prefix), header_length);
  NpyHeader header = HeaderDictParser(text, origin).parse();
  header.data_offset = prefix + header_length;

  // Element strides must fit in int64 even when a zero dimension makes the array empty.
  const std::uint64_t item = at::elementSize(header.dtype);
  constexpr std::uint64_t kLimit = static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max());
  std::uint64_t count = 1;
  std::uint64_t extent = item;  // the product of the nonzero dimensions, in bytes
  for (std::int64_t dim : header.shape) {
    const auto size = static_cast<std::uint64_t>(dim);
    if (dim != 0 && extent > kLimit / size) fail(origin, "shape " + shape_tuple_text(header.shape) + " is too large");
    if (dim != 0) extent *= size;
    count *= size;
  }
  const std::uint64_t expected = count * item;
  const std::uint64_t available = size - header.data_offset;
  if (available != expected) {
    fail(origin, "holds " + std::to_string(available) + " bytes of data but its header (shape " +
                     shape_tuple_text(header.shape) + ", " + std::string(c10::toString(header.dtype)) + ") needs " +
                     std::to_string(expected) + (available < expected ? " (truncated?)" : ""));
  }
  header.data_bytes = static_cast<std::size_t>(expected);
  return header;
}

std::string npy_descr(at::ScalarType dtype) {
  for (const DescrEntry& entry : kDescrs) {
    if (entry.dtype != dtype) continue;
    const bool single_byte = at::elementSize(dtype) == 1;
    return std::string(single_byte ? "|" : "<") + entry.code;
  }
  throw DataError("", std::string("dtype ") + c10::toString(dtype) + " cannot be stored in a .npy file");
}

std::string npy_header_bytes(at::ScalarType dtype, const std::vector<std::int64_t>& shape, std::size_t min_length) {
  std::string dict =
      "{'descr': '" + npy_descr(dtype) + "', 'fortran_order': False, 'shape': " + shape_tuple_text(shape) + ", }";
  // Version 1 when the length fits 16 bits; the whole header is padded with spaces to a multiple of 64.
  const bool version1 = std::max(dict.size() + 1 + 10, min_length) < 65536;
  const std::size_t prefix = version1 ? 10 : 12;
  const std::size_t total = (std::max(prefix + dict.size() + 1, min_length) + 63) / 64 * 64;
  dict.resize(total - prefix - 1, ' ');
  dict += '\n';
  std::string bytes(kMagic);
  bytes += static_cast<char>(version1 ? 1 : 2);
  bytes += '\0';
  const std::size_t length = dict.size();
  bytes += static_cast<char>(length & 0xff);
  bytes += static_cast<char>((length >> 8) & 0xff);
  if (!version1) {
    bytes += static_cast<char>((length >> 16) & 0xff);
    bytes += static_cast<char>((length >> 24) & 0xff);
  }
  return bytes + dict;
}

void save_npy(const std::string& path, const at::Tensor& tensor) {
  const at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
  const std::string header = npy_header_bytes(cpu.scalar_type(), cpu.sizes().vec());
  try {
    core::AtomicFileWriter file(path);
    file.write(header.data(), header.size(), "the header");
    if (cpu.nbytes() > 0) file.write(cpu.data_ptr(), cpu.nbytes(), "the data");
    file.commit();
  } catch (const core::AtomicFileError& error) {
    throw DataError("", error.what());
  }
}

NpyArray::NpyArray(const std::string& path) : file_(std::make_unique<MappedFile>(path)) {
  header_ = parse_npy_header(file_->data(), file_->size(), path);
  if (header_.shape.empty()) throw DataError(path, "holds a scalar; a dataset needs an array of shape [N, ...]");
  row_bytes_ = header_.shape[0] == 0 ? 0 : header_.data_bytes / static_cast<std::size_t>(header_.shape[0]);
}

NpyArray::~NpyArray() = default;

const std::string& NpyArray::path() const { return file_->path(); }

std::vector<std::int64_t> NpyArray::row_shape() const {
  return std::vector<std::int64_t>(header_.shape.begin() + 1, header_.shape.end());
}

at::Tensor NpyArray::copy_rows(std::int64_t first, std::int64_t count) const {
  std::vector<std::int64_t> shape = row_shape();
  shape.insert(shape.begin(), count);
  at::Tensor rows = at::empty(shape, at::TensorOptions().dtype(header_.dtype));
  const std::size_t bytes = static_cast<std::size_t>(count) * row_bytes_;
  file_->copy(header_.data_offset + static_cast<std::size_t>(first) * row_bytes_, bytes, rows.data_ptr());
  if (header_.dtype == at::kBool) {
    const auto* values = static_cast<const std::uint8_t*>(rows.data_ptr());
    for (std::size_t i = 0; i < bytes; ++i) {
      if (values[i] > 1) {
        throw DataError(
            path(), "bool value " + std::to_string(values[i]) + " in row " +
                        std::to_string(first + static_cast<std::int64_t>(i / std::max<std::size_t>(row_bytes_, 1))) +
                        " (a bool byte must be 0 or 1)");
      }
    }
  }
  return rows;
}

}  // namespace runner::data
