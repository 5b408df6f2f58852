// A word for a POSIX shell: as it is when it needs no quoting, else in single quotes (commands runner prints or runs).
#pragma once

#include <string>

namespace runner::core {

inline std::string shell_word(const std::string& text) {
  if (!text.empty() && text.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
                                              "_-./:=@,+%") == std::string::npos)
    return text;
  std::string quoted = "'";
  for (char c : text) quoted += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return quoted + "'";
}

}  // namespace runner::core
