// The sweep file of `runner sweep`, evaluated in a Lua host.
#include "bindings/sweep_file.h"

#include <cerrno>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <sstream>

#include "bindings/lua_host.h"
#include "bindings/lua_json.h"
#include "runtime/cli/command_line.h"
#include "runtime/sweep/sweep_spec.h"

namespace runner::bindings {

std::variant<nlohmann::json, int> read_sweep_file(const std::string& path) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw cli::UsageError(fmt::format("cannot open {}: {}", path, std::strerror(errno)));
  std::stringstream text;
  text << file.rdbuf();
  LuaHost host;
  lua_State* L = host.state();
  lua_getglobal(L, "runner");
  lua_pushlstring(L, path.data(), path.size());
  lua_setfield(L, -2, "_sweep_file");  // where runner.sweep finds its lines after `return runner.sweep {`
  lua_pop(L, 1);
  if (host.load_text(text.str(), "@" + path) != 0) {
    const std::string message = lua_tostring(L, -1) ? lua_tostring(L, -1) : "syntax error";
    lua_pop(L, 1);
    throw cli::UsageError(message);
  }
  const int status = host.call(0, 1);
  if (status != core::kExitOk) return status;
  bool is_sweep = false;
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "kind");
    is_sweep = lua_isstring(L, -1) && std::strcmp(lua_tostring(L, -1), "runner.sweep") == 0;
    lua_pop(L, 1);
  }
  if (!is_sweep) throw cli::UsageError(fmt::format("{}: a sweep file returns runner.sweep {{ ... }}", path));
  lua_getfield(L, -1, "where");
  const std::string where = lua_isstring(L, -1) ? lua_tostring(L, -1) : path;
  lua_pop(L, 1);
  nlohmann::json definition;
  try {
    definition = to_json(L, -1, "the sweep", 0, TextCheck::later);  // sweep_spec names the line of bad text
  } catch (const std::invalid_argument& error) {
    throw sweep::SweepError(fmt::format("{}: {}", where, error.what()));
  }
  lua_pop(L, 1);
  return std::variant<nlohmann::json, int>(std::in_place_index<0>, std::move(definition));
}

}  // namespace runner::bindings
