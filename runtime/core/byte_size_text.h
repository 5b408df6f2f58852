// A size in bytes as the commands and the sweep worker write it: "512 B", "1.2 kB", "3.4 GB" (powers of 1000).
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace runner::core {

inline std::string byte_size_text(std::uint64_t bytes) {
  if (bytes < 1000) return fmt::format("{} B", bytes);
  const char* units[] = {"kB", "MB", "GB", "TB"};
  double value = static_cast<double>(bytes);
  int unit = -1;
  while (value >= 1000 && unit < 3) {
    value /= 1000;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, units[unit]);
}

}  // namespace runner::core
