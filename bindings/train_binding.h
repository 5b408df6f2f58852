// What other bindings need from the trainer binding: the trainer behind a userdata.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/train/trainer.h"

namespace runner::bindings {

// The trainer held by the userdata at `index`; raises a Lua type error for anything else.
runner::train::Trainer& check_trainer(lua_State* L, int index);
// The same, shared (a training run keeps the trainer it is attached to).
std::shared_ptr<runner::train::Trainer> shared_trainer(lua_State* L, int index);

}  // namespace runner::bindings
