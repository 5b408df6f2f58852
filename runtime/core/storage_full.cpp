// The process-wide record of a write that failed for want of space.
#include "runtime/core/storage_full.h"

#include <atomic>
#include <cerrno>

namespace runner::core {
namespace {

std::atomic<bool> storage_full{false};

}  // namespace

void note_write_error(int error_number) noexcept {
  if (error_number == ENOSPC || error_number == EDQUOT || error_number == EFBIG) storage_full.store(true);
}

bool storage_was_full() noexcept { return storage_full.load(); }

}  // namespace runner::core
