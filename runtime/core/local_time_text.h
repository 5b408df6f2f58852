// A moment as tables, reports and the dashboard write it: local time, "2026-11-22 14:03:12".
#pragma once

#include <ctime>
#include <string>

namespace runner::core {

inline std::string local_time_text(double unix_seconds) {
  const std::time_t seconds = static_cast<std::time_t>(unix_seconds);
  std::tm local{};
  ::localtime_r(&seconds, &local);
  char buffer[32];
  std::strftime(buffer, sizeof buffer, "%Y-%m-%d %H:%M:%S", &local);
  return buffer;
}

}  // namespace runner::core
