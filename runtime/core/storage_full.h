// Whether a write of this process failed for want of space (ENOSPC, EDQUOT, EFBIG): a run that fails after one ends
// with kExitStorageFull, so that a sweep continues its trial from the last checkpoint instead of failing it.
#pragma once

namespace runner::core {

// Records `error_number` when it says the filesystem (or a quota or a file size limit) is full. Thread-safe.
void note_write_error(int error_number) noexcept;
bool storage_was_full() noexcept;

}  // namespace runner::core
