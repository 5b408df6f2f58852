// The one progress line that may be open on a terminal, and ending it before other output.
#include "runtime/core/open_line.h"

#include <unistd.h>

#include <atomic>

namespace runner::core {
namespace {

std::atomic<std::FILE*> open_stream{nullptr};
std::atomic<int> open_descriptor{-1};

}  // namespace

void set_open_line(std::FILE* stream) {
  open_descriptor.store(stream ? ::fileno(stream) : -1);
  open_stream.store(stream);
}

bool has_open_line(std::FILE* stream) { return open_stream.load() == stream; }

void end_open_line() {
  std::FILE* stream = open_stream.exchange(nullptr);
  open_descriptor.store(-1);
  if (!stream) return;
  std::fputc('\n', stream);
  std::fflush(stream);
}

void end_open_line_from_signal() {
  const int descriptor = open_descriptor.exchange(-1);
  open_stream.store(nullptr);
  if (descriptor >= 0) (void)!::write(descriptor, "\n", 1);
}

}  // namespace runner::core
