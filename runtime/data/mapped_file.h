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

  const std::uint8_t* data() const { return data_; }
  std::size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  const std::uint8_t* data_ = nullptr;
  std::size_t size_ = 0;
};

// Reads a whole (small) file into memory; throws DataError naming the path.
std::string read_file_bytes(const std::string& path);

}  // namespace runner::data
