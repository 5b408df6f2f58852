// Registers every bound area (torch, nn, optim, runner, data, diffusion, image grids, eval, run, train, dist) into a
// lua_State.
#pragma once

#include <lua.hpp>

namespace runner::bindings {

void open_nn(lua_State* L);          // nn_binding.cpp
void open_optim(lua_State* L);       // optim_binding.cpp
void open_data(lua_State* L);        // data_binding.cpp; after open_runner (fills runner._data)
void open_diffusion(lua_State* L);   // diffusion_binding.cpp; after open_runner (fills runner._diffusion)
void open_image_grid(lua_State* L);  // image_grid_binding.cpp; after open_runner (runner.save_grid, runner.make_grid)
void open_eval(lua_State* L);        // eval_binding.cpp; after open_runner (runner.eval)
void open_run(lua_State* L);         // run_binding.cpp; after open_runner (fills runner._run)
void open_query(lua_State* L);       // query_binding.cpp; after open_runner (runner._query)
void open_dist(lua_State* L);        // dist_binding.cpp; after open_runner (runner.dist)
void open_train(lua_State* L);       // train_binding.cpp; after open_runner (fills runner._train)
void open_all_bindings(lua_State* L);

}  // namespace runner::bindings
