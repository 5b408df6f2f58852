// A progress line drawn in place with '\r' and not yet ended: other output ends it first, so that nothing is
// written onto its end.
#pragma once

#include <cstdio>

namespace runner::core {

// The stream that has an open line, or nullptr. Safe to call from a signal handler.
void set_open_line(std::FILE* stream);
bool has_open_line(std::FILE* stream);
// Ends the open line with a newline, if there is one; the next progress line starts afresh below.
void end_open_line();
// end_open_line() for a signal handler: write(2) on the stream's descriptor.
void end_open_line_from_signal();

}  // namespace runner::core
