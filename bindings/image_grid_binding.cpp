// Sample grids: runner.save_grid writes images as one PNG grid, runner.make_grid returns it as a tensor; the
// grid options are also read by run:images (run_binding.cpp).
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>
#include <vector>

#include "bindings/bindings.h"
#include "bindings/image_grid_binding.h"
#include "bindings/option_table.h"
#include "bindings/tensor_binding.h"
#include "runtime/image/image_grid.h"

namespace runner::bindings {

namespace {

const OptionTable<image::GridOptions> kGridOptions(
    "make_grid", "GridOptions",
    {
        option("columns", &image::GridOptions::columns),
        option("padding", &image::GridOptions::padding),
        option_with<image::GridOptions>("range",
                                        [](lua_State* L, const char* key, image::GridOptions& o) {
                                          std::vector<double> range;
                                          read_option_value(L, key, range);
                                          if (range.size() != 2)
                                            throw std::invalid_argument(
                                                "option 'range' must hold two numbers {low, high}");
                                          o.low = range[0];
                                          o.high = range[1];
                                        }),
        option("pad_value", &image::GridOptions::pad_value),
    });

}  // namespace

image::GridOptions grid_options(lua_State* L, int index, const char* function) {
  return kGridOptions.read_as(function, L, index);
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

}  // namespace

void open_image_grid(lua_State* L) {
  lua_getglobal(L, "runner");
  set_functions(L, {{"save_grid", wrap<save_grid>}, {"make_grid", wrap<make_grid>}});
  lua_pop(L, 1);
}

}  // namespace runner::bindings
