// The disk space a file or directory tree takes: what deleting it frees.
#pragma once

#include <cstdint>
#include <string>

namespace runner::core {

// Allocated blocks of the tree at `path` (a file with links outside the tree counts nothing; 0 when missing).
// Links are not followed.
std::uint64_t disk_usage(const std::string& path);

}  // namespace runner::core
