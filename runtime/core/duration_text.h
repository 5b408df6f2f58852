// A span of seconds as progress lines, run tables and reports write it: "59s", "3m 12s", "2h 05m", "3d 4h".
#pragma once

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

namespace runner::core {

// Rounded to whole seconds; negative as "0s", unknown (NaN, infinite) as "-"; the two largest units only.
inline std::string duration_text(double seconds) {
  if (!std::isfinite(seconds)) return "-";
  const auto total = static_cast<std::int64_t>(std::llround(std::max(0.0, seconds)));
  if (total < 60) return fmt::format("{}s", total);
  if (total < 3600) return fmt::format("{}m {:02d}s", total / 60, total % 60);
  if (total < 86400) return fmt::format("{}h {:02d}m", total / 3600, (total % 3600) / 60);
  return fmt::format("{}d {}h", total / 86400, (total % 86400) / 3600);
}

}  // namespace runner::core
