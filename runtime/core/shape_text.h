// A tensor shape as error messages write it: "[2, 3, 32, 32]" (a tensor's repr writes Python's tuple, "(2, 3)":
// shape_tuple_text in tensor_format.cpp).
#pragma once

#include <c10/util/ArrayRef.h>
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <string>

namespace runner::core {

inline std::string shape_text(c10::IntArrayRef sizes) { return fmt::format("[{}]", fmt::join(sizes, ", ")); }

}  // namespace runner::core
