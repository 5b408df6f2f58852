// JSON as text for output: valid UTF-8 even where a value holds bytes that are not (U+FFFD in their place).
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace runner::core {

// value.dump(indent), except that bytes that are not UTF-8 (an index written by an older runner, a file's name)
// become U+FFFD instead of throwing.
inline std::string json_text(const nlohmann::json& value, int indent = -1) {
  return value.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace runner::core
