// NumPy .npy files: a strict header parser, a memory-mapped array reader and an atomic writer.
#pragma once

#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace runner::data {

class MappedFile;

struct NpyHeader {
  at::ScalarType dtype = at::kFloat;
  std::vector<std::int64_t> shape;
  std::size_t data_offset = 0;  // bytes from the start of the file
  std::size_t data_bytes = 0;   // product(shape) * item size
};

// Parses and validates the header of a complete file image of `size` bytes: magic, version, the dict
// {'descr', 'fortran_order', 'shape'}, and that the data fits the file exactly. Safe on any bytes: every
// malformation throws DataError naming `origin` and what is wrong.
NpyHeader parse_npy_header(const std::uint8_t* data, std::size_t size, const std::string& origin);

// The .npy descr ('<f4', '|u1', ...) for a dtype; throws DataError for dtypes NumPy cannot store.
std::string npy_descr(at::ScalarType dtype);

// Writes a C-contiguous array atomically (temporary file, fsync, rename).
void save_npy(const std::string& path, const at::Tensor& tensor);

// The header bytes (magic, version, dict padded to a multiple of 64 bytes, and to at least min_length)
// for an array of `dtype` and `shape`.
std::string npy_header_bytes(at::ScalarType dtype, const std::vector<std::int64_t>& shape, std::size_t min_length = 0);

// A memory-mapped .npy file of shape [N, ...]: rows are read without loading the file.
class NpyArray {
 public:
  explicit NpyArray(const std::string& path);
  ~NpyArray();
  const std::string& path() const;
  const NpyHeader& header() const { return header_; }
  std::int64_t rows() const { return header_.shape.empty() ? 0 : header_.shape[0]; }
  std::vector<std::int64_t> row_shape() const;
  std::size_t row_bytes() const { return row_bytes_; }
  // Rows [first, first + count) copied out of the mapping into a new CPU tensor [count, ...]. A file that
  // shrank since it was opened, and a bool value other than 0 or 1, are DataErrors naming the path.
  at::Tensor copy_rows(std::int64_t first, std::int64_t count) const;

 private:
  std::unique_ptr<MappedFile> file_;
  NpyHeader header_;
  std::size_t row_bytes_ = 0;
};

}  // namespace runner::data
