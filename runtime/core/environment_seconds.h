// A span of seconds the launch environment sets (RUNNER_ATTACH_IDLE_TIMEOUT, the RUNNER_INDEX_*_TIMEOUT ones), read
// where it applies.
#pragma once

namespace runner::core {

// The variable's value in the launch context (LaunchContext::seconds_settings), or `fallback` when it is unset or
// empty. Throws std::invalid_argument naming the variable and its value when that is not a number of seconds > 0.
double seconds_from_environment(const char* name, double fallback);

}  // namespace runner::core
