// What scripts do with generated samples: sample grids as PNG files (runner.save_grid, runner.make_grid) and
// a download-free quality number (runner.eval.sliced_wasserstein).
#include <ATen/ATen.h>

#include "bindings/bindings.h"
#include "bindings/samples_binding.h"
#include "bindings/tensor_binding.h"
#include "runtime/eval/sliced_wasserstein.h"
#include "runtime/image/image_grid.h"

namespace runner::bindings {

image::GridOptions grid_options(lua_State* L, int index, const char* function) {
  image::GridOptions o;
  if (lua_isnoneornil(L, index)) return o;
  luaL_checktype(L, index, LUA_TTABLE);
  check_option_keys(L, index, function, {"columns", "padding", "range", "pad_value"});
  o.columns = field_integer(L, index, "columns", o.columns);
  o.padding = field_integer(L, index, "padding", o.padding);
  o.pad_value = field_number(L, index, "pad_value", o.pad_value);
  const auto range = field_numbers(L, index, "range", {o.low, o.high});
  if (range.size() != 2) throw std::invalid_argument("option 'range' must hold two numbers {low, high}");
  o.low = range[0];
  o.high = range[1];
  return o;
}

namespace {

// runner.save_grid(path, images [N, C, H, W] [, {columns = 8, padding = 2, range = {-1, 1}, pad_value = 0}])
int save_grid(lua_State* L) {
  const std::string path = check_string(L, 1);
  image::save_grid(path, check_tensor(L, 2), grid_options(L, 3, "save_grid"));
  return 0;
}

// runner.make_grid(images [, options]) -> uint8 [H, W, C] on the CPU
int make_grid(lua_State* L) {
  push_tensor(L, image::make_grid(check_tensor(L, 1), grid_options(L, 2, "make_grid")));
  return 1;
}

// runner.eval.sliced_wasserstein(a, b [, {resolution = 16, projections = 512, seed = 0}]) -> number
int sliced_wasserstein(lua_State* L) {
  eval::SlicedWassersteinOptions o;
  if (!lua_isnoneornil(L, 3)) {
    luaL_checktype(L, 3, LUA_TTABLE);
    check_option_keys(L, 3, "sliced_wasserstein", {"resolution", "projections", "seed"});
    o.resolution = field_integer(L, 3, "resolution", o.resolution);
    o.projections = field_integer(L, 3, "projections", o.projections);
    o.seed = static_cast<std::uint64_t>(field_integer(L, 3, "seed", 0));
  }
  lua_pushnumber(L, eval::sliced_wasserstein(check_tensor(L, 1), check_tensor(L, 2), o));
  return 1;
}

}  // namespace

void open_samples(lua_State* L) {
  lua_getglobal(L, "runner");
  set_functions(L, {{"save_grid", wrap<save_grid>}, {"make_grid", wrap<make_grid>}});
  lua_newtable(L);
  set_functions(L, {{"sliced_wasserstein", wrap<sliced_wasserstein>}});
  lua_setfield(L, -2, "eval");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
