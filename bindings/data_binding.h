// What other bindings need from the data binding: the loader behind a userdata.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/data/loader.h"

namespace runner::bindings {

// A batch's epoch is 1-based in Lua (batch.epoch) and 0-based in the runtime (the epochs completed before it):
// the one conversion each way.
inline lua_Integer lua_epoch(std::int64_t epoch) { return static_cast<lua_Integer>(epoch + 1); }
inline std::int64_t runtime_epoch(lua_Number epoch) { return static_cast<std::int64_t>(epoch) - 1; }

// The loader held by the userdata at `index` (shared: a training run keeps the loader it checkpoints);
// raises a Lua type error for anything else.
std::shared_ptr<data::Loader> shared_loader(lua_State* L, int index);

}  // namespace runner::bindings
