// UTF-8 validation, and the two ways of making text valid: escaping the bad bytes or replacing them.
#include "runtime/core/utf8_text.h"

#include <cstdio>
#include <stdexcept>

namespace runner::core {
namespace {

std::string with_bad_bytes(std::string_view text, std::string_view (*shown)(unsigned char, char*)) {
  std::string out;
  out.reserve(text.size());
  char buffer[8];
  for (std::size_t i = 0; i < text.size();) {
    char32_t code_point = 0;
    const std::size_t length = utf8_sequence(text, i, code_point);
    if (length == 0) {
      out += shown(static_cast<unsigned char>(text[i]), buffer);
      ++i;
    } else {
      out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

}  // namespace

std::size_t utf8_sequence(std::string_view text, std::size_t i, char32_t& code_point) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = byte(0);
  std::size_t length = 0;
  char32_t minimum = 0;
  if (lead < 0x80) {
    code_point = lead;
    return 1;
  }
  if (lead >= 0xC2 && lead <= 0xDF)
    length = 2, minimum = 0x80, code_point = lead & 0x1F;
  else if (lead >= 0xE0 && lead <= 0xEF)
    length = 3, minimum = 0x800, code_point = lead & 0x0F;
  else if (lead >= 0xF0 && lead <= 0xF4)
    length = 4, minimum = 0x10000, code_point = lead & 0x07;
  else
    return 0;
  if (i + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(k) & 0x3F);
  }
  if (code_point < minimum || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return 0;
  return length;
}

std::optional<std::size_t> invalid_utf8_offset(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    char32_t code_point = 0;
    const std::size_t length = utf8_sequence(text, i, code_point);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

std::string utf8_escaped(std::string_view text) {
  if (!invalid_utf8_offset(text)) return std::string(text);
  return with_bad_bytes(text, [](unsigned char byte, char* buffer) {
    std::snprintf(buffer, 8, "\\x%02x", byte);
    return std::string_view(buffer, 4);
  });
}

std::string utf8_replaced(std::string_view text) {
  if (!invalid_utf8_offset(text)) return std::string(text);
  return with_bad_bytes(text, [](unsigned char, char*) { return std::string_view("\xEF\xBF\xBD"); });
}

std::string_view utf8_prefix(std::string_view text, std::size_t max_bytes) {
  if (text.size() <= max_bytes) return text;
  std::size_t end = max_bytes;
  while (end > 0 && (static_cast<unsigned char>(text[end]) & 0xC0) == 0x80) --end;  // text[end] starts the next one
  return text.substr(0, end);
}

void require_utf8(std::string_view text, std::string_view what) {
  const auto offset = invalid_utf8_offset(text);
  if (!offset) return;
  char byte[8];
  std::snprintf(byte, sizeof byte, "0x%02x", static_cast<unsigned char>(text[*offset]));
  constexpr std::size_t kShown = 60;
  const std::string shown = utf8_escaped(utf8_prefix(text, kShown)) + (text.size() > kShown ? "..." : "");
  throw std::invalid_argument(std::string(what) + " is not valid UTF-8 (byte " + byte + " at offset " +
                              std::to_string(*offset) + " of \"" + shown + "\")");
}

}  // namespace runner::core
