// Monotonic seconds for measuring intervals: std::chrono::steady_clock as a double.
#pragma once

#include <chrono>

namespace runner::core {

inline double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace runner::core
