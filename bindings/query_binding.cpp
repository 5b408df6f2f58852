// runner.query's native: a read-only SQL query over the index, its parameters and rows as Lua values.
#include <cmath>
#include <fmt/format.h>
#include <string>
#include <variant>
#include <vector>

#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "runtime/core/launch_context.h"
#include "runtime/index/index_database.h"
#include "runtime/index/read_query.h"

namespace runner::bindings {
namespace {

// runner._query(sql, ...) -> rows, columns
int query(lua_State* L) {
  const std::string sql = check_string(L, 1);
  std::vector<index::SqlValue> parameters;
  for (int i = 2; i <= lua_gettop(L); ++i) {
    switch (lua_type(L, i)) {
      case LUA_TNUMBER: {
        const double value = lua_tonumber(L, i);
        if (value == std::floor(value) && std::fabs(value) < 9.007199254740992e15)
          parameters.emplace_back(static_cast<int64_t>(value));
        else
          parameters.emplace_back(value);
        break;
      }
      case LUA_TSTRING:
        parameters.emplace_back(std::string(lua_tostring(L, i)));
        break;
      case LUA_TBOOLEAN:
        parameters.emplace_back(static_cast<int64_t>(lua_toboolean(L, i)));
        break;
      case LUA_TNIL:
        parameters.emplace_back(std::monostate{});
        break;
      default:
        throw std::invalid_argument(fmt::format(
            "runner.query: parameter {} is a {} (numbers, strings, booleans or nil)", i - 1, luaL_typename(L, i)));
    }
  }
  index::Database db = index::open_index_for_reading(index::index_location(core::launch_context()));
  const index::QueryResult result = index::run_read_query(db, sql, parameters);
  lua_createtable(L, static_cast<int>(result.rows.size()), 0);
  for (size_t r = 0; r < result.rows.size(); ++r) {
    lua_createtable(L, 0, static_cast<int>(result.columns.size()));
    for (size_t c = 0; c < result.columns.size(); ++c) {
      const auto& value = result.rows[r][c];
      if (std::holds_alternative<std::monostate>(value)) continue;
      if (auto* integer = std::get_if<int64_t>(&value))
        lua_pushnumber(L, static_cast<double>(*integer));
      else if (auto* real = std::get_if<double>(&value))
        lua_pushnumber(L, *real);
      else {
        const auto& text = std::get<std::string>(value);
        lua_pushlstring(L, text.data(), text.size());
      }
      lua_setfield(L, -2, result.columns[c].c_str());
    }
    lua_rawseti(L, -2, static_cast<int>(r + 1));
  }
  lua_createtable(L, static_cast<int>(result.columns.size()), 0);
  for (size_t c = 0; c < result.columns.size(); ++c) {
    lua_pushstring(L, result.columns[c].c_str());
    lua_rawseti(L, -2, static_cast<int>(c + 1));
  }
  return 2;
}

}  // namespace

void open_query(lua_State* L) {
  lua_getglobal(L, "runner");
  lua_pushcfunction(L, wrap<query>);
  lua_setfield(L, -2, "_query");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
