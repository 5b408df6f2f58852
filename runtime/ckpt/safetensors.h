// Reading and writing the safetensors checkpoint format (8-byte header length, JSON header, raw data).
#pragma once

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace runner::ckpt {

struct SafetensorsError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct NamedTensor {
  std::string name;
  at::Tensor tensor;
};

struct SafetensorsContents {
  std::vector<NamedTensor> tensors;                       // in order of data offset
  std::map<std::string, std::string> metadata;            // the __metadata__ map
  const at::Tensor* find(const std::string& name) const;  // nullptr if absent
};

// Writes atomically: to "<path>.tmp-<pid>", fsyncs the file, renames it over `path`, fsyncs the directory.
// Tensors may be on any device and in any layout: they are copied to CPU contiguous one at a time.
// Errors (duplicate or empty names, unsupported dtype, I/O failure) throw SafetensorsError naming the path
// and the tensor; on error nothing at `path` is created or changed and the temporary is removed.
void save_safetensors(const std::string& path, const std::vector<NamedTensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {});

// A tensor's entry in a file's header.
struct TensorSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<std::int64_t> shape;
};

// save_safetensors for tensors produced one at a time, in the order of `tensors`: `tensor_at(i)` must give the
// dtype and shape of `tensors[i]`, and nothing needs to hold more than one of them.
void save_safetensors_streamed(const std::string& path, const std::vector<TensorSpec>& tensors,
                               const std::map<std::string, std::string>& metadata,
                               const std::function<at::Tensor(std::size_t)>& tensor_at);

// Reads the whole file; the tensors are CPU tensors owning their memory.
SafetensorsContents load_safetensors(const std::string& path);

// An open file whose header was read and validated (as load_safetensors does); tensors are read one at a time,
// or a range of a tensor's rows (of its first dimension), without reading the rest.
class SafetensorsFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(SafetensorsFile&&) noexcept;
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::string& path() const { return path_; }
  const std::map<std::string, std::string>& metadata() const;
  const std::vector<TensorSpec>& tensors() const { return specs_; }  // in order of data offset
  const TensorSpec* find(const std::string& name) const;             // nullptr if absent
  // A CPU tensor owning its memory; SafetensorsError naming the path and the tensor when it is absent.
  at::Tensor read(const std::string& name) const;
  // Rows [begin, end) of the first dimension (a 0-dim tensor is one row: [0, 1) reads it, [0, 0) gives shape [0]).
  at::Tensor read_rows(const std::string& name, std::int64_t begin, std::int64_t end) const;

 private:
  struct Open;
  std::string path_;
  std::unique_ptr<Open> open_;
  std::vector<TensorSpec> specs_;
  std::map<std::string, std::size_t> index_;
};

// Parses a complete file image. Safe on arbitrary bytes: every malformation throws SafetensorsError
// with a message that starts with "<origin>: " and says what is wrong.
SafetensorsContents parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& origin);

}  // namespace runner::ckpt
