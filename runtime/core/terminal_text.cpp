// Escapes control characters, C1 controls, bidirectional overrides and non-UTF-8 bytes in text to be printed.
#include "runtime/core/terminal_text.h"

#include <cstdint>
#include <cstdio>

namespace runner::core {
namespace {

void append_escape(std::string& out, const char* format, unsigned value) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, format, value);
  out += buffer;
}

// The length of the valid UTF-8 sequence at text[i] and its code point, or 0 when it is not one.
size_t utf8_sequence(std::string_view text, size_t i, char32_t& code_point) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(text[i + k]); };
  const unsigned char lead = byte(0);
  size_t length = 0;
  char32_t minimum = 0;
  if (lead >= 0xC2 && lead <= 0xDF)
    length = 2, minimum = 0x80, code_point = lead & 0x1F;
  else if (lead >= 0xE0 && lead <= 0xEF)
    length = 3, minimum = 0x800, code_point = lead & 0x0F;
  else if (lead >= 0xF0 && lead <= 0xF4)
    length = 4, minimum = 0x10000, code_point = lead & 0x07;
  else
    return 0;
  if (i + length > text.size()) return 0;
  for (size_t k = 1; k < length; ++k) {
    if ((byte(k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(k) & 0x3F);
  }
  if (code_point < minimum || code_point > 0x10FFFF || (code_point >= 0xD800 && code_point <= 0xDFFF)) return 0;
  return length;
}

bool is_hidden_format_character(char32_t c) {
  return (c >= 0x80 && c <= 0x9F) || (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069) || c == 0x200E ||
         c == 0x200F || c == 0x061C;
}

}  // namespace

std::string terminal_text(std::string_view text, TextLines lines) {
  std::string out;
  out.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7F) {
      out += static_cast<char>(c);
      ++i;
      continue;
    }
    if (c < 0x80) {
      if ((c == '\n' || c == '\t') && lines == TextLines::kept)
        out += static_cast<char>(c);
      else if (c == '\n')
        out += "\\n";
      else if (c == '\t')
        out += "\\t";
      else if (c == '\r')
        out += "\\r";
      else
        append_escape(out, "\\x%02x", c);
      ++i;
      continue;
    }
    char32_t code_point = 0;
    const size_t length = utf8_sequence(text, i, code_point);
    if (length == 0) {
      append_escape(out, "\\x%02x", c);
      ++i;
    } else {
      if (is_hidden_format_character(code_point))
        append_escape(out, "\\u%04x", static_cast<unsigned>(code_point));
      else
        out.append(text.substr(i, length));
      i += length;
    }
  }
  return out;
}

}  // namespace runner::core
