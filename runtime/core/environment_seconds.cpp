// A span of seconds read from an environment variable.
#include "runtime/core/environment_seconds.h"

#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <stdexcept>

namespace runner::core {

double seconds_from_environment(const char* name, double fallback) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument(fmt::format("{}='{}' is not a number of seconds > 0", name, text));
  return seconds;
}

}  // namespace runner::core
