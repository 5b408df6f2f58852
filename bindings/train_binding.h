// What other bindings need from the trainer binding: the trainer behind a userdata, objectives as Lua values.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/train/trainer.h"

namespace runner::bindings {

// The trainer held by the userdata at `index`; raises a Lua type error for anything else.
runner::train::Trainer& check_trainer(lua_State* L, int index);
// The same, shared (a training run keeps the trainer it is attached to).
std::shared_ptr<runner::train::Trainer> shared_trainer(lua_State* L, int index);

// Objectives (what train:step(batch) minimises) as Lua values: pushes one, or returns the one at `index` (null
// for anything else).
void push_objective(lua_State* L, std::shared_ptr<runner::train::Objective> objective);
std::shared_ptr<runner::train::Objective> test_objective(lua_State* L, int index);

}  // namespace runner::bindings
