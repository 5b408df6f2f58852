// A span of seconds the launch environment sets, read where it applies.
#include "runtime/core/environment_seconds.h"

#include <cmath>
#include <cstdlib>
#include <fmt/format.h>
#include <stdexcept>

#include "runtime/core/launch_context.h"

namespace runner::core {

double seconds_from_environment(const char* name, double fallback) {
  const auto& settings = launch_context().seconds_settings;
  const auto found = settings.find(name);
  if (found == settings.end() || found->second.empty()) return fallback;
  const char* text = found->second.c_str();
  char* end = nullptr;
  const double seconds = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(seconds > 0) || !std::isfinite(seconds))
    throw std::invalid_argument(fmt::format("{}='{}' is not a number of seconds > 0", name, text));
  return seconds;
}

}  // namespace runner::core
