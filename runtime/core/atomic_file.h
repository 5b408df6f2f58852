// Crash-safe file replacement: write a temporary beside the target, fsync, rename over it, fsync the directory.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>

namespace runner::core {

// what() is "<target path>: <what failed>".
struct AtomicFileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Until commit() the target is untouched; destroying an uncommitted writer removes the temporary, so an
// error or a crash never leaves a half-written file at the target path.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends; `what` names the part being written in the error message.
  void write(const void* data, std::uint64_t byte_count, const std::string& what);
  // Writes at an absolute offset (the file grows as needed).
  void write_at(std::uint64_t offset, const void* data, std::uint64_t byte_count, const std::string& what);
  // Sets the file's size (sparse growth or truncation).
  void resize(std::uint64_t byte_count);
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }
  const std::string& temporary_path() const { return temporary_path_; }
  // fsync, close, rename over the target, fsync the directory.
  void commit();

 private:
  // Throws AtomicFileError with `what` and the text of `error_number` (noted by core::note_write_error).
  [[noreturn]] void fail(const std::string& what, int error_number) const;
  std::string path_;
  std::string temporary_path_;
  int fd_ = -1;
  bool committed_ = false;
};

}  // namespace runner::core
