// The tensor constructors: torch.zeros, ones, empty, rand(n), full, randint, arange, linspace, eye, tensor and the
// *_like ones.
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
      throw std::invalid_argument(
          fmt::format("tensor: element {} is a {}, expected a number or boolean", path, lua_typename(L, type)));
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
  if (lua_istable(L, 1))
    infer_shape(L, 1, data);
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

}  // namespace

void add_tensor_constructors(lua_State* L) {
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
                   });
}

}  // namespace runner::bindings
