// A span of seconds read from an environment variable (RUNNER_ATTACH_IDLE_TIMEOUT, the RUNNER_INDEX_*_TIMEOUT ones).
#pragma once

namespace runner::core {

// The variable's value, or `fallback` when it is unset or empty. Throws std::invalid_argument naming the variable
// and its value when that is not a number of seconds > 0.
double seconds_from_environment(const char* name, double fallback);

}  // namespace runner::core
