// What other bindings need from the trainer binding: the trainer behind a userdata, objectives as Lua values.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/train/trainer.h"

namespace runner::bindings {

// What the bindings do in the script's Lua state after each step of a trainer (runner attach's chunks, the Lua
// random generator's reseed): trainer:step and trainer:step_batch call it once the trainer's step has returned,
// with the batch at stack index `batch` (0: none) and the step's result table at `out`.
class LuaStepObserver {
 public:
  virtual ~LuaStepObserver() = default;
  virtual void after_step(lua_State* L, int batch, int out) = 0;
};

// Gives the trainer at `index` its Lua-side observer (replacing the one it had), held weakly: it ends when its
// owner drops it.
void set_lua_step_observer(lua_State* L, int index, const std::shared_ptr<LuaStepObserver>& observer);

// The trainer held by the userdata at `index`; raises a Lua type error for anything else.
runner::train::Trainer& check_trainer(lua_State* L, int index);
// The same, shared (a training run keeps the trainer it is attached to).
std::shared_ptr<runner::train::Trainer> shared_trainer(lua_State* L, int index);

// Objectives (what train:step(batch) minimises) as Lua values: pushes one, or returns the one at `index` (null
// for anything else).
void push_objective(lua_State* L, std::shared_ptr<runner::train::Objective> objective);
std::shared_ptr<runner::train::Objective> test_objective(lua_State* L, int index);

}  // namespace runner::bindings
