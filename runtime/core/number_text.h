// A measured value as tables, `runner show --json` and the dashboard write it: 6 significant digits, "nan" / "inf".
#pragma once

#include <fmt/format.h>

#include <cmath>
#include <string>

namespace runner::core {

inline std::string number_text(double value) {
  if (std::isnan(value)) return "nan";
  if (std::isinf(value)) return value > 0 ? "inf" : "-inf";
  // Six significant digits, but whole numbers up to 10^15 and large values keep their integer part: a count or
  // a time in seconds reads as 1795790123, not 1.79579e+09.
  const double magnitude = std::abs(value);
  if (magnitude >= 1e6 && magnitude < 1e15) {
    if (value == std::floor(value)) return fmt::format("{:.0f}", value);
    return fmt::format("{:.2f}", value);
  }
  return fmt::format("{:.6g}", value);
}

}  // namespace runner::core
