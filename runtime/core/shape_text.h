// A tensor shape as error messages write it: "[2, 3, 32, 32]".
#pragma once

#include <c10/util/ArrayRef.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

namespace runner::core {

inline std::string shape_text(c10::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

}  // namespace runner::core
