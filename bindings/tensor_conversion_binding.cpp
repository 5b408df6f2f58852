// Tensor values and conversions: item, tolist, to, the dtype casts, cpu and cuda.
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

void push_scalar_value(lua_State* L, const at::Tensor& element) {
  if (element.scalar_type() == at::kBool)
    lua_pushboolean(L, element.item<bool>());
  else
    lua_pushnumber(L, element.item<double>());
}

int tensor_item(lua_State* L) {
  const at::Tensor& self = check_tensor(L, 1);
  if (self.numel() != 1)
    throw std::invalid_argument(fmt::format("item() needs a tensor with one element, this one has {}", self.numel()));
  push_scalar_value(L, self);
  return 1;
}

void push_nested(lua_State* L, const at::Tensor& cpu, std::int64_t dim, std::int64_t offset) {
  if (dim == cpu.dim()) {
    const at::Tensor flat = cpu.reshape(-1);
    if (cpu.scalar_type() == at::kBool)
      lua_pushboolean(L, flat.data_ptr<bool>()[offset]);
    else
      lua_pushnumber(L, flat.data_ptr<double>()[offset]);
    return;
  }
  const std::int64_t size = cpu.size(dim);
  const std::int64_t stride = cpu.stride(dim);
  lua_createtable(L, static_cast<int>(size), 0);
  for (std::int64_t i = 0; i < size; ++i) {
    push_nested(L, cpu, dim + 1, offset + i * stride);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
}

// t:tolist(): nested tables of numbers (booleans for bool tensors); a 0-dim tensor gives a number.
int tensor_tolist(lua_State* L) {
  const at::Tensor& self = check_tensor(L, 1);
  const at::ScalarType type = self.scalar_type() == at::kBool ? at::kBool : at::kDouble;
  const at::Tensor cpu = self.detach().to(at::kCPU, type).contiguous();
  push_nested(L, cpu, 0, 0);
  return 1;
}

// t:to{dtype, device, non_blocking, copy}: unset dtype and device keep the tensor's.
struct ToOptions {
  std::optional<at::ScalarType> dtype;
  std::optional<c10::Device> device;
  bool non_blocking = false;
  bool copy = false;
};
const OptionTable<ToOptions> kToOptions("to", "ToOptions",
                                        {
                                            dtype_option("dtype", &ToOptions::dtype),
                                            device_option("device", &ToOptions::device),
                                            option("non_blocking", &ToOptions::non_blocking),
                                            option("copy", &ToOptions::copy),
                                        });

// t:to("cuda") / t:to("float16") / t:to(other) / t:to{device=, dtype=, non_blocking=, copy=}
int tensor_to(lua_State* L) {
  const at::Tensor& self = check_tensor(L, 1);
  at::ScalarType dtype = self.scalar_type();
  c10::Device device = self.device();
  bool non_blocking = false;
  bool copy = false;
  for (int i = 2; i <= lua_gettop(L); ++i) {
    if (at::Tensor* other = test_tensor(L, i)) {
      dtype = other->scalar_type();
      device = other->device();
    } else if (lua_type(L, i) == LUA_TSTRING) {
      const std::string name = lua_tostring(L, i);
      try {
        dtype = core::parse_dtype(name);
      } catch (const std::invalid_argument&) {
        if (name != "cpu" && name != "auto" && name.rfind("cuda", 0) != 0)
          throw std::invalid_argument(
              fmt::format("to: '{}' is neither a device (cpu, cuda, cuda:N, auto) nor a "
                          "dtype (float32, float64, float16, bfloat16, int64, ...)",
                          name));
        device = core::parse_device(name);
      }
    } else if (lua_istable(L, i)) {
      const ToOptions o = kToOptions.read(L, i);
      if (o.dtype) dtype = *o.dtype;
      if (o.device) device = *o.device;
      non_blocking = o.non_blocking;
      copy = o.copy;
    } else {
      luaL_argerror(L, i, "device, dtype, Tensor or options table expected");
    }
  }
  push_tensor(L, self.to(device, dtype, non_blocking, copy));
  return 1;
}

template <at::ScalarType Type>
int tensor_cast(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).to(Type));
  return 1;
}

int tensor_cpu(lua_State* L) {
  push_tensor(L, check_tensor(L, 1).cpu());
  return 1;
}

int tensor_cuda(lua_State* L) {
  const std::string name = lua_isnoneornil(L, 2) ? "cuda" : check_string(L, 2);
  push_tensor(L, check_tensor(L, 1).to(core::parse_device(name)));
  return 1;
}

}  // namespace

void add_tensor_conversions(lua_State* L) {
  set_functions(L, {
                       {"item", wrap<tensor_item>},
                       {"tolist", wrap<tensor_tolist>},
                       {"to", wrap<tensor_to>},
                       {"float", wrap<tensor_cast<at::kFloat>>},
                       {"double", wrap<tensor_cast<at::kDouble>>},
                       {"half", wrap<tensor_cast<at::kHalf>>},
                       {"bfloat16", wrap<tensor_cast<at::kBFloat16>>},
                       {"long", wrap<tensor_cast<at::kLong>>},
                       {"int", wrap<tensor_cast<at::kInt>>},
                       {"byte", wrap<tensor_cast<at::kByte>>},
                       {"bool", wrap<tensor_cast<at::kBool>>},
                       {"cpu", wrap<tensor_cpu>},
                       {"cuda", wrap<tensor_cuda>},
                   });
}

}  // namespace runner::bindings
