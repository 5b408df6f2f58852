// The nn.functional table, built by nn_functional_binding.cpp and set into nn by open_nn (nn_binding.cpp).
#pragma once

#include <lua.hpp>

namespace runner::bindings {

// Pushes a new table holding the nn.functional functions.
void push_nn_functional(lua_State* L);

}  // namespace runner::bindings
