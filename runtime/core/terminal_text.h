// Text from data (names, config values, metric keys, errors) made safe to print: nothing in it can drive the terminal.
#pragma once

#include <string>
#include <string_view>

namespace runner::core {

enum class TextLines { kept, escaped };

// Control characters become visible escapes: C0 controls and DEL as \xHH (\r, and \n and \t where the text is
// one line, as \r \n \t), C1 controls (U+0080-U+009F) and bidirectional overrides as \uHHHH, and bytes that are not
// UTF-8 as \xHH. TextLines::kept leaves \n and \t as they are (multi-line messages, tracebacks).
std::string terminal_text(std::string_view text, TextLines lines = TextLines::kept);

}  // namespace runner::core
