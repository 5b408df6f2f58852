// Value conversion of declared options tables and the registry of declared tables.
#include "bindings/option_table.h"

#include <cmath>
#include <fmt/format.h>

namespace runner::bindings {
namespace {

[[noreturn]] void wrong_type(lua_State* L, const char* key, const char* expected) {
  raise_error(L, fmt::format("option '{}' must be {}, got {}", key, expected, luaL_typename(L, -1)));
  throw std::logic_error("unreachable");
}

double number_value(lua_State* L, const char* key) {
  if (lua_type(L, -1) != LUA_TNUMBER) wrong_type(L, key, "a number");
  return lua_tonumber(L, -1);
}

std::int64_t integer_value(lua_State* L, const char* key) {
  const double value = number_value(L, key);
  if (std::floor(value) != value || std::fabs(value) > 9007199254740992.0) wrong_type(L, key, "an integer");
  return static_cast<std::int64_t>(value);
}

}  // namespace

std::map<std::string, std::vector<std::string>>& declared_option_tables() {
  static std::map<std::string, std::vector<std::string>> tables;
  return tables;
}

template <>
void read_option_value(lua_State* L, const char* key, double& target) {
  target = number_value(L, key);
}
template <>
void read_option_value(lua_State* L, const char* key, std::int64_t& target) {
  target = integer_value(L, key);
}
template <>
void read_option_value(lua_State* L, const char* key, int& target) {
  const std::int64_t value = integer_value(L, key);
  if (value < INT32_MIN || value > INT32_MAX) wrong_type(L, key, "a 32-bit integer");
  target = static_cast<int>(value);
}
template <>
void read_option_value(lua_State* L, const char* key, std::uint64_t& target) {
  const std::int64_t value = integer_value(L, key);
  if (value < 0) raise_error(L, fmt::format("option '{}' must be 0 or more, got {}", key, value));
  target = static_cast<std::uint64_t>(value);
}
template <>
void read_option_value(lua_State* L, const char* key, bool& target) {
  if (lua_type(L, -1) != LUA_TBOOLEAN) wrong_type(L, key, "a boolean");
  target = lua_toboolean(L, -1) != 0;
}
template <>
void read_option_value(lua_State* L, const char* key, std::string& target) {
  if (lua_type(L, -1) != LUA_TSTRING) wrong_type(L, key, "a string");
  size_t length = 0;
  const char* text = lua_tolstring(L, -1, &length);
  target.assign(text, length);
}
template <>
void read_option_value(lua_State* L, const char* key, std::optional<double>& target) {
  target = number_value(L, key);
}
template <>
void read_option_value(lua_State* L, const char* key, std::optional<std::int64_t>& target) {
  target = integer_value(L, key);
}
template <>
void read_option_value(lua_State* L, const char* key, std::optional<bool>& target) {
  bool value = false;
  read_option_value(L, key, value);
  target = value;
}
template <>
void read_option_value(lua_State* L, const char* key, std::optional<std::string>& target) {
  std::string value;
  read_option_value(L, key, value);
  target = std::move(value);
}
template <>
void read_option_value(lua_State* L, const char* key, std::vector<double>& target) {
  if (!lua_istable(L, -1)) wrong_type(L, key, "a list of numbers");
  target.clear();
  const int count = static_cast<int>(lua_objlen(L, -1));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, -1, i);
    target.push_back(number_value(L, key));
    lua_pop(L, 1);
  }
}
template <>
void read_option_value(lua_State* L, const char* key, std::vector<std::int64_t>& target) {
  target.clear();
  if (lua_type(L, -1) == LUA_TNUMBER) {
    target.push_back(integer_value(L, key));
    return;
  }
  if (!lua_istable(L, -1)) wrong_type(L, key, "a list of integers");
  const int count = static_cast<int>(lua_objlen(L, -1));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, -1, i);
    target.push_back(integer_value(L, key));
    lua_pop(L, 1);
  }
}

int push_declared_option_tables(lua_State* L) {
  lua_newtable(L);
  for (const auto& [meta_class, keys] : declared_option_tables()) {
    lua_createtable(L, static_cast<int>(keys.size()), 0);
    for (size_t i = 0; i < keys.size(); ++i) {
      lua_pushstring(L, keys[i].c_str());
      lua_rawseti(L, -2, static_cast<int>(i + 1));
    }
    lua_setfield(L, -2, meta_class.c_str());
  }
  return 1;
}

}  // namespace runner::bindings
