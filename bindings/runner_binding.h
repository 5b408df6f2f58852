// The `runner` namespace: versions, logging, command-line overrides and usage errors.
#pragma once

#include <lua.hpp>

#include <string>
#include <vector>

namespace runner::bindings {

// Metatable of usage errors (bad command-line overrides): the host reports them without a traceback
// and exits with status 2.
inline constexpr const char* kUsageErrorType = "runner.UsageError";

// Registry key of the JSON that runner._report_config leaves for `runner --print-config`.
inline constexpr const char* kReportedConfigKey = "runner.reported_config";
// Registry key set (true) by the host for `runner --print-config`: runner._config_wanted() reads it, and no script
// can set it.
inline constexpr const char* kConfigWantedKey = "runner.config_wanted";

void open_runner(lua_State* L);
// Stores key=value strings as runner.overrides for config{} to apply.
void set_overrides(lua_State* L, const std::vector<std::string>& overrides);
// After a script ran: false (with a usage error on the stack) when overrides were given but the script
// never declared a config{} to apply them to.
bool check_overrides_used(lua_State* L);

}  // namespace runner::bindings
