// Crash-safe file replacement through a temporary file and rename.
#include "runtime/core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/core/storage_full.h"

namespace runner::core {
namespace {

constexpr std::uint64_t kMaxIoChunk = 1ull << 30;

std::string errno_text(int error_number) { return std::strerror(error_number); }

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path)
    : path_(std::move(path)), temporary_path_(path_ + ".tmp-" + std::to_string(::getpid())) {
  fd_ = ::open(temporary_path_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0666);
  if (fd_ < 0) {
    committed_ = true;  // nothing was created, so there is nothing to remove
    fail("cannot create temporary file '" + temporary_path_ + "': ", errno);
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_) ::unlink(temporary_path_.c_str());
}

void AtomicFileWriter::fail(const std::string& what, int error_number) const {
  note_write_error(error_number);
  throw AtomicFileError(path_ + ": " + what + errno_text(error_number));
}

void AtomicFileWriter::write(const void* data, std::uint64_t byte_count, const std::string& what) {
  const auto* cursor = static_cast<const char*>(data);
  while (byte_count > 0) {
    const auto chunk = static_cast<std::size_t>(std::min(byte_count, kMaxIoChunk));
    const ssize_t count = ::write(fd_, cursor, chunk);
    if (count < 0) {
      if (errno == EINTR) continue;
      fail("writing " + what + " to '" + temporary_path_ + "' failed: ", errno);
    }
    cursor += count;
    byte_count -= static_cast<std::uint64_t>(count);
  }
}

void AtomicFileWriter::write_at(std::uint64_t offset, const void* data, std::uint64_t byte_count,
                                const std::string& what) {
  const auto* cursor = static_cast<const char*>(data);
  while (byte_count > 0) {
    const auto chunk = static_cast<std::size_t>(std::min(byte_count, kMaxIoChunk));
    const ssize_t count = ::pwrite(fd_, cursor, chunk, static_cast<off_t>(offset));
    if (count < 0) {
      if (errno == EINTR) continue;
      fail("writing " + what + " to '" + temporary_path_ + "' failed: ", errno);
    }
    cursor += count;
    offset += static_cast<std::uint64_t>(count);
    byte_count -= static_cast<std::uint64_t>(count);
  }
}

void AtomicFileWriter::resize(std::uint64_t byte_count) {
  if (::ftruncate(fd_, static_cast<off_t>(byte_count)) != 0) fail("resizing '" + temporary_path_ + "' failed: ", errno);
}

void AtomicFileWriter::commit() {
  if (::fsync(fd_) != 0) fail("fsync of '" + temporary_path_ + "' failed: ", errno);
  const int close_result = ::close(fd_);
  fd_ = -1;
  if (close_result != 0) fail("closing '" + temporary_path_ + "' failed: ", errno);
  if (::rename(temporary_path_.c_str(), path_.c_str()) != 0)
    fail("renaming '" + temporary_path_ + "' over it failed: ", errno);
  committed_ = true;
  std::filesystem::path directory = std::filesystem::path(path_).parent_path();
  if (directory.empty()) directory = ".";
  const int directory_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (directory_fd < 0) fail("cannot open directory '" + directory.string() + "' to fsync it: ", errno);
  const int sync_result = ::fsync(directory_fd);
  const int sync_errno = errno;
  ::close(directory_fd);
  if (sync_result != 0) fail("fsync of directory '" + directory.string() + "' failed: ", sync_errno);
}

}  // namespace runner::core
