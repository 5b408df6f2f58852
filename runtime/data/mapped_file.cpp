// A read-only memory mapping of a whole file.
#include "runtime/data/mapped_file.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "runtime/data/data_error.h"

namespace runner::data {
namespace {

int open_regular_file(const std::string& path, struct stat& info) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw DataError(path, std::string("cannot open: ") + std::strerror(errno));
  if (::fstat(fd, &info) != 0 || !S_ISREG(info.st_mode)) {
    ::close(fd);
    throw DataError(path, "not a regular file");
  }
  return fd;
}

}  // namespace

MappedFile::MappedFile(std::string path) : path_(std::move(path)) {
  struct stat info {};
  const int fd = open_regular_file(path_, info);
  size_ = static_cast<std::size_t>(info.st_size);
  if (size_ > 0) {
    void* mapping = ::mmap(nullptr, size_, PROT_READ, MAP_SHARED, fd, 0);
    const int mmap_errno = errno;
    ::close(fd);
    if (mapping == MAP_FAILED) throw DataError(path_, std::string("cannot map: ") + std::strerror(mmap_errno));
    data_ = static_cast<const std::uint8_t*>(mapping);
  } else {
    ::close(fd);
  }
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<std::uint8_t*>(data_), size_);
}

std::string read_file_bytes(const std::string& path) {
  struct stat info {};
  const int fd = open_regular_file(path, info);
  std::string bytes(static_cast<std::size_t>(info.st_size), '\0');
  std::size_t done = 0;
  while (done < bytes.size()) {
    const ssize_t n = ::read(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int read_errno = errno;
      ::close(fd);
      throw DataError(path, n == 0 ? "file shrank while reading" : std::string("read failed: ") + std::strerror(read_errno));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace runner::data
