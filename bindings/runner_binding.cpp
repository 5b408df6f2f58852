// The `runner` table: versions, logging, clocks, overrides, usage errors and runner.sweep.int's options; and
// open_all_bindings.
#include "bindings/runner_binding.h"

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fmt/format.h>

#include "bindings/binding.h"
#include "bindings/lua_json.h"
#include "bindings/bindings.h"
#include "bindings/option_table.h"
#include "bindings/stdlib_dir.h"
#include "bindings/tensor_binding.h"
#include "runtime/core/logging.h"
#include "runtime/core/open_line.h"
#include "runtime/core/version.h"

namespace runner::bindings {
namespace {

void push_usage_error(lua_State* L, const std::string& message) {
  lua_newtable(L);
  lua_pushlstring(L, message.data(), message.size());
  lua_setfield(L, -2, "message");
  luaL_getmetatable(L, kUsageErrorType);
  lua_setmetatable(L, -2);
}

// runner.usage_error(message): raises a usage error prefixed with the user's file:line.
int runner_usage_error(lua_State* L) {
  push_usage_error(L, user_where(L) + check_string(L, 1));
  return lua_error(L);
}

int usage_error_tostring(lua_State* L) {
  lua_getfield(L, 1, "message");
  return 1;
}

struct SweepIntOptions {
  std::int64_t step = 1;  // the grid's and the draw's spacing
  bool log = false;       // log-uniform (step 1)
};
const OptionTable<SweepIntOptions> kSweepIntOptions("runner.sweep.int", "SweepIntOptions",
                                                    {option("step", &SweepIntOptions::step),
                                                     option("log", &SweepIntOptions::log)});

// runner._sweep_int_options([options]) -> step, log: runner.sweep.int's options, the defaults filled in.
int runner_sweep_int_options(lua_State* L) {
  const SweepIntOptions options = kSweepIntOptions.read(L, 1);
  lua_pushinteger(L, static_cast<lua_Integer>(options.step));
  lua_pushboolean(L, options.log);
  return 2;
}

// runner.log(level, message)
int runner_log(lua_State* L) {
  const std::string level = check_string(L, 1);
  const std::string message = check_string(L, 2);
  const core::LogLevel parsed = core::parse_log_level(level);
  if (parsed == core::LogLevel::off) luaL_argerror(L, 1, "log level must be trace, debug, info, warn or error");
  core::log(parsed, message);
  return 0;
}

// runner.clock(): monotonic seconds, for timing inside scripts.
int runner_clock(lua_State* L) {
  const auto now = std::chrono::steady_clock::now().time_since_epoch();
  lua_pushnumber(L, std::chrono::duration<double>(now).count());
  return 1;
}

// runner.versions(): {runner=, libtorch=, luajit=, sqlite=, cuda_runtime=, cuda_available=, cuda_devices={...}}
int runner_versions(lua_State* L) {
  const core::VersionInfo info = core::version_info();
  lua_newtable(L);
  lua_pushstring(L, info.runner.c_str());
  lua_setfield(L, -2, "runner");
  lua_pushstring(L, info.libtorch.c_str());
  lua_setfield(L, -2, "libtorch");
  lua_pushstring(L, LUAJIT_VERSION);
  lua_setfield(L, -2, "luajit");
  lua_pushstring(L, info.sqlite.c_str());
  lua_setfield(L, -2, "sqlite");
  lua_pushstring(L, info.cuda_runtime.c_str());
  lua_setfield(L, -2, "cuda_runtime");
  lua_pushboolean(L, info.cuda_available);
  lua_setfield(L, -2, "cuda_available");
  lua_newtable(L);
  for (size_t i = 0; i < info.cuda_devices.size(); ++i) {
    lua_pushstring(L, info.cuda_devices[i].c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  lua_setfield(L, -2, "cuda_devices");
  return 1;
}

// runner._did_you_mean(key, names) -> "; did you mean 'x'?" or ""
int runner_did_you_mean(lua_State* L) {
  const std::string key = check_string(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  std::vector<std::string> names;
  for (int i = 1; lua_rawgeti(L, 2, i), !lua_isnil(L, -1); ++i) {
    if (lua_type(L, -1) == LUA_TSTRING) names.emplace_back(lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  const std::string suggestion = did_you_mean(key, names);
  lua_pushlstring(L, suggestion.data(), suggestion.size());
  return 1;
}

// runner._end_open_line(): ends a progress line drawn in place (core::end_open_line)
int runner_end_open_line(lua_State*) {
  core::end_open_line();
  return 0;
}

// runner._config_wanted() -> whether the host runs the script for `runner --print-config`
int runner_config_wanted(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, kConfigWantedKey);
  lua_pushboolean(L, lua_toboolean(L, -1));
  return 1;
}

// runner._report_config(defaults, integers): for `runner --print-config`, the declared keys as JSON
// {"keys": {name: {"default": value, "integer": bool}}} kept in the registry for the host to print.
int runner_report_config(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  luaL_checktype(L, 2, LUA_TTABLE);
  nlohmann::json keys = nlohmann::json::object();
  lua_pushnil(L);
  while (lua_next(L, 1)) {
    if (lua_type(L, -2) == LUA_TSTRING) {
      const std::string key = lua_tostring(L, -2);
      lua_getfield(L, 2, key.c_str());
      const bool integer = lua_toboolean(L, -1) != 0;
      lua_pop(L, 1);
      keys[key] = {{"default", to_json(L, -1, "config key '" + key + "'")}, {"integer", integer}};
    }
    lua_pop(L, 1);
  }
  const std::string text = nlohmann::json{{"keys", keys}}.dump();
  lua_pushlstring(L, text.data(), text.size());
  lua_setfield(L, LUA_REGISTRYINDEX, kReportedConfigKey);
  return 0;
}

// runner._stub_paths() -> the ---@meta stubs (stdlib/meta/*.lua), sorted: help's documentation.
int runner_stub_paths(lua_State* L) {
  std::vector<std::string> paths;
  std::error_code error;
  for (const auto& entry : std::filesystem::directory_iterator(std::string(stdlib_dir()) + "/meta", error))
    if (entry.path().extension() == ".lua") paths.push_back(entry.path().string());
  std::sort(paths.begin(), paths.end());
  lua_createtable(L, static_cast<int>(paths.size()), 0);
  for (std::size_t i = 0; i < paths.size(); ++i) {
    lua_pushstring(L, paths[i].c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

}  // namespace

void open_runner(lua_State* L) {
  luaL_newmetatable(L, kUsageErrorType);
  lua_pushcfunction(L, usage_error_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  lua_newtable(L);
  set_functions(L, {
                       {"usage_error", runner_usage_error},
                       {"log", wrap<runner_log>},
                       {"clock", wrap<runner_clock>},
                       {"versions", wrap<runner_versions>},
                       {"option_tables", wrap<push_declared_option_tables>},
                       {"_did_you_mean", wrap<runner_did_you_mean>},
                       {"_end_open_line", wrap<runner_end_open_line>},
                       {"_report_config", wrap<runner_report_config>},
                       {"_config_wanted", wrap<runner_config_wanted>},
                       {"_stub_paths", wrap<runner_stub_paths>},
                       {"_sweep_int_options", wrap<runner_sweep_int_options>},
                   });
  lua_newtable(L);
  lua_setfield(L, -2, "overrides");
  lua_setglobal(L, "runner");
}

void set_overrides(lua_State* L, const std::vector<std::string>& overrides) {
  lua_getglobal(L, "runner");
  lua_createtable(L, static_cast<int>(overrides.size()), 0);
  for (size_t i = 0; i < overrides.size(); ++i) {
    lua_pushstring(L, overrides[i].c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  lua_setfield(L, -2, "overrides");
  lua_pop(L, 1);
}

bool check_overrides_used(lua_State* L) {
  lua_getglobal(L, "runner");
  lua_getfield(L, -1, "overrides");
  const size_t count = lua_objlen(L, -1);
  lua_getfield(L, -2, "config");
  const bool declared = !lua_isnil(L, -1);
  std::string given;
  for (size_t i = 1; i <= count; ++i) {
    lua_rawgeti(L, -2, static_cast<int>(i));
    given += (given.empty() ? "" : " ") + std::string(lua_tostring(L, -1));
    lua_pop(L, 1);
  }
  lua_pop(L, 3);
  if (count == 0 || declared) return true;
  push_usage_error(
      L, fmt::format("overrides given ({}) but the script declares no config {{ ... }} to apply them to", given));
  return false;
}

void open_all_bindings(lua_State* L) {
  open_tensor(L);
  open_tensor_ops(L);
  open_safetensors(L);
  open_nn(L);
  open_optim(L);
  open_runner(L);
  open_data(L);
  open_diffusion(L);
  open_image_grid(L);
  open_eval(L);
  open_run(L);
  open_query(L);
  open_train(L);
  open_dist(L);
}

}  // namespace runner::bindings
