// Process-wide torch state from Lua: seeding, threads, devices, held bytes, and torch.cuda.
#include "bindings/tensor_parts.h"

#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>
#include <cmath>
#include <fmt/format.h>
#include <torch/utils.h>

#include "bindings/option_table.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/tensor_format.h"
#include "bindings/tensor_binding.h"

namespace runner::bindings {
namespace {

int torch_manual_seed(lua_State* L) {
  const std::int64_t seed = check_integer(L, 1);
  if (seed < 0) luaL_argerror(L, 1, "seed must be non-negative");
  torch::manual_seed(static_cast<std::uint64_t>(seed));
  return 0;
}

// torch.initial_seed() -> the seed of the CPU generator (the last torch.manual_seed, or LibTorch's default)
int torch_initial_seed(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(at::detail::getDefaultCPUGenerator().current_seed()));
  return 1;
}

int torch_is_tensor(lua_State* L) {
  lua_pushboolean(L, test_tensor(L, 1) != nullptr);
  return 1;
}

int torch_device(lua_State* L) {
  lua_pushstring(L, core::device_name(core::parse_device(check_string(L, 1))).c_str());
  return 1;
}

int torch_set_num_threads(lua_State* L) {
  const std::int64_t threads = check_integer(L, 1);
  if (threads < 1) luaL_argerror(L, 1, "thread count must be at least 1");
  at::set_num_threads(static_cast<int>(threads));
  return 0;
}

int torch_get_num_threads(lua_State* L) {
  lua_pushnumber(L, at::get_num_threads());
  return 1;
}

int torch_held_bytes(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(lua_held_tensor_bytes()));
  return 1;
}

int cuda_is_available(lua_State* L) {
  lua_pushboolean(L, core::cuda_available());
  return 1;
}

int cuda_device_count(lua_State* L) {
  lua_pushnumber(L, core::cuda_device_count());
  return 1;
}

int cuda_tf32(lua_State* L) {
  if (!lua_isnoneornil(L, 1)) {
    luaL_checktype(L, 1, LUA_TBOOLEAN);
    core::set_tf32(lua_toboolean(L, 1) != 0);
  }
  lua_pushboolean(L, core::tf32_enabled());
  return 1;
}

int cuda_device_index(lua_State* L, int arg) {
  if (!core::cuda_available()) luaL_error(L, "CUDA is not available");
  const int index = static_cast<int>(opt_integer(L, arg, 0));
  if (index < 0 || index >= core::cuda_device_count()) {
    luaL_error(L, "CUDA device %d does not exist (%d present)", index, core::cuda_device_count());
  }
  return index;
}

int cuda_memory_allocated(lua_State* L) {
  lua_pushnumber(L, core::cuda_memory(cuda_device_index(L, 1)).allocated);
  return 1;
}

int cuda_max_memory_allocated(lua_State* L) {
  lua_pushnumber(L, core::cuda_memory(cuda_device_index(L, 1)).peak_allocated);
  return 1;
}

int cuda_reset_peak_memory_stats(lua_State* L) {
  core::reset_cuda_peak_memory(cuda_device_index(L, 1));
  return 0;
}

int cuda_synchronize(lua_State* L) {
  if (core::cuda_available())
    at::detail::getCUDAHooks().deviceSynchronize(static_cast<c10::DeviceIndex>(opt_integer(L, 1, 0)));
  return 0;
}

}  // namespace

void add_process_state_functions(lua_State* L) {
  set_functions(L, {
                       {"manual_seed", wrap<torch_manual_seed>},
                       {"initial_seed", wrap<torch_initial_seed>},
                       {"is_tensor", wrap<torch_is_tensor>},
                       {"device", wrap<torch_device>},
                       {"set_num_threads", wrap<torch_set_num_threads>},
                       {"get_num_threads", wrap<torch_get_num_threads>},
                       {"held_bytes", wrap<torch_held_bytes>},
                   });
  lua_newtable(L);
  set_functions(L, {
                       {"is_available", wrap<cuda_is_available>},
                       {"device_count", wrap<cuda_device_count>},
                       {"synchronize", wrap<cuda_synchronize>},
                       {"tf32", wrap<cuda_tf32>},
                       {"memory_allocated", wrap<cuda_memory_allocated>},
                       {"max_memory_allocated", wrap<cuda_max_memory_allocated>},
                       {"reset_peak_memory_stats", wrap<cuda_reset_peak_memory_stats>},
                   });
  lua_setfield(L, -2, "cuda");
}

}  // namespace runner::bindings
