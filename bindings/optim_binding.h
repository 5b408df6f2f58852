// What other bindings need from the optim binding: the optimizer behind a userdata.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/train/optimizer.h"

namespace runner::bindings {

// The optimizer held by the optim userdata at `index`, or null for any other value.
std::shared_ptr<train::Optimizer> test_optimizer(lua_State* L, int index);

}  // namespace runner::bindings
