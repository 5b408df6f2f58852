// Autograd from Lua: backward, requires_grad_, retain_grad, set_data, and torch.no_grad / enable_grad.
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

struct BackwardOptions {
  std::optional<bool> retain_graph;  // default: create_graph
  bool create_graph = false;
};
const OptionTable<BackwardOptions> kBackwardOptions("backward", "BackwardOptions",
                                                    {option("retain_graph", &BackwardOptions::retain_graph),
                                                     option("create_graph", &BackwardOptions::create_graph)});

// t:backward([gradient] [, {retain_graph = bool, create_graph = bool}])
int tensor_backward(lua_State* L) {
  const at::Tensor& self = check_tensor(L, 1);
  at::Tensor gradient;
  int options = 2;
  if (at::Tensor* given = test_tensor(L, 2)) {
    gradient = *given;
    options = 3;
  }
  const BackwardOptions o = kBackwardOptions.read(L, options);
  const bool create_graph = o.create_graph;
  const std::optional<bool> retain_graph = o.retain_graph;
  self.backward(gradient, retain_graph, create_graph);
  // A backward usually ends a training step. The unreachable tensors of earlier steps keep their autograd
  // graphs (and the memory those reference), which the byte count of push_tensor does not see: collect them
  // now, while the Lua heap is small, instead of letting them pile up to gigabytes between collections.
  if (!retain_graph.value_or(create_graph)) collect_tensors(L);
  return 0;
}

int tensor_requires_grad_(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  self.set_requires_grad(opt_boolean(L, 2, true));
  lua_settop(L, 1);
  return 1;
}

int tensor_retain_grad(lua_State* L) {
  check_tensor(L, 1).retain_grad();
  lua_settop(L, 1);
  return 1;
}

// t:set_data(u): replaces the data behind t (shape, dtype, device may change), keeping t's identity.
int tensor_set_data(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  self.set_data(check_tensor(L, 2));
  lua_settop(L, 1);
  return 1;
}

// Calls the function at index 1 with the remaining arguments, grad mode set to `enabled` meanwhile.
int call_with_grad_mode(lua_State* L, bool enabled) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  at::AutoGradMode guard(enabled);
  lua_call(L, lua_gettop(L) - 1, LUA_MULTRET);
  return lua_gettop(L);
}

int torch_no_grad(lua_State* L) { return call_with_grad_mode(L, false); }
int torch_enable_grad(lua_State* L) { return call_with_grad_mode(L, true); }

int torch_is_grad_enabled(lua_State* L) {
  lua_pushboolean(L, at::GradMode::is_enabled());
  return 1;
}

}  // namespace

void add_autograd_methods(lua_State* L) {
  set_functions(L, {
                       {"backward", wrap<tensor_backward>},
                       {"requires_grad_", wrap<tensor_requires_grad_>},
                       {"retain_grad", wrap<tensor_retain_grad>},
                       {"set_data", wrap<tensor_set_data>},
                   });
}

void add_autograd_functions(lua_State* L) {
  set_functions(L, {
                       {"no_grad", wrap<torch_no_grad>},
                       {"enable_grad", wrap<torch_enable_grad>},
                       {"is_grad_enabled", wrap<torch_is_grad_enabled>},
                   });
}

}  // namespace runner::bindings
