// Escapes control characters, C1 controls, bidirectional overrides and non-UTF-8 bytes in text to be printed.
#include "runtime/core/terminal_text.h"

#include <cstdint>
#include <cstdio>

#include "runtime/core/utf8_text.h"

namespace runner::core {
namespace {

void append_escape(std::string& out, const char* format, unsigned value) {
  char buffer[8];
  std::snprintf(buffer, sizeof buffer, format, value);
  out += buffer;
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
