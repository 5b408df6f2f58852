// The Tensor userdata with its memory accounting, the argument conversions every tensor binding shares, and
// open_tensor, which registers the parts (bindings/tensor_parts.h).
#include "bindings/tensor_binding.h"

#include <ATen/ATen.h>
#include <ATen/TensorIndexing.h>
#include <ATen/Parallel.h>
#include <ATen/ScalarOps.h>
#include <ATen/core/grad_mode.h>
#include <cmath>
#include <fmt/format.h>
#include <torch/utils.h>

#include "bindings/option_table.h"
#include "bindings/tensor_parts.h"
#include "runtime/core/device.h"
#include "runtime/core/dtype.h"
#include "runtime/core/tensor_format.h"

namespace runner::bindings {
namespace {

// What a tensor userdata holds: the tensor and the bytes it added to the GC pressure count.
struct TensorBox {
  at::Tensor tensor;
  std::int64_t accounted_bytes;
};

// The Lua GC only sees the few bytes of each userdata, not the tensor memory behind it. Tensor bytes
// are counted here and a full collection runs once the bytes allocated since the last one exceed the
// bytes that collection left held (at least 64 MiB): memory stays within about twice the live set in
// loops that allocate tensors, and the cost of collections stays proportional to allocation.
constexpr std::int64_t kPerTensorOverhead = 512;
constexpr std::int64_t kMinimumCollectBytes = 64ll << 20;
std::int64_t held_bytes = 0;
std::int64_t held_after_collect = 0;
std::int64_t allocated_since_collect = 0;

std::int64_t tensor_bytes(const at::Tensor& tensor) {
  if (!tensor.defined() || !tensor.has_storage()) return kPerTensorOverhead;
  return static_cast<std::int64_t>(tensor.storage().nbytes()) + kPerTensorOverhead;
}

int tensor_gc(lua_State* L) {
  auto* box = static_cast<TensorBox*>(lua_touserdata(L, 1));
  held_bytes -= box->accounted_bytes;
  box->~TensorBox();
  return 0;
}

}  // namespace

std::int64_t lua_held_tensor_bytes() { return held_bytes; }

void collect_tensors(lua_State* L) {
  lua_gc(L, LUA_GCCOLLECT, 0);
  allocated_since_collect = 0;
  held_after_collect = held_bytes;
}

void push_tensor(lua_State* L, at::Tensor tensor) {
  const std::int64_t bytes = tensor_bytes(tensor);
  held_bytes += bytes;
  allocated_since_collect += bytes;
  if (allocated_since_collect > std::max(kMinimumCollectBytes, held_after_collect)) collect_tensors(L);
  new_userdata<TensorBox>(L, kTensorType, TensorBox{std::move(tensor), bytes});
}

at::Tensor* test_tensor(lua_State* L, int index) {
  auto* box = test_userdata<TensorBox>(L, index, kTensorType);
  return box ? &box->tensor : nullptr;
}

at::Tensor& check_tensor_handle(lua_State* L, int index) {
  return check_userdata<TensorBox>(L, index, kTensorType, "Tensor")->tensor;
}

at::Tensor& check_tensor(lua_State* L, int index) {
  at::Tensor& tensor = check_tensor_handle(L, index);
  // A parameter released by sharding over the weights keeps its shape with no storage behind it.
  if (tensor.defined() && tensor.numel() > 0 && tensor.has_storage() && !tensor.is_meta() &&
      tensor.storage().nbytes() == 0)
    raise_error(L,
                "this tensor is a model parameter that runner.trainer with shard = \"weights\" holds only a "
                "share of on this rank between steps (its shape, device and gradient can be read, not its values; "
                "train:model_state() gathers the model's weights, called on every rank)");
  return tensor;
}

at::Scalar check_scalar(lua_State* L, int index) {
  if (lua_type(L, index) == LUA_TBOOLEAN) return at::Scalar(lua_toboolean(L, index) != 0);
  const double value = luaL_checknumber(L, index);
  if (std::floor(value) == value && std::fabs(value) < 9007199254740992.0)
    return at::Scalar(static_cast<std::int64_t>(value));
  return at::Scalar(value);
}

at::Tensor check_operand(lua_State* L, int index, const c10::Device& device) {
  if (at::Tensor* tensor = test_tensor(L, index)) return *tensor;
  if (lua_type(L, index) != LUA_TNUMBER && lua_type(L, index) != LUA_TBOOLEAN)
    luaL_argerror(L, index, fmt::format("Tensor or number expected, got {}", luaL_typename(L, index)).c_str());
  at::Tensor wrapped = c10::scalar_to_tensor(check_scalar(L, index), device);
  wrapped.unsafeGetTensorImpl()->set_wrapped_number(true);
  return wrapped;
}

std::vector<std::int64_t> check_sizes(lua_State* L, int first, int* next) {
  std::vector<std::int64_t> sizes;
  if (lua_istable(L, first) && !test_tensor(L, first)) {
    lua_getfield(L, first, "dtype");
    lua_getfield(L, first, "device");
    const bool is_options = !lua_isnil(L, -1) || !lua_isnil(L, -2);
    lua_pop(L, 2);
    if (!is_options) {
      const int count = static_cast<int>(lua_objlen(L, first));
      for (int i = 1; i <= count; ++i) {
        lua_rawgeti(L, first, i);
        const double value = lua_tonumber(L, -1);
        if (lua_type(L, -1) != LUA_TNUMBER || std::floor(value) != value)
          luaL_argerror(L, first,
                        fmt::format("sizes must be integers (element {} is {})", i, luaL_typename(L, -1)).c_str());
        sizes.push_back(static_cast<std::int64_t>(value));
        lua_pop(L, 1);
      }
      *next = first + 1;
      return sizes;
    }
  }
  int index = first;
  while (lua_type(L, index) == LUA_TNUMBER) sizes.push_back(check_integer(L, index++));
  *next = index;
  return sizes;
}

std::int64_t check_dim(lua_State* L, int index, std::int64_t ndim) {
  const std::int64_t dim = check_integer(L, index);
  const std::int64_t rank = std::max<std::int64_t>(ndim, 1);
  if (dim == 0 || dim > rank || dim < -rank)
    luaL_argerror(L, index,
                  fmt::format("dim {} out of range for a tensor with {} dims (dims are 1-based; "
                              "negative dims count from the end)",
                              dim, ndim)
                      .c_str());
  return dim > 0 ? dim - 1 : rank + dim;
}

std::int64_t opt_dim(lua_State* L, int index, std::int64_t ndim, std::int64_t fallback) {
  return lua_isnoneornil(L, index) ? fallback : check_dim(L, index, ndim);
}

std::optional<std::vector<std::int64_t>> opt_dims(lua_State* L, int index, std::int64_t ndim) {
  if (lua_isnoneornil(L, index)) return std::nullopt;
  std::vector<std::int64_t> dims;
  if (!lua_istable(L, index)) {
    dims.push_back(check_dim(L, index, ndim));
    return dims;
  }
  const int count = static_cast<int>(lua_objlen(L, index));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, index, i);
    dims.push_back(check_dim(L, lua_gettop(L), ndim));
    lua_pop(L, 1);
  }
  return dims;
}

namespace {

const OptionTable<TensorFactoryOptions> kTensorOptions("constructor", "TensorOptions",
                                                       {
                                                           dtype_option("dtype", &TensorFactoryOptions::dtype),
                                                           device_option("device", &TensorFactoryOptions::device),
                                                           option("requires_grad",
                                                                  &TensorFactoryOptions::requires_grad),
                                                       });

}  // namespace

at::TensorOptions TensorFactoryOptions::tensor_options() const {
  at::TensorOptions options = at::TensorOptions().dtype(dtype.value_or(at::kFloat));
  if (device) options = options.device(*device);
  return options;
}

TensorFactoryOptions check_tensor_options(lua_State* L, int index, const char* function) {
  if (!lua_isnoneornil(L, index))
    luaL_checktype(L, index, LUA_TTABLE);  // "bad argument #2 to 'zeros' (table expected, ...)"
  return kTensorOptions.read_as(function, L, index);
}

std::vector<at::Tensor> check_tensor_list(lua_State* L, int index) {
  luaL_checktype(L, index, LUA_TTABLE);
  std::vector<at::Tensor> tensors;
  const int count = static_cast<int>(lua_objlen(L, index));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, index, i);
    at::Tensor* tensor = test_tensor(L, -1);
    if (!tensor)
      luaL_argerror(L, index,
                    fmt::format("list of Tensors expected, element {} is {}", i, luaL_typename(L, -1)).c_str());
    tensors.push_back(*tensor);
    lua_pop(L, 1);
  }
  return tensors;
}

void push_tensor_list(lua_State* L, const std::vector<at::Tensor>& tensors) {
  lua_createtable(L, static_cast<int>(tensors.size()), 0);
  for (size_t i = 0; i < tensors.size(); ++i) {
    push_tensor(L, tensors[i]);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
}

namespace {

constexpr const char* kSizesType = "runner.Sizes";

int sizes_tostring(lua_State* L) {
  std::string text = "[";
  const int count = static_cast<int>(lua_objlen(L, 1));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, 1, i);
    text += fmt::format("{}{}", i > 1 ? ", " : "", lua_tostring(L, -1) ? lua_tostring(L, -1) : "?");
    lua_pop(L, 1);
  }
  lua_pushstring(L, (text + "]").c_str());
  return 1;
}

}  // namespace

void push_sizes(lua_State* L, at::IntArrayRef sizes) {
  lua_createtable(L, static_cast<int>(sizes.size()), 0);
  for (std::size_t d = 0; d < sizes.size(); ++d) {
    lua_pushnumber(L, static_cast<lua_Number>(sizes[d]));
    lua_rawseti(L, -2, static_cast<int>(d + 1));
  }
  luaL_getmetatable(L, kSizesType);
  lua_setmetatable(L, -2);
}

void open_tensor(lua_State* L) {
  luaL_newmetatable(L, kSizesType);
  lua_pushcfunction(L, &sizes_tostring);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  // Tensor metatable: __index dispatches to methods (an upvalue table), properties and indexing.
  luaL_newmetatable(L, kTensorType);
  lua_pushcfunction(L, &tensor_gc);
  lua_setfield(L, -2, "__gc");
  lua_pushstring(L, "Tensor");
  lua_setfield(L, -2, "__name");
  lua_newtable(L);  // methods
  add_tensor_conversions(L);
  add_autograd_methods(L);
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "methods");
  lua_pushcclosure(L, wrap<tensor_index>, 1);
  lua_setfield(L, -2, "__index");
  set_functions(L, {{"__newindex", wrap<tensor_newindex>}});
  add_tensor_metamethods(L);
  lua_pop(L, 1);

  lua_newtable(L);  // torch
  add_tensor_constructors(L);
  add_autograd_functions(L);
  add_process_state_functions(L);
  for (const char* name :
       {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}) {
    lua_pushstring(L, name);
    lua_setfield(L, -2, name);
  }
  lua_setglobal(L, "torch");
}

}  // namespace runner::bindings
