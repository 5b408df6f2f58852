// What other bindings need from the data binding: the loader behind a userdata.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/data/loader.h"

namespace runner::bindings {

// The loader held by the userdata at `index` (shared: a training run keeps the loader it checkpoints);
// raises a Lua type error for anything else.
std::shared_ptr<data::Loader> shared_loader(lua_State* L, int index);

}  // namespace runner::bindings
