// Lua values and JSON both ways: configs, summaries and checkpoint state cross the binding as JSON.
#pragma once

#include <lua.hpp>
#include <nlohmann/json.hpp>

#include <string>

namespace runner::bindings {

// Numbers (integral ones as integers; non-finite ones as "nan", "inf", "-inf"), strings, booleans, arrays and
// string-keyed tables; one-element tensors as numbers. `where` names the value in error messages.
// Text that is not UTF-8 is refused ("WHERE.key is not valid UTF-8 ...") unless `text` is TextCheck::later (the sweep
// file, whose own check names the line).
enum class TextCheck { utf8, later };
nlohmann::json to_json(lua_State* L, int index, const std::string& where, int depth = 0,
                       TextCheck text = TextCheck::utf8);
// The inverse: objects and arrays become tables, null becomes nil.
void push_json(lua_State* L, const nlohmann::json& value);

}  // namespace runner::bindings
