// Tensor indexing from Lua: t[i], t[{1, {2, 4}}], masks and index tensors, assignment, and the properties (t.shape,
// ...).
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
    if (!ok)
      throw std::invalid_argument(fmt::format("slice for dim {} must hold integers {{first, last [, step]}}", dim + 1));
    return static_cast<std::int64_t>(value);
  };
  const std::int64_t first = bound(1);
  const std::int64_t last = count >= 2 ? bound(2) : first;
  const std::int64_t step = count >= 3 ? bound(3) : 1;
  if (step <= 0) throw std::invalid_argument(fmt::format("slice step for dim {} must be positive", dim + 1));
  auto position = [&](std::int64_t i) {
    if (i == 0)
      throw std::out_of_range(fmt::format("slice bound 0 is invalid for dim {}: indices are 1-based", dim + 1));
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

// Properties read through __index: t.shape, t.dtype, t.device, t.grad, t.requires_grad, t.is_leaf, t.ndim.
bool push_property(lua_State* L, const at::Tensor& self, const std::string& key) {
  if (key == "shape") {
    push_sizes(L, self.sizes());
  } else if (key == "dtype") {
    lua_pushstring(L, core::dtype_name(self.scalar_type()).c_str());
  } else if (key == "device") {
    lua_pushstring(L, core::device_name(self.device()).c_str());
  } else if (key == "grad") {
    if (self.grad().defined())
      push_tensor(L, self.grad());
    else
      lua_pushnil(L);
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

}  // namespace

int tensor_index(lua_State* L) {
  const at::Tensor& self = lua_type(L, 2) == LUA_TSTRING ? check_tensor_handle(L, 1) : check_tensor(L, 1);
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
  at::Tensor& self = lua_type(L, 2) == LUA_TSTRING ? check_tensor_handle(L, 1) : check_tensor(L, 1);
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
  if (at::Tensor* value = test_tensor(L, 3))
    self.index_put_(indices, *value);
  else
    self.index_put_(indices, check_scalar(L, 3));
  return 0;
}

}  // namespace runner::bindings
