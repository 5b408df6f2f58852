// Lua values and JSON both ways.
#include "bindings/lua_json.h"

#include <ATen/ATen.h>

#include <cmath>
#include <fmt/format.h>

#include "bindings/tensor_binding.h"
#include "runtime/core/utf8_text.h"

namespace runner::bindings {

// Lua values as JSON: numbers (integral ones as integers), strings, booleans, arrays and string-keyed tables;
// one-element tensors as numbers.
nlohmann::json to_json(lua_State* L, int index, const std::string& where, int depth, TextCheck text_check) {
  if (index < 0 && index > LUA_REGISTRYINDEX) index = lua_gettop(L) + index + 1;
  if (depth > 20) throw std::invalid_argument(where + ": nested too deeply");
  switch (lua_type(L, index)) {
    case LUA_TNUMBER: {
      const double value = lua_tonumber(L, index);
      if (std::isfinite(value) && value == std::floor(value) && std::fabs(value) < 9.007199254740992e15)
        return static_cast<int64_t>(value);
      if (!std::isfinite(value)) return std::isnan(value) ? "nan" : (value > 0 ? "inf" : "-inf");
      return value;
    }
    case LUA_TSTRING: {
      size_t length = 0;
      const char* text = lua_tolstring(L, index, &length);
      if (text_check == TextCheck::utf8) core::require_utf8(std::string_view(text, length), where);
      return std::string(text, length);
    }
    case LUA_TBOOLEAN:
      return static_cast<bool>(lua_toboolean(L, index));
    case LUA_TTABLE: {
      const size_t length = lua_objlen(L, index);
      size_t count = 0;
      lua_pushnil(L);
      while (lua_next(L, index)) {
        ++count;
        lua_pop(L, 1);
      }
      if (length > 0 && count == length) {
        nlohmann::json array = nlohmann::json::array();
        for (size_t i = 1; i <= length; ++i) {
          lua_rawgeti(L, index, static_cast<int>(i));
          array.push_back(to_json(L, -1, fmt::format("{}[{}]", where, i), depth + 1, text_check));
          lua_pop(L, 1);
        }
        return array;
      }
      nlohmann::json object = nlohmann::json::object();
      lua_pushnil(L);
      while (lua_next(L, index)) {
        if (lua_type(L, -2) != LUA_TSTRING) {
          lua_pop(L, 2);
          throw std::invalid_argument(where + ": a table with keys that are not strings cannot be recorded");
        }
        size_t length = 0;
        const char* text = lua_tolstring(L, -2, &length);
        const std::string key(text, length);
        if (text_check == TextCheck::utf8) core::require_utf8(key, where + ": the key");
        object[key] = to_json(L, -1, where + "." + key, depth + 1, text_check);
        lua_pop(L, 1);
      }
      return object;
    }
    default:
      if (at::Tensor* tensor = test_tensor(L, index)) {
        if (tensor->numel() != 1)
          throw std::invalid_argument(
              fmt::format("{}: only one-element tensors can be recorded, got {} elements", where, tensor->numel()));
        return tensor->item<double>();
      }
      throw std::invalid_argument(
          fmt::format("{}: a {} cannot be recorded (numbers, strings, booleans and tables of them)", where,
                      luaL_typename(L, index)));
  }
}

void push_json(lua_State* L, const nlohmann::json& value) {
  if (value.is_null())
    lua_pushnil(L);
  else if (value.is_boolean())
    lua_pushboolean(L, value.get<bool>());
  else if (value.is_number())
    lua_pushnumber(L, value.get<double>());
  else if (value.is_string())
    lua_pushstring(L, value.get<std::string>().c_str());
  else if (value.is_array()) {
    lua_createtable(L, static_cast<int>(value.size()), 0);
    for (size_t i = 0; i < value.size(); ++i) {
      push_json(L, value[i]);
      lua_rawseti(L, -2, static_cast<int>(i + 1));
    }
  } else {
    lua_createtable(L, 0, static_cast<int>(value.size()));
    for (const auto& [key, item] : value.items()) {
      push_json(L, item);
      lua_setfield(L, -2, key.c_str());
    }
  }
}

}  // namespace runner::bindings
