// UTF-8 checks for text that goes into the index or out as JSON: refused where a user typed it, made valid elsewhere.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace runner::core {

// The length of the valid UTF-8 sequence that starts at text[i] (1 for ASCII) and its code point, or 0 when the
// bytes there are not one (a stray continuation byte, an overlong form, a surrogate, a cut sequence).
std::size_t utf8_sequence(std::string_view text, std::size_t i, char32_t& code_point);

// The offset of the first byte of `text` that is not part of valid UTF-8, or none.
std::optional<std::size_t> invalid_utf8_offset(std::string_view text);

// `text` with each byte that is not UTF-8 written as the four characters \xHH: for text from the world (a file name
// in an error), so that what it said stays readable.
std::string utf8_escaped(std::string_view text);

// `text` with each byte that is not UTF-8 replaced by U+FFFD, as JSON writers and browsers do: for text read back from
// an index that already holds such bytes, so that every JSON made of it is valid.
std::string utf8_replaced(std::string_view text);

// The longest start of `text` of at most `max_bytes` bytes that does not cut a UTF-8 sequence in two.
std::string_view utf8_prefix(std::string_view text, std::size_t max_bytes);

// Throws std::invalid_argument "WHAT is not valid UTF-8 (byte 0xHH at offset N of "TEXT")" when `text` is not: for
// text a user typed (a note, a metric key), refused with the place it came from.
void require_utf8(std::string_view text, std::string_view what);

}  // namespace runner::core
