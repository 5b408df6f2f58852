// A read-only memory mapping of a whole file.
#include "runtime/data/mapped_file.h"

#include <csetjmp>
#include <csignal>
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

// SIGBUS from a read of a mapped page past the end of a truncated file: a thread inside copy() jumps back
// to it; any other SIGBUS gets the previous disposition back and recurs when the instruction re-executes.
thread_local sigjmp_buf* volatile bus_jump = nullptr;  // volatile: the stores around memcpy are not dead
struct sigaction previous_bus_action {};

void on_bus(int, siginfo_t*, void*) {
  if (bus_jump != nullptr) siglongjmp(*bus_jump, 1);
  ::sigaction(SIGBUS, &previous_bus_action, nullptr);
}

void install_bus_handler() {
  static const bool installed = [] {
    struct sigaction action {};
    action.sa_sigaction = on_bus;
    // SA_NODEFER: SIGBUS stays unblocked when the handler jumps out, so sigsetjmp need not save the mask.
    action.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&action.sa_mask);
    return ::sigaction(SIGBUS, &action, &previous_bus_action) == 0;
  }();
  (void)installed;
}

std::size_t current_size(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0 ? static_cast<std::size_t>(info.st_size) : 0;
}

}  // namespace

void MappedFile::copy(std::size_t offset, std::size_t count, void* destination) const {
  if (offset > size_ || count > size_ - offset) {
    throw DataError(path_, "read of bytes " + std::to_string(offset) + ".." + std::to_string(offset + count) +
                               " beyond the end (" + std::to_string(size_) + " bytes)");
  }
  if (count == 0) return;
  install_bus_handler();
  sigjmp_buf jump;
  if (sigsetjmp(jump, 0) != 0) {
    bus_jump = nullptr;
    throw DataError(path_, "the file shrank while it was being read (now " + std::to_string(current_size(path_)) +
                               " bytes, " + std::to_string(size_) + " when opened): was it truncated or rewritten?");
  }
  bus_jump = &jump;
  std::memcpy(destination, data_ + offset, count);
  bus_jump = nullptr;
}

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
      throw DataError(path,
                      n == 0 ? "file shrank while reading" : std::string("read failed: ") + std::strerror(read_errno));
    }
    done += static_cast<std::size_t>(n);
  }
  ::close(fd);
  return bytes;
}

}  // namespace runner::data
