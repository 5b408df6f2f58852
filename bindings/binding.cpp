// The binding idiom: error translation and argument helpers.
#include "bindings/binding.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <regex>

#include "bindings/stdlib_dir.h"

namespace runner::bindings {
namespace {

const char* interrupt_key = "runner.interrupt";

}  // namespace

bool is_stdlib_source(const char* source) {
  static const std::string stdlib_prefix = std::string("@") + stdlib_dir() + "/";
  return std::strncmp(source, stdlib_prefix.c_str(), stdlib_prefix.size()) == 0;
}

std::string source_name(const lua_Debug& frame) {
  return frame.source && frame.source[0] == '@' ? std::string(frame.source + 1) : std::string(frame.short_src);
}

std::string user_where(lua_State* L) {
  lua_Debug frame;
  for (int level = 1; lua_getstack(L, level, &frame); ++level) {
    lua_getinfo(L, "Sl", &frame);
    if (frame.currentline <= 0 || is_stdlib_source(frame.source)) continue;
    return fmt::format("{}:{}: ", source_name(frame), frame.currentline);
  }
  return "";
}

int raise_error(lua_State* L, const std::string& message) {
  lua_pushstring(L, (user_where(L) + message).c_str());
  return lua_error(L);
}

namespace {
thread_local lua_State* calling_state = nullptr;
}  // namespace

lua_State* calling_lua_state() { return calling_state; }

detail::CallingState::CallingState(lua_State* L) : previous_(calling_state) { calling_state = L; }
detail::CallingState::~CallingState() { calling_state = previous_; }

int raise_exit(lua_State* L, int status) {
  lua_getglobal(L, "os");
  lua_getfield(L, -1, "exit");
  lua_pushinteger(L, status);
  lua_call(L, 1, 0);
  return luaL_error(L, "os.exit returned");
}

int raise_interrupt(lua_State* L) {
  lua_pushlightuserdata(L, const_cast<char*>(interrupt_key));
  return lua_error(L);
}

bool is_interrupt_error(lua_State* L, int index) {
  return lua_islightuserdata(L, index) && lua_touserdata(L, index) == interrupt_key;
}

void set_functions(lua_State* L, std::initializer_list<Function> functions) {
  for (const auto& [name, function] : functions) {
    lua_pushcfunction(L, function);
    lua_setfield(L, -2, name);
  }
}

int raise_type_error(lua_State* L, int index, const char* display_name) {
  const char* actual = luaL_typename(L, index);
  if (lua_getmetatable(L, index)) {
    lua_getfield(L, -1, "__name");
    if (lua_type(L, -1) == LUA_TSTRING) {
      actual = lua_tostring(L, -1);
      if (std::strncmp(actual, "runner.", 7) == 0) actual += 7;
    }
  }
  return luaL_argerror(L, index, fmt::format("{} expected, got {}", display_name, actual).c_str());
}

std::int64_t check_integer(lua_State* L, int index) {
  const double value = luaL_checknumber(L, index);
  if (std::floor(value) != value || std::fabs(value) > 9007199254740992.0)
    luaL_argerror(L, index, fmt::format("integer expected, got {}", value).c_str());
  return static_cast<std::int64_t>(value);
}

std::int64_t opt_integer(lua_State* L, int index, std::int64_t fallback) {
  return lua_isnoneornil(L, index) ? fallback : check_integer(L, index);
}

bool opt_boolean(lua_State* L, int index, bool fallback) {
  if (lua_isnoneornil(L, index)) return fallback;
  luaL_checktype(L, index, LUA_TBOOLEAN);
  return lua_toboolean(L, index) != 0;
}

std::string check_string(lua_State* L, int index) {
  size_t length = 0;
  const char* text = luaL_checklstring(L, index, &length);
  return std::string(text, length);
}

std::string with_zero_based_note(std::string message) {
  // "except in dimension 0", "at non-singleton dimension 1", "for tensor number 1 in the list", "dim 0"
  static const std::regex counted(R"((dimension|dim|position|number) \(?-?[0-9])", std::regex::icase);
  if (!std::regex_search(message, counted)) return message;
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) message.pop_back();
  return message +
         " (LibTorch counts dimensions and list entries from 0 in this message: its dimension 0 is "
         "dim 1 here, its tensor number 0 the first tensor)";
}

int raise_unknown_option(lua_State* L, int table, const std::string& function, const std::vector<std::string>& names) {
  if (lua_type(L, -1) == LUA_TSTRING) {
    const std::string key = lua_tostring(L, -1);
    return raise_error(L, fmt::format("unknown option '{}' to '{}' (known: {}){}", key, function,
                                      fmt::join(names, ", "), did_you_mean(key, names)));
  }
  lua_pushvalue(L, -1);
  lua_rawget(L, table);
  const std::string value =
      lua_type(L, -1) == LUA_TSTRING ? fmt::format("'{}'", lua_tostring(L, -1)) : luaL_typename(L, -1);
  lua_pop(L, 1);
  const std::string key =
      lua_type(L, -1) == LUA_TNUMBER ? fmt::format("[{}]", lua_tonumber(L, -1)) : luaL_typename(L, -1);
  return raise_error(L, fmt::format("'{}' takes named options only, not the entry {} = {} (known: {})", function, key,
                                    value, fmt::join(names, ", ")));
}

bool has_field(lua_State* L, int index, const char* key) {
  if (!lua_istable(L, index)) return false;
  lua_getfield(L, index, key);
  const bool present = !lua_isnil(L, -1);
  lua_pop(L, 1);
  return present;
}

namespace {

// Pushes t[key] when index is a table holding key; returns false (pushing nothing) otherwise.
bool push_field(lua_State* L, int index, const char* key) {
  if (!lua_istable(L, index)) return false;
  lua_getfield(L, index, key);
  if (!lua_isnil(L, -1)) return true;
  lua_pop(L, 1);
  return false;
}

[[noreturn]] void field_type_error(lua_State* L, const char* key, const char* expected) {
  const std::string message = fmt::format("option '{}' must be {}, got {}", key, expected, luaL_typename(L, -1));
  raise_error(L, message);
  throw std::logic_error("unreachable");
}

}  // namespace

std::string field_string(lua_State* L, int index, const char* key, const std::string& fallback) {
  if (!push_field(L, index, key)) return fallback;
  if (lua_type(L, -1) != LUA_TSTRING) field_type_error(L, key, "a string");
  std::string value = lua_tostring(L, -1);
  lua_pop(L, 1);
  return value;
}

}  // namespace runner::bindings
