// Tensor userdata, constructors, indexing, conversions, autograd and seeding for Lua.
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

namespace {

void collect_tensors(lua_State* L) {
  lua_gc(L, LUA_GCCOLLECT, 0);
  allocated_since_collect = 0;
  held_after_collect = held_bytes;
}

}  // namespace

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

at::Tensor& check_tensor(lua_State* L, int index) {
  return check_userdata<TensorBox>(L, index, kTensorType, "Tensor")->tensor;
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
          luaL_argerror(L, first, fmt::format("sizes must be integers (element {} is {})", i,
                                              luaL_typename(L, -1)).c_str());
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
    luaL_argerror(L, index, fmt::format("dim {} out of range for a tensor with {} dims (dims are 1-based; "
                                        "negative dims count from the end)", dim, ndim).c_str());
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

// A dtype name ("float32", "int64", ...) and a device name ("cpu", "cuda:1", "auto") as options.
template <class Struct>
OptionField<Struct> dtype_option(const char* key, std::optional<at::ScalarType> Struct::*member) {
  return option_with<Struct>(key, [member](lua_State* L, const char* k, Struct& s) {
    std::string name;
    read_option_value(L, k, name);
    s.*member = core::parse_dtype(name);
  });
}

template <class Struct>
OptionField<Struct> device_option(const char* key, std::optional<c10::Device> Struct::*member) {
  return option_with<Struct>(key, [member](lua_State* L, const char* k, Struct& s) {
    std::string name;
    read_option_value(L, k, name);
    s.*member = core::parse_device(name);
  });
}

const OptionTable<TensorFactoryOptions> kTensorOptions(
    "constructor", "TensorOptions",
    {
        dtype_option("dtype", &TensorFactoryOptions::dtype),
        device_option("device", &TensorFactoryOptions::device),
        option("requires_grad", &TensorFactoryOptions::requires_grad),
    });

}  // namespace

at::TensorOptions TensorFactoryOptions::tensor_options() const {
  at::TensorOptions options = at::TensorOptions().dtype(dtype.value_or(at::kFloat));
  if (device) options = options.device(*device);
  return options;
}

TensorFactoryOptions check_tensor_options(lua_State* L, int index, const char* function) {
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
      luaL_argerror(L, index, fmt::format("list of Tensors expected, element {} is {}", i, luaL_typename(L, -1)).c_str());
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

// Constructors ----------------------------------------------------------------------------------

// Pushes a new tensor, marked as requiring grad when its options ask for it.
void push_created(lua_State* L, at::Tensor tensor, const TensorFactoryOptions& options) {
  if (options.requires_grad) tensor.set_requires_grad(true);
  push_tensor(L, std::move(tensor));
}

// torch.zeros(2, 3 [, options]) / torch.zeros({2, 3} [, options])
template <at::Tensor (*Make)(at::IntArrayRef, at::TensorOptions)>
int sized_constructor(lua_State* L) {
  int next = 1;
  const auto sizes = check_sizes(L, 1, &next);
  const TensorFactoryOptions options = check_tensor_options(L, next, "constructor");
  push_created(L, Make(sizes, options.tensor_options()), options);
  return 1;
}

at::Tensor make_zeros(at::IntArrayRef s, at::TensorOptions o) { return at::zeros(s, o); }
at::Tensor make_ones(at::IntArrayRef s, at::TensorOptions o) { return at::ones(s, o); }
at::Tensor make_empty(at::IntArrayRef s, at::TensorOptions o) { return at::empty(s, o); }
at::Tensor make_rand(at::IntArrayRef s, at::TensorOptions o) { return at::rand(s, o); }
at::Tensor make_randn(at::IntArrayRef s, at::TensorOptions o) { return at::randn(s, o); }

// torch.full(sizes, value [, options])
int torch_full(lua_State* L) {
  int next = 1;
  const auto sizes = check_sizes(L, 1, &next);
  const at::Scalar value = check_scalar(L, next);
  const TensorFactoryOptions options = check_tensor_options(L, next + 1, "full");
  push_created(L, at::full(sizes, value, options.tensor_options()), options);
  return 1;
}

// torch.randint(low, high, sizes [, options]): integers in [low, high), int64 unless dtype says otherwise.
int torch_randint(lua_State* L) {
  const std::int64_t low = check_integer(L, 1);
  const std::int64_t high = check_integer(L, 2);
  int next = 3;
  const auto sizes = check_sizes(L, 3, &next);
  TensorFactoryOptions options = check_tensor_options(L, next, "randint");
  if (!options.dtype) options.dtype = at::kLong;
  push_created(L, at::randint(low, high, sizes, options.tensor_options()), options);
  return 1;
}

// torch.arange([start,] end [, step] [, options]): half-open [start, end) as in PyTorch.
int torch_arange(lua_State* L) {
  int count = 0;
  while (count < 3 && lua_type(L, count + 1) == LUA_TNUMBER) ++count;
  if (count == 0) luaL_argerror(L, 1, "number expected");
  TensorFactoryOptions options = check_tensor_options(L, count + 1, "arange");
  bool integral = true;
  for (int i = 1; i <= count; ++i) integral = integral && check_scalar(L, i).isIntegral(false);
  if (!options.dtype && integral) options.dtype = at::kLong;
  const at::Scalar start = count >= 2 ? check_scalar(L, 1) : at::Scalar(0);
  const at::Scalar end = count >= 2 ? check_scalar(L, 2) : check_scalar(L, 1);
  const at::Scalar step = count == 3 ? check_scalar(L, 3) : at::Scalar(1);
  push_created(L, at::arange(start, end, step, options.tensor_options()), options);
  return 1;
}

// torch.linspace(start, end, steps [, options])
int torch_linspace(lua_State* L) {
  const TensorFactoryOptions options = check_tensor_options(L, 4, "linspace");
  push_created(L, at::linspace(check_scalar(L, 1), check_scalar(L, 2), check_integer(L, 3), options.tensor_options()),
               options);
  return 1;
}

int torch_eye(lua_State* L) {
  const std::int64_t rows = check_integer(L, 1);
  if (lua_type(L, 2) == LUA_TNUMBER) {
    const TensorFactoryOptions options = check_tensor_options(L, 3, "eye");
    push_created(L, at::eye(rows, check_integer(L, 2), options.tensor_options()), options);
  } else {
    const TensorFactoryOptions options = check_tensor_options(L, 2, "eye");
    push_created(L, at::eye(rows, options.tensor_options()), options);
  }
  return 1;
}

// torch.zeros_like(t [, options]) and friends.
template <at::Tensor (*Make)(const at::Tensor&, at::TensorOptions)>
int like_constructor(lua_State* L) {
  const at::Tensor& like = check_tensor(L, 1);
  const TensorFactoryOptions given = check_tensor_options(L, 2, "like");
  at::TensorOptions options = like.options();
  if (given.dtype) options = options.dtype(*given.dtype);
  if (given.device) options = options.device(*given.device);
  push_created(L, Make(like, options), given);
  return 1;
}

at::Tensor make_zeros_like(const at::Tensor& t, at::TensorOptions o) { return at::zeros_like(t, o); }
at::Tensor make_ones_like(const at::Tensor& t, at::TensorOptions o) { return at::ones_like(t, o); }
at::Tensor make_empty_like(const at::Tensor& t, at::TensorOptions o) { return at::empty_like(t, o); }
at::Tensor make_rand_like(const at::Tensor& t, at::TensorOptions o) { return at::rand_like(t, o); }
at::Tensor make_randn_like(const at::Tensor& t, at::TensorOptions o) { return at::randn_like(t, o); }

int torch_full_like(lua_State* L) {
  const at::Tensor& like = check_tensor(L, 1);
  push_tensor(L, at::full_like(like, check_scalar(L, 2)));
  return 1;
}

// Nested Lua tables -> tensor. Shape comes from the first element at each depth; ragged input is an error.
struct NestedData {
  std::vector<std::int64_t> shape;
  std::vector<double> values;
  bool all_boolean = true;
};

void infer_shape(lua_State* L, int index, NestedData& data) {
  lua_pushvalue(L, index);
  while (lua_istable(L, -1)) {
    const auto length = static_cast<std::int64_t>(lua_objlen(L, -1));
    data.shape.push_back(length);
    if (length == 0) break;
    lua_rawgeti(L, -1, 1);
    lua_remove(L, -2);
  }
  lua_pop(L, 1);
}

void flatten_nested(lua_State* L, int index, size_t depth, NestedData& data, std::string& path) {
  if (depth == data.shape.size()) {
    const int type = lua_type(L, index);
    if (type == LUA_TBOOLEAN) {
      data.values.push_back(lua_toboolean(L, index) ? 1.0 : 0.0);
    } else if (type == LUA_TNUMBER) {
      data.all_boolean = false;
      data.values.push_back(lua_tonumber(L, index));
    } else {
      throw std::invalid_argument(fmt::format("tensor: element {} is a {}, expected a number or boolean", path,
                                              lua_typename(L, type)));
    }
    return;
  }
  if (!lua_istable(L, index) || static_cast<std::int64_t>(lua_objlen(L, index)) != data.shape[depth])
    throw std::invalid_argument(fmt::format("tensor: ragged nested table at {}: expected a table of {} elements",
                                            path.empty() ? "top level" : path, data.shape[depth]));
  for (std::int64_t i = 1; i <= data.shape[depth]; ++i) {
    lua_rawgeti(L, index, static_cast<int>(i));
    const size_t saved = path.size();
    path += fmt::format("[{}]", i);
    flatten_nested(L, lua_gettop(L), depth + 1, data, path);
    path.resize(saved);
    lua_pop(L, 1);
  }
}

// torch.tensor(data [, options]): numbers become float32 unless dtype is given; booleans become bool.
int torch_tensor(lua_State* L) {
  if (at::Tensor* tensor = test_tensor(L, 1)) {
    push_tensor(L, tensor->clone());
    return 1;
  }
  NestedData data;
  if (lua_istable(L, 1)) infer_shape(L, 1, data);
  else if (lua_type(L, 1) != LUA_TNUMBER && lua_type(L, 1) != LUA_TBOOLEAN)
    luaL_argerror(L, 1, fmt::format("table, number or boolean expected, got {}", luaL_typename(L, 1)).c_str());
  std::string path;
  flatten_nested(L, 1, 0, data, path);
  TensorFactoryOptions options = check_tensor_options(L, 2, "tensor");
  if (!options.dtype && data.all_boolean && !data.values.empty()) options.dtype = at::kBool;
  const at::Tensor values = at::tensor(data.values, at::kDouble).reshape(data.shape);
  push_created(L, values.to(options.tensor_options()), options);
  return 1;
}

// Indexing --------------------------------------------------------------------------------------

using at::indexing::Slice;
using at::indexing::TensorIndex;

std::int64_t normalize_index(std::int64_t index, std::int64_t size, std::int64_t dim) {
  if (index == 0) throw std::out_of_range(fmt::format("index 0 is invalid for dim {}: indices are 1-based", dim + 1));
  const std::int64_t zero_based = index > 0 ? index - 1 : size + index;
  if (zero_based < 0 || zero_based >= size)
    throw std::out_of_range(fmt::format("index {} is out of range for dim {} of size {}", index, dim + 1, size));
  return zero_based;
}

// {first, last [, step]}, inclusive, 1-based; {} is the whole dim; {i} is just i (keeping the dim).
TensorIndex slice_index(lua_State* L, int table, std::int64_t size, std::int64_t dim) {
  const int count = static_cast<int>(lua_objlen(L, table));
  if (count == 0) return TensorIndex(Slice());
  auto bound = [&](int i) {
    lua_rawgeti(L, table, i);
    const double value = lua_tonumber(L, -1);
    const bool ok = lua_type(L, -1) == LUA_TNUMBER && std::floor(value) == value;
    lua_pop(L, 1);
    if (!ok) throw std::invalid_argument(fmt::format("slice for dim {} must hold integers {{first, last [, step]}}", dim + 1));
    return static_cast<std::int64_t>(value);
  };
  const std::int64_t first = bound(1);
  const std::int64_t last = count >= 2 ? bound(2) : first;
  const std::int64_t step = count >= 3 ? bound(3) : 1;
  if (step <= 0) throw std::invalid_argument(fmt::format("slice step for dim {} must be positive", dim + 1));
  auto position = [&](std::int64_t i) {
    if (i == 0) throw std::out_of_range(fmt::format("slice bound 0 is invalid for dim {}: indices are 1-based", dim + 1));
    return i > 0 ? i - 1 : size + i;
  };
  const std::int64_t start = std::clamp<std::int64_t>(position(first), 0, size);
  const std::int64_t stop = std::clamp<std::int64_t>(position(last) + 1, 0, size);
  return TensorIndex(Slice(start, std::max(start, stop), step));
}

// How many dims of the source tensor an index element consumes.
std::int64_t consumed_dims(lua_State* L, int index) {
  if (at::Tensor* tensor = test_tensor(L, index)) return tensor->scalar_type() == at::kBool ? tensor->dim() : 1;
  if (lua_type(L, index) == LUA_TSTRING && std::string(lua_tostring(L, index)) == "...") return 0;
  return 1;
}

std::vector<TensorIndex> build_indices(lua_State* L, const at::Tensor& self, int key) {
  std::vector<TensorIndex> indices;
  if (lua_type(L, key) == LUA_TNUMBER) {
    indices.emplace_back(normalize_index(check_integer(L, key), self.dim() > 0 ? self.size(0) : 0, 0));
    return indices;
  }
  if (at::Tensor* tensor = test_tensor(L, key)) {
    indices.emplace_back(*tensor);
    return indices;
  }
  if (!lua_istable(L, key))
    throw std::invalid_argument(fmt::format("cannot index a Tensor with a {}", luaL_typename(L, key)));
  const int count = static_cast<int>(lua_objlen(L, key));
  std::int64_t total_consumed = 0;
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, key, i);
    total_consumed += consumed_dims(L, -1);
    lua_pop(L, 1);
  }
  std::int64_t dim = 0;
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, key, i);
    const int element = lua_gettop(L);
    const std::int64_t size = dim < self.dim() ? self.size(dim) : 0;
    if (dim >= self.dim() && consumed_dims(L, element) > 0)
      throw std::out_of_range(fmt::format("too many indices for a tensor with {} dims", self.dim()));
    if (lua_type(L, element) == LUA_TNUMBER) {
      indices.emplace_back(normalize_index(check_integer(L, element), size, dim));
      dim += 1;
    } else if (lua_type(L, element) == LUA_TSTRING) {
      const std::string text = lua_tostring(L, element);
      if (text == ":") {
        indices.emplace_back(Slice());
        dim += 1;
      } else if (text == "...") {
        indices.emplace_back(at::indexing::Ellipsis);
        dim = self.dim() - (total_consumed - dim);
      } else {
        throw std::invalid_argument(fmt::format("unknown index string '{}' (use \":\" or \"...\")", text));
      }
    } else if (at::Tensor* tensor = test_tensor(L, element)) {
      indices.emplace_back(*tensor);
      dim += consumed_dims(L, element);
    } else if (lua_istable(L, element)) {
      indices.push_back(slice_index(L, element, size, dim));
      dim += 1;
    } else {
      throw std::invalid_argument(fmt::format("index element {} is a {}", i, luaL_typename(L, element)));
    }
    lua_pop(L, 1);
  }
  return indices;
}

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

// Properties read through __index: t.shape, t.dtype, t.device, t.grad, t.requires_grad, t.is_leaf, t.ndim.
bool push_property(lua_State* L, const at::Tensor& self, const std::string& key) {
  if (key == "shape") {
    push_sizes(L, self.sizes());
  } else if (key == "dtype") {
    lua_pushstring(L, core::dtype_name(self.scalar_type()).c_str());
  } else if (key == "device") {
    lua_pushstring(L, core::device_name(self.device()).c_str());
  } else if (key == "grad") {
    if (self.grad().defined()) push_tensor(L, self.grad());
    else lua_pushnil(L);
  } else if (key == "requires_grad") {
    lua_pushboolean(L, self.requires_grad());
  } else if (key == "is_leaf") {
    lua_pushboolean(L, self.is_leaf());
  } else if (key == "ndim") {
    lua_pushnumber(L, static_cast<lua_Number>(self.dim()));
  } else {
    return false;
  }
  return true;
}

int tensor_index(lua_State* L) {
  const at::Tensor& self = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    lua_pushvalue(L, 2);
    lua_rawget(L, lua_upvalueindex(1));
    if (!lua_isnil(L, -1)) return 1;
    lua_pop(L, 1);
    if (push_property(L, self, lua_tostring(L, 2))) return 1;
    lua_pushnil(L);
    return 1;
  }
  push_tensor(L, self.index(build_indices(L, self, 2)));
  return 1;
}

int tensor_newindex(lua_State* L) {
  at::Tensor& self = check_tensor(L, 1);
  if (lua_type(L, 2) == LUA_TSTRING) {
    const std::string key = lua_tostring(L, 2);
    if (key == "requires_grad") {
      self.set_requires_grad(lua_toboolean(L, 3) != 0);
      return 0;
    }
    if (key == "grad") {
      self.mutable_grad() = lua_isnil(L, 3) ? at::Tensor() : check_tensor(L, 3);
      return 0;
    }
    throw std::invalid_argument(fmt::format("cannot set field '{}' of a Tensor", key));
  }
  const auto indices = build_indices(L, self, 2);
  if (at::Tensor* value = test_tensor(L, 3)) self.index_put_(indices, *value);
  else self.index_put_(indices, check_scalar(L, 3));
  return 0;
}

// Arithmetic metamethods: numbers on either side ---------------------------------------------------

c10::Device operand_device(lua_State* L) {
  if (at::Tensor* tensor = test_tensor(L, 1)) return tensor->device();
  return check_tensor(L, 2).device();
}

template <at::Tensor (*Op)(const at::Tensor&, const at::Tensor&)>
int arithmetic_metamethod(lua_State* L) {
  const c10::Device device = operand_device(L);
  push_tensor(L, Op(check_operand(L, 1, device), check_operand(L, 2, device)));
  return 1;
}

at::Tensor op_add(const at::Tensor& a, const at::Tensor& b) { return at::add(a, b); }
at::Tensor op_sub(const at::Tensor& a, const at::Tensor& b) { return at::sub(a, b); }
at::Tensor op_mul(const at::Tensor& a, const at::Tensor& b) { return at::mul(a, b); }
at::Tensor op_div(const at::Tensor& a, const at::Tensor& b) { return at::div(a, b); }
at::Tensor op_pow(const at::Tensor& a, const at::Tensor& b) { return at::pow(a, b); }
at::Tensor op_mod(const at::Tensor& a, const at::Tensor& b) { return at::remainder(a, b); }

int tensor_unm(lua_State* L) {
  push_tensor(L, at::neg(check_tensor(L, 1)));
  return 1;
}

int tensor_len(lua_State* L) {
  const at::Tensor& self = check_tensor(L, 1);
  if (self.dim() == 0) throw std::invalid_argument("len() of a 0-dim tensor");
  lua_pushnumber(L, static_cast<lua_Number>(self.size(0)));
  return 1;
}

int tensor_compare_error(lua_State* L) {
  throw std::invalid_argument("Tensors cannot be compared with < or <=: use t:lt(u), t:le(u), t:gt(u), t:ge(u) "
                              "for elementwise comparison, or t:equal(u)");
  return 0;
}

int tensor_tostring(lua_State* L) {
  const std::string text = core::format_tensor(check_tensor(L, 1));
  lua_pushlstring(L, text.data(), text.size());
  return 1;
}

// Values and conversions --------------------------------------------------------------------------

void push_scalar_value(lua_State* L, const at::Tensor& element) {
  if (element.scalar_type() == at::kBool) lua_pushboolean(L, element.item<bool>());
  else lua_pushnumber(L, element.item<double>());
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
    if (cpu.scalar_type() == at::kBool) lua_pushboolean(L, flat.data_ptr<bool>()[offset]);
    else lua_pushnumber(L, flat.data_ptr<double>()[offset]);
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
const OptionTable<ToOptions> kToOptions(
    "to", "ToOptions",
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
          throw std::invalid_argument(fmt::format("to: '{}' is neither a device (cpu, cuda, cuda:N, auto) nor a "
                                                  "dtype (float32, float64, float16, bfloat16, int64, ...)", name));
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

// Autograd --------------------------------------------------------------------------------------

struct BackwardOptions {
  std::optional<bool> retain_graph;  // default: create_graph
  bool create_graph = false;
};
const OptionTable<BackwardOptions> kBackwardOptions(
    "backward", "BackwardOptions",
    {option("retain_graph", &BackwardOptions::retain_graph), option("create_graph", &BackwardOptions::create_graph)});

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

// Process-wide state ------------------------------------------------------------------------------

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
  if (core::cuda_available()) at::detail::getCUDAHooks().deviceSynchronize(
      static_cast<c10::DeviceIndex>(opt_integer(L, 1, 0)));
  return 0;
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
      {"backward", wrap<tensor_backward>},
      {"requires_grad_", wrap<tensor_requires_grad_>},
      {"retain_grad", wrap<tensor_retain_grad>},
      {"set_data", wrap<tensor_set_data>},
  });
  lua_pushvalue(L, -1);
  lua_setfield(L, -3, "methods");
  lua_pushcclosure(L, wrap<tensor_index>, 1);
  lua_setfield(L, -2, "__index");
  set_functions(L, {
      {"__newindex", wrap<tensor_newindex>},
      {"__add", wrap<arithmetic_metamethod<op_add>>},
      {"__sub", wrap<arithmetic_metamethod<op_sub>>},
      {"__mul", wrap<arithmetic_metamethod<op_mul>>},
      {"__div", wrap<arithmetic_metamethod<op_div>>},
      {"__pow", wrap<arithmetic_metamethod<op_pow>>},
      {"__mod", wrap<arithmetic_metamethod<op_mod>>},
      {"__unm", wrap<tensor_unm>},
      {"__len", wrap<tensor_len>},
      {"__lt", wrap<tensor_compare_error>},
      {"__le", wrap<tensor_compare_error>},
      {"__tostring", wrap<tensor_tostring>},
  });
  lua_pop(L, 1);

  lua_newtable(L);  // torch
  set_functions(L, {
      {"zeros", wrap<sized_constructor<make_zeros>>},
      {"ones", wrap<sized_constructor<make_ones>>},
      {"empty", wrap<sized_constructor<make_empty>>},
      {"rand", wrap<sized_constructor<make_rand>>},
      {"randn", wrap<sized_constructor<make_randn>>},
      {"full", wrap<torch_full>},
      {"randint", wrap<torch_randint>},
      {"arange", wrap<torch_arange>},
      {"linspace", wrap<torch_linspace>},
      {"eye", wrap<torch_eye>},
      {"tensor", wrap<torch_tensor>},
      {"zeros_like", wrap<like_constructor<make_zeros_like>>},
      {"ones_like", wrap<like_constructor<make_ones_like>>},
      {"empty_like", wrap<like_constructor<make_empty_like>>},
      {"rand_like", wrap<like_constructor<make_rand_like>>},
      {"randn_like", wrap<like_constructor<make_randn_like>>},
      {"full_like", wrap<torch_full_like>},
      {"no_grad", wrap<torch_no_grad>},
      {"enable_grad", wrap<torch_enable_grad>},
      {"is_grad_enabled", wrap<torch_is_grad_enabled>},
      {"manual_seed", wrap<torch_manual_seed>},
      {"initial_seed", wrap<torch_initial_seed>},
      {"is_tensor", wrap<torch_is_tensor>},
      {"device", wrap<torch_device>},
      {"set_num_threads", wrap<torch_set_num_threads>},
      {"get_num_threads", wrap<torch_get_num_threads>},
      {"held_bytes", wrap<torch_held_bytes>},
  });
  for (const char* name : {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"}) {
    lua_pushstring(L, name);
    lua_setfield(L, -2, name);
  }
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
  lua_setglobal(L, "torch");
}

}  // namespace runner::bindings
