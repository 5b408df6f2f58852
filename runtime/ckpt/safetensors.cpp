// Reading, validating and atomically writing safetensors files.
#include "runtime/ckpt/safetensors.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <functional>
#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>
#include <set>
#include <string_view>
#include <tuple>
#include <utility>
#include <unordered_set>

#include "runtime/core/atomic_file.h"

namespace runner::ckpt {

static_assert(std::endian::native == std::endian::little,
              "safetensors stores little-endian data; big-endian hosts are not supported");

namespace {

constexpr std::size_t kLengthFieldBytes = 8;
constexpr std::uint64_t kMaxHeaderBytes = 100'000'000;  // the reference implementation's limit
constexpr int kMaxJsonNesting = 128;                    // serde_json's recursion limit
constexpr std::size_t kMaxIoChunk = std::size_t{1} << 30;

struct DtypeInfo {
  std::string_view name;
  at::ScalarType scalar_type;
  std::uint64_t element_bytes;
};

constexpr std::array<DtypeInfo, 12> kDtypes{{
    {"F64", at::kDouble, 8},
    {"F32", at::kFloat, 4},
    {"F16", at::kHalf, 2},
    {"BF16", at::kBFloat16, 2},
    {"I64", at::kLong, 8},
    {"I32", at::kInt, 4},
    {"I16", at::kShort, 2},
    {"I8", at::kChar, 1},
    {"U8", at::kByte, 1},
    {"BOOL", at::kBool, 1},
    {"F8_E4M3", at::kFloat8_e4m3fn, 1},
    {"F8_E5M2", at::kFloat8_e5m2, 1},
}};

const DtypeInfo* dtype_by_name(std::string_view name) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

const DtypeInfo* dtype_by_scalar_type(at::ScalarType scalar_type) {
  for (const DtypeInfo& info : kDtypes) {
    if (info.scalar_type == scalar_type) return &info;
  }
  return nullptr;
}

[[noreturn]] void fail(const std::string& origin, const std::string& what) {
  throw SafetensorsError(origin + ": " + what);
}

std::string tensor_label(const std::string& name) { return "tensor '" + name + "'"; }

template <typename Integers>
std::string bracketed(const Integers& values) {
  std::string text = "[";
  bool first = true;
  for (auto value : values) {
    if (!first) text += ", ";
    text += std::to_string(value);
    first = false;
  }
  return text + "]";
}

std::string offsets_text(std::uint64_t begin, std::uint64_t end) {
  return bracketed(std::array<std::uint64_t, 2>{begin, end});
}

std::string errno_text(int error_number) { return std::strerror(error_number); }

// One tensor of a validated header; offsets are relative to the data section.
struct TensorEntry {
  std::string name;
  const DtypeInfo* dtype = nullptr;
  std::vector<std::int64_t> shape;
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};

struct Header {
  std::vector<TensorEntry> entries;  // sorted by data offset
  std::map<std::string, std::string> metadata;
};

void check_file_size(std::uint64_t file_size, const std::string& origin) {
  if (file_size < kLengthFieldBytes) {
    fail(origin, "file is " + std::to_string(file_size) + " bytes, too small for the 8-byte header length");
  }
}

// Decodes and bounds-checks the header length field; returns the header length in bytes.
std::uint64_t read_header_length(const std::uint8_t* length_field, std::uint64_t file_size, const std::string& origin) {
  std::uint64_t header_length = 0;
  std::memcpy(&header_length, length_field, sizeof header_length);
  const bool zip = std::memcmp(length_field, "PK\x03\x04", 4) == 0;
  // torch.save's legacy format opens with the pickled magic number: PROTO 2, LONG1 of 10 bytes.
  const bool pickle = std::memcmp(length_field, "\x80\x02\x8a\x0a", 4) == 0;
  if (zip || pickle) {
    fail(origin, std::string(zip ? "is a zip archive (PyTorch's torch.save format: .pt, .pth, .ckpt)"
                                 : "is a Python pickle (PyTorch's legacy torch.save format)") +
                     ", not safetensors; convert it in Python: from safetensors.torch import save_file; "
                     "save_file(torch.load(path, map_location='cpu'), 'model.safetensors') (for a training "
                     "checkpoint, save its state_dict entry)");
  }
  if (header_length > kMaxHeaderBytes) {
    fail(origin, "header length " + std::to_string(header_length) + " exceeds the limit of " +
                     std::to_string(kMaxHeaderBytes) + " bytes");
  }
  if (header_length > file_size - kLengthFieldBytes) {
    fail(origin, "header length " + std::to_string(header_length) + " exceeds file size " + std::to_string(file_size));
  }
  return header_length;
}

// Parses JSON text, rejecting duplicate keys (nlohmann keeps the last one silently) and deep nesting.
nlohmann::json parse_json_rejecting_duplicates(std::string_view text, const std::string& origin) {
  using Event = nlohmann::json::parse_event_t;
  std::vector<std::unordered_set<std::string>> keys_of_open_objects;
  int nesting = 0;
  auto on_event = [&](int /*depth*/, Event event, nlohmann::json& parsed) {
    switch (event) {
      case Event::object_start:
      case Event::array_start:
        if (++nesting > kMaxJsonNesting) {
          fail(origin, "header nests deeper than " + std::to_string(kMaxJsonNesting) + " levels");
        }
        if (event == Event::object_start) keys_of_open_objects.emplace_back();
        break;
      case Event::object_end:
        keys_of_open_objects.pop_back();
        --nesting;
        break;
      case Event::array_end:
        --nesting;
        break;
      case Event::key: {
        const auto& key = parsed.get_ref<const std::string&>();
        if (!keys_of_open_objects.back().insert(key).second) fail(origin, "header has duplicate key '" + key + "'");
        break;
      }
      case Event::value:
        break;
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text.begin(), text.end(), on_event);
  } catch (const nlohmann::json::exception& error) {  // parse_error, or out_of_range for a number like 1e400
    std::string_view reason = error.what();
    if (const auto bracket_end = reason.find("] ");
        reason.starts_with("[json.exception") && bracket_end != reason.npos) {
      reason.remove_prefix(bracket_end + 2);
    }
    fail(origin, "header is not valid JSON: " + std::string(reason));
  }
}

std::map<std::string, std::string> parse_metadata(const nlohmann::json& value, const std::string& origin) {
  if (!value.is_object()) fail(origin, "__metadata__ is not an object");
  std::map<std::string, std::string> metadata;
  for (const auto& [key, item] : value.items()) {
    if (!item.is_string()) fail(origin, "__metadata__ value for '" + key + "' is not a string");
    metadata.emplace(key, item.get<std::string>());
  }
  return metadata;
}

bool is_unsigned_integer_array(const nlohmann::json& value) {
  return value.is_array() &&
         std::all_of(value.begin(), value.end(), [](const nlohmann::json& item) { return item.is_number_unsigned(); });
}

TensorEntry parse_entry(const std::string& name, const nlohmann::json& value, std::uint64_t data_size,
                        const std::string& origin) {
  if (name.empty()) fail(origin, "header has a tensor with an empty name");
  const std::string label = tensor_label(name);
  if (!value.is_object()) fail(origin, label + ": entry is not an object");
  static constexpr std::array<std::string_view, 3> kFields{"dtype", "shape", "data_offsets"};
  for (const auto& [field, unused] : value.items()) {
    if (std::find(kFields.begin(), kFields.end(), field) == kFields.end()) {
      fail(origin, label + ": unexpected field '" + field + "'");
    }
  }
  for (std::string_view field : kFields) {
    if (!value.contains(field)) fail(origin, label + ": missing field '" + std::string(field) + "'");
  }

  const nlohmann::json& dtype_value = value.at("dtype");
  if (!dtype_value.is_string()) fail(origin, label + ": dtype is not a string");
  const auto& dtype_name = dtype_value.get_ref<const std::string&>();
  const DtypeInfo* dtype = dtype_by_name(dtype_name);
  if (dtype == nullptr) fail(origin, label + ": unsupported dtype '" + dtype_name + "'");

  const nlohmann::json& shape_value = value.at("shape");
  if (!is_unsigned_integer_array(shape_value)) fail(origin, label + ": shape is not an array of non-negative integers");
  std::vector<std::uint64_t> shape;
  shape.reserve(shape_value.size());
  for (const nlohmann::json& dimension : shape_value) shape.push_back(dimension.get<std::uint64_t>());

  const nlohmann::json& offsets_value = value.at("data_offsets");
  if (!is_unsigned_integer_array(offsets_value) || offsets_value.size() != 2) {
    fail(origin, label + ": data_offsets is not an array of 2 non-negative integers");
  }
  const auto begin = offsets_value[0].get<std::uint64_t>();
  const auto end = offsets_value[1].get<std::uint64_t>();
  const std::string offsets = offsets_text(begin, end);
  if (begin > end) fail(origin, label + ": data_offsets " + offsets + " end before they begin");
  if (end > data_size) {
    fail(origin,
         label + ": data_offsets " + offsets + " exceed the data section of " + std::to_string(data_size) + " bytes");
  }

  const std::string shape_and_dtype = "shape " + bracketed(shape) + " of " + std::string(dtype->name);
  std::uint64_t byte_count = 1;
  bool overflow = false;
  for (std::uint64_t dimension : shape) overflow |= __builtin_mul_overflow(byte_count, dimension, &byte_count);
  overflow |= __builtin_mul_overflow(byte_count, dtype->element_bytes, &byte_count);
  if (overflow) fail(origin, label + ": " + shape_and_dtype + " overflows the byte count");
  if (end - begin != byte_count) {
    fail(origin, label + ": data_offsets " + offsets + " do not match " + shape_and_dtype + " (" +
                     std::to_string(byte_count) + " bytes)");
  }

  // A shape with a zero passes the byte check whatever its other dimensions are, but LibTorch
  // still computes contiguous strides from them, which must fit in int64.
  std::uint64_t stride_extent = 1;
  for (std::uint64_t dimension : shape) {
    overflow |= __builtin_mul_overflow(stride_extent, std::max<std::uint64_t>(dimension, 1), &stride_extent);
  }
  if (overflow || stride_extent > static_cast<std::uint64_t>(std::numeric_limits<std::int64_t>::max())) {
    fail(origin, label + ": shape " + bracketed(shape) + " is too large for a tensor");
  }

  TensorEntry entry{name, dtype, {}, begin, end};
  entry.shape.assign(shape.begin(), shape.end());
  return entry;
}

// Parses and validates the JSON header against a data section of `data_size` bytes.
Header parse_header(std::string_view text, std::uint64_t data_size, const std::string& origin) {
  if (text.starts_with("\xEF\xBB\xBF")) fail(origin, "header is not valid JSON: it starts with a byte order mark");
  // nlohmann's lexer takes a NUL byte for the end of input, which would let anything after one through.
  if (const auto nul = text.find('\0'); nul != text.npos) {
    fail(origin, "header is not valid JSON: NUL byte at offset " + std::to_string(nul));
  }
  const nlohmann::json root = parse_json_rejecting_duplicates(text, origin);
  if (!root.is_object()) fail(origin, "header is not a JSON object");

  Header header;
  for (const auto& [key, value] : root.items()) {
    if (key == "__metadata__") {
      header.metadata = parse_metadata(value, origin);
    } else {
      header.entries.push_back(parse_entry(key, value, data_size, origin));
    }
  }
  std::sort(header.entries.begin(), header.entries.end(), [](const TensorEntry& left, const TensorEntry& right) {
    return std::tie(left.begin, left.end, left.name) < std::tie(right.begin, right.end, right.name);
  });

  // Like the reference implementation, the tensors must tile the data section exactly.
  std::uint64_t covered_until = 0;
  const TensorEntry* previous = nullptr;
  for (const TensorEntry& entry : header.entries) {
    const std::string label = tensor_label(entry.name) + ": data_offsets " + offsets_text(entry.begin, entry.end);
    if (entry.begin > covered_until) {
      fail(origin, label + " leave bytes " + "[" + std::to_string(covered_until) + ", " + std::to_string(entry.begin) +
                       ") of the data section uncovered");
    }
    if (entry.begin < covered_until) {
      fail(origin,
           label + " overlap " + tensor_label(previous->name) + " at " + offsets_text(previous->begin, previous->end));
    }
    covered_until = entry.end;
    previous = &entry;
  }
  if (covered_until != data_size) {
    fail(origin, "bytes [" + std::to_string(covered_until) + ", " + std::to_string(data_size) +
                     ") of the data section are not covered by any tensor");
  }
  return header;
}

at::Tensor allocate_tensor(const TensorEntry& entry) {
  return at::empty(entry.shape, at::TensorOptions().dtype(entry.dtype->scalar_type).device(at::kCPU));
}

// Any byte other than 0 or 1 in a bool tensor is undefined behaviour for LibTorch kernels.
void check_bool_values(const at::Tensor& tensor, const TensorEntry& entry, const std::string& origin) {
  if (entry.dtype->scalar_type != at::kBool) return;
  const auto* bytes = static_cast<const std::uint8_t*>(tensor.data_ptr());
  const std::uint64_t count = entry.end - entry.begin;
  for (std::uint64_t index = 0; index < count; ++index) {
    if (bytes[index] > 1) {
      fail(origin, tensor_label(entry.name) + ": BOOL element " + std::to_string(index) + " has byte value " +
                       std::to_string(bytes[index]) + " (not 0 or 1)");
    }
  }
}

class FileDescriptor {
 public:
  explicit FileDescriptor(int fd) : fd_(fd) {}
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
  FileDescriptor& operator=(FileDescriptor&& other) noexcept {
    close_quietly();
    fd_ = std::exchange(other.fd_, -1);
    return *this;
  }
  ~FileDescriptor() { close_quietly(); }
  int get() const { return fd_; }
  bool valid() const { return fd_ >= 0; }
  // Returns the errno of a failed close, 0 on success.
  int close_checked() {
    const int result = ::close(fd_);
    fd_ = -1;
    return result == 0 ? 0 : errno;
  }
  void close_quietly() {
    if (fd_ >= 0) ::close(fd_);
    fd_ = -1;
  }

 private:
  int fd_;
};

void read_exactly(int fd, void* destination, std::uint64_t byte_count, std::uint64_t file_offset,
                  const std::string& path, const std::string& what) {
  auto* cursor = static_cast<char*>(destination);
  while (byte_count > 0) {
    const auto chunk = static_cast<std::size_t>(std::min<std::uint64_t>(byte_count, kMaxIoChunk));
    const ssize_t count = ::pread(fd, cursor, chunk, static_cast<off_t>(file_offset));
    if (count < 0) {
      if (errno == EINTR) continue;
      fail(path, "reading " + what + " failed: " + errno_text(errno));
    }
    if (count == 0) fail(path, "file ended while reading " + what + " (was it truncated?)");
    cursor += count;
    byte_count -= static_cast<std::uint64_t>(count);
    file_offset += static_cast<std::uint64_t>(count);
  }
}

void check_utf8(const std::string& text, const std::string& path, const std::string& what) {
  try {
    (void)nlohmann::json(text).dump();
  } catch (const nlohmann::json::type_error&) {
    fail(path, what + " is not valid UTF-8");
  }
}

at::Tensor to_cpu_contiguous(const at::Tensor& tensor) {
  at::Tensor result = tensor.detach();
  if (result.layout() != at::kStrided) result = result.to_dense();
  return result.resolve_conj().resolve_neg().to(at::kCPU).contiguous();
}

std::string build_header(const std::string& path, const std::vector<TensorSpec>& tensors,
                         const std::map<std::string, std::string>& metadata, std::vector<std::uint64_t>& byte_counts) {
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    for (const auto& [key, value] : metadata) {
      check_utf8(key, path, "metadata key '" + key + "'");
      check_utf8(value, path, "metadata value for '" + key + "'");
    }
    header["__metadata__"] = metadata;
  }
  std::set<std::string_view> names;
  std::uint64_t offset = 0;
  for (std::size_t index = 0; index < tensors.size(); ++index) {
    const auto& [name, scalar_type, shape] = tensors[index];
    const std::string label = tensor_label(name);
    if (name.empty()) fail(path, "tensor #" + std::to_string(index) + " has an empty name");
    if (name == "__metadata__") fail(path, "tensor name '__metadata__' is reserved for the metadata");
    if (!names.insert(name).second) fail(path, "duplicate tensor name '" + name + "'");
    check_utf8(name, path, label + ": the name");
    const DtypeInfo* dtype = dtype_by_scalar_type(scalar_type);
    if (dtype == nullptr) fail(path, label + ": unsupported dtype " + std::string(c10::toString(scalar_type)));
    std::uint64_t byte_count = dtype->element_bytes;
    for (const std::int64_t dimension : shape) {
      if (dimension < 0) fail(path, label + ": negative dimension in shape " + bracketed(shape));
      byte_count *= static_cast<std::uint64_t>(dimension);
    }
    byte_counts.push_back(byte_count);
    header[name] = nlohmann::ordered_json{
        {"dtype", dtype->name},
        {"shape", shape},
        {"data_offsets", nlohmann::ordered_json::array({offset, offset + byte_count})},
    };
    offset += byte_count;
  }
  std::string text = header.dump();
  // Padding the header to a multiple of 8 bytes keeps the data section aligned, as the Python library does.
  text.resize((text.size() + 7) / 8 * 8, ' ');
  if (text.size() > kMaxHeaderBytes) {
    fail(path, "header of " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                   std::to_string(kMaxHeaderBytes) + " bytes");
  }
  return text;
}

}  // namespace

const at::Tensor* SafetensorsContents::find(const std::string& name) const {
  for (const NamedTensor& named : tensors) {
    if (named.name == name) return &named.tensor;
  }
  return nullptr;
}

void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSpec> specs;
  specs.reserve(tensors.size());
  for (const auto& [name, tensor] : tensors) {
    if (!tensor.defined()) fail(path, tensor_label(name) + " is undefined");
    try {
      specs.push_back({name, tensor.scalar_type(), tensor.sizes().vec()});
    } catch (const c10::Error& error) {
      fail(path, tensor_label(name) + ": cannot read its shape: " + error.what_without_backtrace());
    }
  }
  save_safetensors_streamed(path, specs, metadata, [&](std::size_t index) { return tensors[index].tensor; });
}

void save_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::function<at::Tensor(std::size_t)>& tensor_at) {
  std::vector<std::uint64_t> byte_counts;
  const std::string header = build_header(path, tensors, metadata, byte_counts);

  try {
    core::AtomicFileWriter file(path);
    const std::uint64_t header_length = header.size();
    file.write(&header_length, sizeof header_length, "the header length");
    file.write(header.data(), header.size(), "the header");
    for (std::size_t index = 0; index < tensors.size(); ++index) {
      const TensorSpec& spec = tensors[index];
      at::Tensor cpu_tensor;
      try {
        const at::Tensor tensor = tensor_at(index);
        if (!tensor.defined()) fail(path, tensor_label(spec.name) + " is undefined");
        if (tensor.scalar_type() != spec.dtype || !tensor.sizes().equals(spec.shape))
          fail(path, tensor_label(spec.name) + ": the tensor given is " +
                         std::string(c10::toString(tensor.scalar_type())) + " " + bracketed(tensor.sizes()) +
                         ", its header says " + std::string(c10::toString(spec.dtype)) + " " + bracketed(spec.shape));
        cpu_tensor = to_cpu_contiguous(tensor);
      } catch (const c10::Error& error) {
        fail(path, tensor_label(spec.name) + ": cannot copy to CPU: " + error.what_without_backtrace());
      }
      if (static_cast<std::uint64_t>(cpu_tensor.nbytes()) != byte_counts[index]) {
        fail(path, tensor_label(spec.name) + ": its CPU copy has " + std::to_string(cpu_tensor.nbytes()) +
                       " bytes instead of " + std::to_string(byte_counts[index]));
      }
      if (byte_counts[index] > 0) file.write(cpu_tensor.data_ptr(), byte_counts[index], tensor_label(spec.name));
    }
    file.commit();
  } catch (const core::AtomicFileError& error) {
    throw SafetensorsError(error.what());
  }
}

SafetensorsContents parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& origin) {
  check_file_size(size, origin);
  const std::uint64_t header_length = read_header_length(data, size, origin);
  const std::uint64_t data_start = kLengthFieldBytes + header_length;
  const std::string_view header_text(reinterpret_cast<const char*>(data + kLengthFieldBytes), header_length);
  Header header = parse_header(header_text, size - data_start, origin);

  SafetensorsContents contents;
  contents.metadata = std::move(header.metadata);
  contents.tensors.reserve(header.entries.size());
  for (const TensorEntry& entry : header.entries) {
    at::Tensor tensor = allocate_tensor(entry);
    if (entry.end > entry.begin)
      std::memcpy(tensor.data_ptr(), data + data_start + entry.begin, entry.end - entry.begin);
    check_bool_values(tensor, entry, origin);
    contents.tensors.push_back({entry.name, std::move(tensor)});
  }
  return contents;
}

struct SafetensorsFile::Open {
  FileDescriptor fd{-1};
  Header header;
  std::uint64_t data_start = 0;
};

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path), open_(std::make_unique<Open>()) {
  open_->fd = FileDescriptor(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  const int fd = open_->fd.get();
  if (fd < 0) fail(path, "cannot open: " + errno_text(errno));
  struct stat status {};
  if (::fstat(fd, &status) != 0) fail(path, "cannot stat: " + errno_text(errno));
  if (!S_ISREG(status.st_mode)) fail(path, "is not a regular file");
  const auto file_size = static_cast<std::uint64_t>(status.st_size);

  check_file_size(file_size, path);
  std::array<std::uint8_t, kLengthFieldBytes> length_field{};
  read_exactly(fd, length_field.data(), length_field.size(), 0, path, "the header length");
  const std::uint64_t header_length = read_header_length(length_field.data(), file_size, path);
  std::string header_text(header_length, '\0');
  read_exactly(fd, header_text.data(), header_length, kLengthFieldBytes, path, "the header");
  open_->data_start = kLengthFieldBytes + header_length;
  open_->header = parse_header(header_text, file_size - open_->data_start, path);
  for (std::size_t i = 0; i < open_->header.entries.size(); ++i) {
    const TensorEntry& entry = open_->header.entries[i];
    index_.emplace(entry.name, i);
    specs_.push_back({entry.name, entry.dtype->scalar_type, entry.shape});
  }
}

SafetensorsFile::~SafetensorsFile() = default;
SafetensorsFile::SafetensorsFile(SafetensorsFile&&) noexcept = default;

const std::map<std::string, std::string>& SafetensorsFile::metadata() const { return open_->header.metadata; }

const TensorSpec* SafetensorsFile::find(const std::string& name) const {
  const auto found = index_.find(name);
  return found == index_.end() ? nullptr : &specs_[found->second];
}

at::Tensor SafetensorsFile::read(const std::string& name) const {
  const TensorSpec* spec = find(name);
  if (spec == nullptr) fail(path_, tensor_label(name) + " is not in the file");
  const std::int64_t rows = spec->shape.empty() ? 1 : spec->shape.front();
  return read_rows(name, 0, rows);
}

at::Tensor SafetensorsFile::read_rows(const std::string& name, std::int64_t begin, std::int64_t end) const {
  const auto found = index_.find(name);
  if (found == index_.end()) fail(path_, tensor_label(name) + " is not in the file");
  const TensorEntry& entry = open_->header.entries[found->second];
  const bool scalar = entry.shape.empty();
  const std::int64_t rows = scalar ? 1 : entry.shape.front();
  if (begin < 0 || begin > end || end > rows)
    fail(path_, tensor_label(name) + ": rows [" + std::to_string(begin) + ", " + std::to_string(end) +
                    ") are outside its " + std::to_string(rows) + " rows");
  std::vector<std::int64_t> shape = entry.shape;
  if (!scalar) shape.front() = end - begin;
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(entry.dtype->scalar_type).device(at::kCPU));
  if (scalar && begin == end) tensor = at::empty({0}, tensor.options());
  const std::uint64_t row_bytes = rows == 0 ? 0 : (entry.end - entry.begin) / static_cast<std::uint64_t>(rows);
  const std::uint64_t byte_count = row_bytes * static_cast<std::uint64_t>(end - begin);
  if (byte_count > 0)
    read_exactly(open_->fd.get(), tensor.data_ptr(), byte_count,
                 open_->data_start + entry.begin + row_bytes * static_cast<std::uint64_t>(begin), path_,
                 tensor_label(name));
  TensorEntry part = entry;
  part.end = part.begin + byte_count;
  check_bool_values(tensor, part, path_);
  return tensor;
}

SafetensorsContents load_safetensors(const std::string& path) {
  const SafetensorsFile file(path);
  SafetensorsContents contents;
  contents.metadata = file.metadata();
  contents.tensors.reserve(file.tensors().size());
  for (const TensorSpec& spec : file.tensors()) contents.tensors.push_back({spec.name, file.read(spec.name)});
  return contents;
}

}  // namespace runner::ckpt
