// A read-only memory mapping of a whole file, so that datasets read samples without loading the file.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace runner::data {

class MappedFile {
 public:
  // Throws DataError naming the path when the file cannot be opened or mapped.
  explicit MappedFile(std::string path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // The mapping: for reading headers right after opening. Sample reads go through copy().
  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  // Copies bytes [offset, offset + count) out of the mapping. A file truncated since it was mapped would
  // raise SIGBUS on a plain read; here it is a DataError naming the path (the file shrank). Thread-safe.
  void copy(std::size_t offset, std::size_t count, void* destination) const;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// Reads a whole (small) file into memory; throws DataError naming the path.
std::string read_file_bytes(const std::string& path);

}  // namespace runner::data
