// Data type name table.
#include "runtime/core/dtype.h"

#include <array>
#include <stdexcept>
#include <utility>

namespace runner::core {
namespace {

struct DtypeName {
  const char* name;
  c10::ScalarType type;
};

// Canonical names first: dtype_name returns the first match.
constexpr std::array<DtypeName, 17> kDtypeNames{{
    {"float32", c10::kFloat},
    {"float64", c10::kDouble},
    {"float16", c10::kHalf},
    {"bfloat16", c10::kBFloat16},
    {"int64", c10::kLong},
    {"int32", c10::kInt},
    {"int16", c10::kShort},
    {"int8", c10::kChar},
    {"uint8", c10::kByte},
    {"bool", c10::kBool},
    {"float", c10::kFloat},
    {"double", c10::kDouble},
    {"half", c10::kHalf},
    {"long", c10::kLong},
    {"int", c10::kInt},
    {"byte", c10::kByte},
    {"short", c10::kShort},
}};

}  // namespace

c10::ScalarType parse_dtype(const std::string& name) {
  for (const auto& entry : kDtypeNames)
    if (name == entry.name) return entry.type;
  throw std::invalid_argument("unknown dtype '" + name +
                              "' (expected float32, float64, float16, bfloat16, int64, int32, int16, int8, "
                              "uint8 or bool)");
}

std::string dtype_name(c10::ScalarType type) {
  for (const auto& entry : kDtypeNames)
    if (entry.type == type) return entry.name;
  return c10::toString(type);
}

}  // namespace runner::core
