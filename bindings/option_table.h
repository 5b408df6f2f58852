// Options tables declared once: each Lua options table maps onto a runtime options struct through a list of
// fields (the Lua key, the struct member, required or not); the default is the struct's own. One table
// checks the keys (an unknown key names the known ones), the required ones and the types, and fills the
// struct. Every table is registered under the name of its ---@meta class, so a spec holds the stubs to it.
#pragma once

#include <lua.hpp>

#include <cstdint>
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <type_traits>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "bindings/binding.h"

namespace runner::bindings {

// The declared tables by ---@meta class name: their keys in declaration order.
std::map<std::string, std::vector<std::string>>& declared_option_tables();

// Reads the value at the top of the stack for option `key` into a member of type T (raises a Lua error
// naming the option for a wrong type).
template <class T>
void read_option_value(lua_State* L, const char* key, T& target);
template <>
void read_option_value(lua_State* L, const char* key, double& target);
template <>
void read_option_value(lua_State* L, const char* key, std::int64_t& target);
template <>
void read_option_value(lua_State* L, const char* key, int& target);
template <>
void read_option_value(lua_State* L, const char* key, std::uint64_t& target);
template <>
void read_option_value(lua_State* L, const char* key, bool& target);
template <>
void read_option_value(lua_State* L, const char* key, std::string& target);
template <>
void read_option_value(lua_State* L, const char* key, std::optional<double>& target);
template <>
void read_option_value(lua_State* L, const char* key, std::optional<std::int64_t>& target);
template <>
void read_option_value(lua_State* L, const char* key, std::optional<bool>& target);
template <>
void read_option_value(lua_State* L, const char* key, std::optional<std::string>& target);
template <>
void read_option_value(lua_State* L, const char* key, std::vector<double>& target);
template <>
void read_option_value(lua_State* L, const char* key, std::vector<std::int64_t>& target);

template <class Struct>
struct OptionField {
  const char* key;
  bool required = false;
  // Reads the value at the top of the stack into the struct; empty for a key that Lua code consumes
  // (declared and checked here, read by the stdlib).
  std::function<void(lua_State*, const char*, Struct&)> read;
};

// `key` into `member`, converted by its type: double, bool, std::string, integers, std::optional of those,
// std::vector<double> / std::vector<std::int64_t> (a list, or one integer for a list of one).
template <class Struct, class T>
OptionField<Struct> option(const char* key, T Struct::*member, bool required = false) {
  return {key, required, [member](lua_State* L, const char* k, Struct& s) { read_option_value(L, k, s.*member); }};
}

// `key` read by a function of the value at the top of the stack (an enum name, a device, a nested table).
template <class Struct, class F>
OptionField<Struct> option_with(const char* key, F read, bool required = false) {
  return {key, required, [read](lua_State* L, const char* k, Struct& s) { read(L, k, s); }};
}

// A key the stdlib reads itself (a module, a Lua function): declared, checked for presence when required.
template <class Struct>
OptionField<Struct> lua_option(const char* key, bool required = false) {
  return {key, required, {}};
}

template <class Struct>
class OptionTable {
 public:
  // `function` names the caller in messages ("runner.trainer"); `meta_class` is the stub's ---@class.
  OptionTable(const char* function, const char* meta_class, std::vector<OptionField<Struct>> fields)
      : function_(function), fields_(std::move(fields)) {
    std::vector<std::string>& keys = declared_option_tables()[meta_class];
    keys.clear();
    for (const auto& field : fields_) keys.emplace_back(field.key);
  }

  // Fills `value` (the defaults) from the table at `index` (nil: an empty table).
  Struct read(lua_State* L, int index, Struct value = Struct{}) const {
    return read_as(function_, L, index, std::move(value));
  }

  // read, with messages naming `function` (one table behind several functions: the tensor factories, the losses).
  Struct read_as(const char* function, lua_State* L, int index, Struct value = Struct{}) const {
    if (lua_isnoneornil(L, index)) {
      for (const auto& field : fields_)
        if (field.required) raise_error(L, fmt::format("{}: option '{}' is required", function, field.key));
      return value;
    }
    if (!lua_istable(L, index))
      raise_error(L, fmt::format("{}: expected an options table, got {}", function, luaL_typename(L, index)));
    index = index > 0 ? index : lua_gettop(L) + index + 1;
    check_keys(L, index, function);
    for (const auto& field : fields_) {
      lua_getfield(L, index, field.key);
      if (lua_isnil(L, -1)) {
        lua_pop(L, 1);
        if (field.required) raise_error(L, fmt::format("{}: option '{}' is required", function, field.key));
        continue;
      }
      if (field.read) field.read(L, field.key, value);
      lua_pop(L, 1);
    }
    return value;
  }

  const char* function() const { return function_; }

 private:
  void check_keys(lua_State* L, int index, const char* function) const {
    lua_pushnil(L);
    while (lua_next(L, index)) {
      lua_pop(L, 1);
      bool found = false;
      if (lua_type(L, -1) == LUA_TSTRING)
        for (const auto& field : fields_) found = found || std::string_view(field.key) == lua_tostring(L, -1);
      if (!found) {
        std::vector<std::string> names;
        for (const auto& field : fields_) names.emplace_back(field.key);
        std::sort(names.begin(), names.end());
        raise_unknown_option(L, index, function, names);
      }
    }
  }

  const char* function_;
  std::vector<OptionField<Struct>> fields_;
};

// runner.option_tables() -> {[meta class] = {key, ...}}: for the spec that checks the ---@meta stubs.
int push_declared_option_tables(lua_State* L);

}  // namespace runner::bindings
