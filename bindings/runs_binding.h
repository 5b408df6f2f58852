// The run-index binding's hook for the Lua host: ends the active run with the script's final status.
#pragma once

#include <lua.hpp>

#include <optional>
#include <string>

namespace runner::bindings {

// Finishes the run started by runner.start in this state, if one is still active: flushes its metrics
// and records `status` (finished, failed, interrupted) and the error text. Never throws: returns what could
// not be recorded (lost metric values, a failed final checkpoint, the status row), naming the run.
std::optional<std::string> end_active_run(lua_State* L, const std::string& status,
                                          const std::optional<std::string>& error);

}  // namespace runner::bindings
