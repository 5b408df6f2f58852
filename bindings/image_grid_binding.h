// Sample-grid options as scripts write them, shared by runner.save_grid, runner.make_grid and run:images.
#pragma once

#include <lua.hpp>

#include "runtime/image/image_grid.h"

namespace runner::bindings {

// {columns = 8, padding = 2, range = {-1, 1}, pad_value = 0} at `index` (nil: the defaults); unknown keys
// are errors naming `function`.
image::GridOptions grid_options(lua_State* L, int index, const char* function);

}  // namespace runner::bindings
