// Reading and writing the safetensors checkpoint format (8-byte header length, JSON header, raw data).
#pragma once

#include <ATen/Tensor.h>

#include <cstddef>
#include <cstdint>
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

// Reads the whole file; the tensors are CPU tensors owning their memory.
SafetensorsContents load_safetensors(const std::string& path);

// Parses a complete file image. Safe on arbitrary bytes: every malformation throws SafetensorsError
// with a message that starts with "<origin>: " and says what is wrong.
SafetensorsContents parse_safetensors(const std::uint8_t* data, std::size_t size, const std::string& origin);

}  // namespace runner::ckpt
