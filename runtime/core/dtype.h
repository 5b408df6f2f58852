// Data type names as users write them ("float32", "bfloat16", "int64", ...) and c10::ScalarType.
#pragma once
#include <c10/core/ScalarType.h>
#include <string>

namespace runner::core {

// Accepts float32/float, float64/double, float16/half, bfloat16, int64/long, int32/int, int16, int8,
// uint8/byte, bool. Throws std::invalid_argument naming the bad text and listing the accepted names.
c10::ScalarType parse_dtype(const std::string& name);

// The canonical name: "float32", "int64", ...
std::string dtype_name(c10::ScalarType type);

}  // namespace runner::core
