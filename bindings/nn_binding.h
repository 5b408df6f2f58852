// What other bindings need from the nn binding: the built-in denoiser behind a module userdata.
#pragma once

#include <lua.hpp>

#include <memory>

#include "runtime/nn/denoiser.h"

namespace runner::bindings {

// The UNet or DiT held by the module userdata at `index`, or nullptr for anything else.
std::shared_ptr<runner::nn::Denoiser> test_denoiser(lua_State* L, int index);

}  // namespace runner::bindings
