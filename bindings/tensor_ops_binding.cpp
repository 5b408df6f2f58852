// Tensor math, comparisons, reductions and shape operations, as methods (t:exp()) and torch functions
// (torch.exp(t)). Dims are 1-based; see tensor_binding.h.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "bindings/tensor_binding.h"
#include "runtime/core/shape_text.h"

namespace runner::bindings {
namespace {

using Tensor = at::Tensor;

// Elementwise ops with one tensor argument, dispatched through an upvalue holding the op.
using UnaryOp = Tensor (*)(const Tensor&);

int call_unary(lua_State* L) {
  const auto op = reinterpret_cast<UnaryOp>(lua_touserdata(L, lua_upvalueindex(1)));
  push_tensor(L, op(check_tensor(L, 1)));
  return 1;
}

const std::pair<const char*, UnaryOp> kUnaryOps[] = {
    {"abs", [](const Tensor& t) { return t.abs(); }},
    {"neg", [](const Tensor& t) { return t.neg(); }},
    {"exp", [](const Tensor& t) { return t.exp(); }},
    {"log", [](const Tensor& t) { return t.log(); }},
    {"log2", [](const Tensor& t) { return t.log2(); }},
    {"log10", [](const Tensor& t) { return t.log10(); }},
    {"log1p", [](const Tensor& t) { return t.log1p(); }},
    {"expm1", [](const Tensor& t) { return t.expm1(); }},
    {"sqrt", [](const Tensor& t) { return t.sqrt(); }},
    {"rsqrt", [](const Tensor& t) { return t.rsqrt(); }},
    {"square", [](const Tensor& t) { return t.square(); }},
    {"reciprocal", [](const Tensor& t) { return t.reciprocal(); }},
    {"sin", [](const Tensor& t) { return t.sin(); }},
    {"cos", [](const Tensor& t) { return t.cos(); }},
    {"tan", [](const Tensor& t) { return t.tan(); }},
    {"asin", [](const Tensor& t) { return t.asin(); }},
    {"acos", [](const Tensor& t) { return t.acos(); }},
    {"atan", [](const Tensor& t) { return t.atan(); }},
    {"sinh", [](const Tensor& t) { return t.sinh(); }},
    {"cosh", [](const Tensor& t) { return t.cosh(); }},
    {"tanh", [](const Tensor& t) { return t.tanh(); }},
    {"sigmoid", [](const Tensor& t) { return t.sigmoid(); }},
    {"relu", [](const Tensor& t) { return t.relu(); }},
    {"silu", [](const Tensor& t) { return at::silu(t); }},
    {"mish", [](const Tensor& t) { return at::mish(t); }},
    {"softplus", [](const Tensor& t) { return at::softplus(t); }},
    {"erf", [](const Tensor& t) { return t.erf(); }},
    {"floor", [](const Tensor& t) { return t.floor(); }},
    {"ceil", [](const Tensor& t) { return t.ceil(); }},
    {"round", [](const Tensor& t) { return t.round(); }},
    {"trunc", [](const Tensor& t) { return t.trunc(); }},
    {"frac", [](const Tensor& t) { return t.frac(); }},
    {"sign", [](const Tensor& t) { return t.sign(); }},
    {"isnan", [](const Tensor& t) { return t.isnan(); }},
    {"isinf", [](const Tensor& t) { return t.isinf(); }},
    {"isfinite", [](const Tensor& t) { return t.isfinite(); }},
    {"logical_not", [](const Tensor& t) { return t.logical_not(); }},
    {"t", [](const Tensor& t) { return t.t(); }},
    {"contiguous", [](const Tensor& t) { return t.contiguous(); }},
    {"clone", [](const Tensor& t) { return t.clone(); }},
    {"detach", [](const Tensor& t) { return t.detach(); }},
    {"zero_", [](const Tensor& t) { return t.zero_(); }},
    {"relu_", [](const Tensor& t) { return t.relu_(); }},
    {"neg_", [](const Tensor& t) { return t.neg_(); }},
    {"exp_", [](const Tensor& t) { return t.exp_(); }},
    {"sqrt_", [](const Tensor& t) { return t.sqrt_(); }},
    {"detach_", [](const Tensor& t) { return t.detach_(); }},
};

// Ops with a second operand that may be a tensor or a number.
using BinaryOp = Tensor (*)(const Tensor&, const Tensor&);

int call_binary(lua_State* L) {
  const auto op = reinterpret_cast<BinaryOp>(lua_touserdata(L, lua_upvalueindex(1)));
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, op(self, check_operand(L, 2, self.device())));
  return 1;
}

const std::pair<const char*, BinaryOp> kBinaryOps[] = {
    {"mul", [](const Tensor& a, const Tensor& b) { return at::mul(a, b); }},
    {"div", [](const Tensor& a, const Tensor& b) { return at::div(a, b); }},
    {"pow", [](const Tensor& a, const Tensor& b) { return at::pow(a, b); }},
    {"remainder", [](const Tensor& a, const Tensor& b) { return at::remainder(a, b); }},
    {"fmod", [](const Tensor& a, const Tensor& b) { return at::fmod(a, b); }},
    {"maximum", [](const Tensor& a, const Tensor& b) { return at::maximum(a, b); }},
    {"minimum", [](const Tensor& a, const Tensor& b) { return at::minimum(a, b); }},
    {"atan2", [](const Tensor& a, const Tensor& b) { return at::atan2(a, b); }},
    {"eq", [](const Tensor& a, const Tensor& b) { return at::eq(a, b); }},
    {"ne", [](const Tensor& a, const Tensor& b) { return at::ne(a, b); }},
    {"lt", [](const Tensor& a, const Tensor& b) { return at::lt(a, b); }},
    {"le", [](const Tensor& a, const Tensor& b) { return at::le(a, b); }},
    {"gt", [](const Tensor& a, const Tensor& b) { return at::gt(a, b); }},
    {"ge", [](const Tensor& a, const Tensor& b) { return at::ge(a, b); }},
    {"logical_and", [](const Tensor& a, const Tensor& b) { return at::logical_and(a, b); }},
    {"logical_or", [](const Tensor& a, const Tensor& b) { return at::logical_or(a, b); }},
    {"matmul", [](const Tensor& a, const Tensor& b) { return at::matmul(a, b); }},
    {"mm", [](const Tensor& a, const Tensor& b) { return at::mm(a, b); }},
    {"bmm", [](const Tensor& a, const Tensor& b) { return at::bmm(a, b); }},
    {"dot", [](const Tensor& a, const Tensor& b) { return at::dot(a, b); }},
    {"outer", [](const Tensor& a, const Tensor& b) { return at::outer(a, b); }},
    {"expand_as", [](const Tensor& a, const Tensor& b) { return a.expand_as(b); }},
    {"view_as", [](const Tensor& a, const Tensor& b) { return a.view_as(b); }},
    {"type_as", [](const Tensor& a, const Tensor& b) { return a.type_as(b); }},
    {"mul_", [](const Tensor& a, const Tensor& b) { return a.mul_(b); }},
    {"div_", [](const Tensor& a, const Tensor& b) { return a.div_(b); }},
    {"pow_", [](const Tensor& a, const Tensor& b) { return a.pow_(b); }},
    {"copy_", [](const Tensor& a, const Tensor& b) { return a.copy_(b); }},
};

// t:add(other [, alpha]) and t:sub(other [, alpha]), also in place.
template <bool Subtract, bool InPlace>
int add_or_sub(lua_State* L) {
  Tensor& self = check_tensor(L, 1);
  const Tensor other = check_operand(L, 2, self.device());
  const at::Scalar alpha = lua_isnoneornil(L, 3) ? at::Scalar(1) : check_scalar(L, 3);
  if constexpr (InPlace) {
    Subtract ? self.sub_(other, alpha) : self.add_(other, alpha);
    lua_settop(L, 1);
  } else {
    push_tensor(L, Subtract ? at::sub(self, other, alpha) : at::add(self, other, alpha));
  }
  return 1;
}

int tensor_fill_(lua_State* L) {
  Tensor& self = check_tensor(L, 1);
  if (Tensor* value = test_tensor(L, 2))
    self.fill_(*value);
  else
    self.fill_(check_scalar(L, 2));
  lua_settop(L, 1);
  return 1;
}

// t:lerp(end, weight), t:lerp_(end, weight): weight a number or tensor.
template <bool InPlace>
int tensor_lerp(lua_State* L) {
  Tensor& self = check_tensor(L, 1);
  const Tensor& end = check_tensor(L, 2);
  if constexpr (InPlace) {
    if (Tensor* weight = test_tensor(L, 3))
      self.lerp_(end, *weight);
    else
      self.lerp_(end, check_scalar(L, 3));
    lua_settop(L, 1);
  } else {
    push_tensor(L,
                test_tensor(L, 3) ? at::lerp(self, end, *test_tensor(L, 3)) : at::lerp(self, end, check_scalar(L, 3)));
  }
  return 1;
}

std::optional<at::Scalar> opt_scalar(lua_State* L, int index) {
  if (lua_isnoneornil(L, index)) return std::nullopt;
  return check_scalar(L, index);
}

// t:clamp(min, max): either bound may be nil.
template <bool InPlace>
int tensor_clamp(lua_State* L) {
  Tensor& self = check_tensor(L, 1);
  const auto low = opt_scalar(L, 2);
  const auto high = opt_scalar(L, 3);
  if (!low && !high) throw std::invalid_argument("clamp: at least one of min and max must be given");
  if constexpr (InPlace) {
    self.clamp_(low, high);
    lua_settop(L, 1);
  } else {
    push_tensor(L, self.clamp(low, high));
  }
  return 1;
}

int tensor_normal_(lua_State* L) {
  Tensor& self = check_tensor(L, 1);
  self.normal_(luaL_optnumber(L, 2, 0.0), luaL_optnumber(L, 3, 1.0));
  lua_settop(L, 1);
  return 1;
}

int tensor_uniform_(lua_State* L) {
  Tensor& self = check_tensor(L, 1);
  self.uniform_(luaL_optnumber(L, 2, 0.0), luaL_optnumber(L, 3, 1.0));
  lua_settop(L, 1);
  return 1;
}

int tensor_gelu(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, at::gelu(self, lua_isnoneornil(L, 2) ? "none" : check_string(L, 2)));
  return 1;
}

int tensor_leaky_relu(lua_State* L) {
  push_tensor(L, at::leaky_relu(check_tensor(L, 1), luaL_optnumber(L, 2, 0.01)));
  return 1;
}

template <bool Log>
int tensor_softmax(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = opt_dim(L, 2, self.dim(), std::max<std::int64_t>(self.dim() - 1, 0));
  push_tensor(L, Log ? at::log_softmax(self, dim) : at::softmax(self, dim));
  return 1;
}

int tensor_equal(lua_State* L) {
  lua_pushboolean(L, check_tensor(L, 1).equal(check_tensor(L, 2)));
  return 1;
}

// t:allclose(u [, rtol [, atol]]) with PyTorch's defaults 1e-5 and 1e-8.
int tensor_allclose(lua_State* L) {
  lua_pushboolean(
      L, check_tensor(L, 1).allclose(check_tensor(L, 2), luaL_optnumber(L, 3, 1e-5), luaL_optnumber(L, 4, 1e-8)));
  return 1;
}

int torch_where(lua_State* L) {
  const Tensor& condition = check_tensor(L, 1);
  const c10::Device device = condition.device();
  push_tensor(L, at::where(condition, check_operand(L, 2, device), check_operand(L, 3, device)));
  return 1;
}

// Reductions: t:sum(), t:sum(dim), t:sum({d1, d2}, keepdim) ---------------------------------------

using Reduction = Tensor (*)(const Tensor&, at::OptionalIntArrayRef, bool);

int call_reduction(lua_State* L) {
  const auto op = reinterpret_cast<Reduction>(lua_touserdata(L, lua_upvalueindex(1)));
  const Tensor& self = check_tensor(L, 1);
  const auto dims = opt_dims(L, 2, self.dim());
  push_tensor(L, op(self, dims ? at::OptionalIntArrayRef(*dims) : at::OptionalIntArrayRef(), opt_boolean(L, 3, false)));
  return 1;
}

const std::pair<const char*, Reduction> kReductions[] = {
    {"sum", [](const Tensor& t, at::OptionalIntArrayRef d, bool k) { return at::sum(t, d, k); }},
    {"nansum", [](const Tensor& t, at::OptionalIntArrayRef d,
                  bool k) { return at::nansum(t, d.value_or(at::IntArrayRef{}), k); }},
    {"mean", [](const Tensor& t, at::OptionalIntArrayRef d, bool k) { return at::mean(t, d, k); }},
    {"amax",
     [](const Tensor& t, at::OptionalIntArrayRef d, bool k) { return at::amax(t, d.value_or(at::IntArrayRef{}), k); }},
    {"amin",
     [](const Tensor& t, at::OptionalIntArrayRef d, bool k) { return at::amin(t, d.value_or(at::IntArrayRef{}), k); }},
    {"var", [](const Tensor& t, at::OptionalIntArrayRef d, bool k) { return at::var(t, d, /*unbiased=*/true, k); }},
    {"std", [](const Tensor& t, at::OptionalIntArrayRef d, bool k) { return at::std(t, d, /*unbiased=*/true, k); }},
    {"logsumexp",
     [](const Tensor& t, at::OptionalIntArrayRef d, bool k) {
       std::vector<std::int64_t> all(static_cast<size_t>(t.dim()));
       std::iota(all.begin(), all.end(), 0);
       return at::logsumexp(t, d.has_value() ? *d : at::IntArrayRef(all), k);
     }},
    {"count_nonzero", [](const Tensor& t, at::OptionalIntArrayRef d,
                         bool) { return d.has_value() ? at::count_nonzero(t, *d) : at::count_nonzero(t); }},
};

// t:prod([dim [, keepdim]]), t:all(...), t:any(...): one dim at most.
template <int Kind>
int single_dim_reduction(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  if (lua_isnoneornil(L, 2)) {
    push_tensor(L, Kind == 0 ? self.prod() : Kind == 1 ? self.all() : self.any());
    return 1;
  }
  const std::int64_t dim = check_dim(L, 2, self.dim());
  const bool keepdim = opt_boolean(L, 3, false);
  push_tensor(L, Kind == 0 ? self.prod(dim, keepdim) : Kind == 1 ? self.all(dim, keepdim) : self.any(dim, keepdim));
  return 1;
}

// t:max() -> 0-dim tensor; t:max(dim [, keepdim]) -> values, indices (0-based contents);
// t:max(other_tensor) -> elementwise maximum.
template <bool Max>
int tensor_max_min(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  if (Tensor* other = test_tensor(L, 2)) {
    push_tensor(L, Max ? at::maximum(self, *other) : at::minimum(self, *other));
    return 1;
  }
  if (lua_isnoneornil(L, 2)) {
    push_tensor(L, Max ? self.max() : self.min());
    return 1;
  }
  const std::int64_t dim = check_dim(L, 2, self.dim());
  const auto [values, indices] =
      Max ? self.max(dim, opt_boolean(L, 3, false)) : self.min(dim, opt_boolean(L, 3, false));
  push_tensor(L, values);
  push_tensor(L, indices);
  return 2;
}

template <bool Max>
int tensor_argmax_argmin(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  std::optional<std::int64_t> dim;
  if (!lua_isnoneornil(L, 2)) dim = check_dim(L, 2, self.dim());
  const bool keepdim = opt_boolean(L, 3, false);
  push_tensor(L, Max ? self.argmax(dim, keepdim) : self.argmin(dim, keepdim));
  return 1;
}

// t:norm([p [, dim [, keepdim]]])
int tensor_norm(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const at::Scalar p = lua_isnoneornil(L, 2) ? at::Scalar(2.0) : at::Scalar(luaL_checknumber(L, 2));
  const auto dims = opt_dims(L, 3, self.dim());
  push_tensor(L, dims ? at::norm(self, p, *dims, opt_boolean(L, 4, false)) : at::norm(self, p));
  return 1;
}

template <bool Product>
int tensor_cumulative(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = check_dim(L, 2, self.dim());
  push_tensor(L, Product ? self.cumprod(dim) : self.cumsum(dim));
  return 1;
}

// Shapes ----------------------------------------------------------------------------------------

int tensor_size(lua_State* L) {
  const Tensor& self = check_tensor_handle(L, 1);
  if (!lua_isnoneornil(L, 2)) {
    lua_pushnumber(L, static_cast<lua_Number>(self.size(check_dim(L, 2, self.dim()))));
    return 1;
  }
  push_sizes(L, self.sizes());
  return 1;
}

int tensor_dim(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_tensor_handle(L, 1).dim()));
  return 1;
}

int tensor_numel(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_tensor_handle(L, 1).numel()));
  return 1;
}

int tensor_element_size(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_tensor(L, 1).element_size()));
  return 1;
}

int tensor_is_contiguous(lua_State* L) {
  lua_pushboolean(L, check_tensor(L, 1).is_contiguous());
  return 1;
}

// t:view(2, -1) / t:reshape({2, -1}) / t:expand(...) / t:tile(...): sizes, not dims.
template <int Kind>
int tensor_resize_like(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  int next = 2;
  const auto sizes = check_sizes(L, 2, &next);
  switch (Kind) {
    case 0:
      push_tensor(L, self.view(sizes));
      break;
    case 1:
      push_tensor(L, self.reshape(sizes));
      break;
    case 2:
      push_tensor(L, self.expand(sizes));
      break;
    default:
      push_tensor(L, self.tile(sizes));
      break;
  }
  return 1;
}

// Dims from index `first` on: numbers or one table of numbers, each 1-based.
std::vector<std::int64_t> check_dim_list(lua_State* L, int first, std::int64_t ndim) {
  std::vector<std::int64_t> dims;
  if (lua_istable(L, first)) {
    dims = *opt_dims(L, first, ndim);
  } else {
    for (int i = first; !lua_isnoneornil(L, i); ++i) dims.push_back(check_dim(L, i, ndim));
  }
  return dims;
}

int tensor_permute(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, self.permute(check_dim_list(L, 2, self.dim())));
  return 1;
}

int tensor_flip(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, self.flip(check_dim_list(L, 2, self.dim())));
  return 1;
}

int tensor_transpose(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, self.transpose(check_dim(L, 2, self.dim()), check_dim(L, 3, self.dim())));
  return 1;
}

// t:flatten([start [, end]]), 1-based inclusive, defaults 1 and -1.
int tensor_flatten(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t last = std::max<std::int64_t>(self.dim() - 1, 0);
  push_tensor(L, self.flatten(opt_dim(L, 2, self.dim(), 0), opt_dim(L, 3, self.dim(), last)));
  return 1;
}

int tensor_unflatten(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = check_dim(L, 2, self.dim());
  int next = 3;
  push_tensor(L, self.unflatten(dim, check_sizes(L, 3, &next)));
  return 1;
}

// t:unsqueeze(d): d in 1..ndim+1, or negative (-1 appends a dim).
int tensor_unsqueeze(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, self.unsqueeze(check_dim(L, 2, self.dim() + 1)));
  return 1;
}

int tensor_squeeze(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, lua_isnoneornil(L, 2) ? self.squeeze() : self.squeeze(check_dim(L, 2, self.dim())));
  return 1;
}

// t:narrow(dim, start, length): start 1-based.
int tensor_narrow(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = check_dim(L, 2, self.dim());
  const std::int64_t start = check_integer(L, 3);
  const std::int64_t size = self.size(dim);
  if (start == 0 || start > size || start < -size)
    luaL_argerror(L, 3, fmt::format("start {} out of range for dim of size {} (1-based)", start, size).c_str());
  const std::int64_t first = start > 0 ? start - 1 : size + start;
  const std::int64_t length = check_integer(L, 4);
  if (length < 0 || first + length > size)
    luaL_argerror(L, 4,
                  fmt::format("length {} from start {} runs past the end of dim {} (size {}): it would end at "
                              "element {}",
                              length, start, dim + 1, size, first + length)
                      .c_str());
  push_tensor(L, self.narrow(dim, first, length));
  return 1;
}

// t:select(dim, index): index 1-based.
int tensor_select(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = check_dim(L, 2, self.dim());
  const std::int64_t index = check_integer(L, 3);
  const std::int64_t size = self.size(dim);
  if (index == 0 || index > size || index < -size)
    luaL_argerror(L, 3, fmt::format("index {} out of range for dim of size {} (1-based)", index, size).c_str());
  push_tensor(L, self.select(dim, index > 0 ? index - 1 : size + index));
  return 1;
}

// t:chunk(n [, dim]) -> list of tensors
int tensor_chunk(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor_list(L, self.chunk(check_integer(L, 2), opt_dim(L, 3, self.dim(), 0)));
  return 1;
}

// t:split(size [, dim]) or t:split({sizes} [, dim]) -> list of tensors
int tensor_split(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = opt_dim(L, 3, self.dim(), 0);
  if (lua_istable(L, 2)) {
    int next = 2;
    push_tensor_list(L, self.split_with_sizes(check_sizes(L, 2, &next), dim));
  } else {
    push_tensor_list(L, self.split(check_integer(L, 2), dim));
  }
  return 1;
}

// torch.cat(list [, dim]) and torch.stack(list [, dim])
template <bool Stack>
int torch_cat_stack(lua_State* L) {
  const auto tensors = check_tensor_list(L, 1);
  if (tensors.empty()) luaL_argerror(L, 1, "non-empty list of Tensors expected");
  const std::int64_t ndim = tensors.front().dim() + (Stack ? 1 : 0);
  const std::int64_t dim = opt_dim(L, 2, ndim, 0);
  // Checked here so that the message counts tensors and dims from 1; cat skips 1-D empty tensors, as LibTorch does.
  const auto skipped = [](const Tensor& t) { return !Stack && t.dim() == 1 && t.size(0) == 0; };
  const Tensor* reference = nullptr;
  size_t reference_number = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    if (skipped(t)) continue;
    if (!reference) {
      reference = &t;
      reference_number = i + 1;
      continue;
    }
    bool fits = t.dim() == reference->dim();
    for (std::int64_t d = 0; fits && d < t.dim(); ++d) fits = t.size(d) == reference->size(d) || (!Stack && d == dim);
    if (!fits)
      throw std::invalid_argument(
          fmt::format("torch.{}: tensor {} has shape {} and tensor {} has {}: {}", Stack ? "stack" : "cat", i + 1,
                      core::shape_text(t.sizes()), reference_number, core::shape_text(reference->sizes()),
                      Stack ? std::string("stacked tensors must have the same shape")
                            : fmt::format("sizes must match in every dim except dim {}, the one joined", dim + 1)));
  }
  push_tensor(L, Stack ? at::stack(tensors, dim) : at::cat(tensors, dim));
  return 1;
}

// t:index_select(dim, index) and t:gather(dim, index): index contents 0-based.
template <bool Gather>
int tensor_index_select(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t dim = check_dim(L, 2, self.dim());
  push_tensor(L, Gather ? self.gather(dim, check_tensor(L, 3)) : self.index_select(dim, check_tensor(L, 3)));
  return 1;
}

int tensor_masked_fill(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  push_tensor(L, self.masked_fill(check_tensor(L, 2), check_scalar(L, 3)));
  return 1;
}

template <bool Lower>
int tensor_triangle(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const std::int64_t diagonal = opt_integer(L, 2, 0);
  push_tensor(L, Lower ? self.tril(diagonal) : self.triu(diagonal));
  return 1;
}

// t:sort([dim [, descending]]) -> values, indices; t:topk(k [, dim [, largest]]) -> values, indices
int tensor_sort(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const auto [values, indices] =
      self.sort(opt_dim(L, 2, self.dim(), std::max<std::int64_t>(self.dim() - 1, 0)), opt_boolean(L, 3, false));
  push_tensor(L, values);
  push_tensor(L, indices);
  return 2;
}

int tensor_topk(lua_State* L) {
  const Tensor& self = check_tensor(L, 1);
  const auto [values, indices] =
      self.topk(check_integer(L, 2), opt_dim(L, 3, self.dim(), std::max<std::int64_t>(self.dim() - 1, 0)),
                opt_boolean(L, 4, true));
  push_tensor(L, values);
  push_tensor(L, indices);
  return 2;
}

void register_closure(lua_State* L, const char* name, void* op, lua_CFunction call) {
  lua_pushlightuserdata(L, op);
  lua_pushcclosure(L, call, 1);
  lua_setfield(L, -2, name);
}

}  // namespace

void open_tensor_ops(lua_State* L) {
  luaL_getmetatable(L, kTensorType);
  lua_getfield(L, -1, "methods");
  for (const auto& [name, op] : kUnaryOps) register_closure(L, name, reinterpret_cast<void*>(op), wrap<call_unary>);
  for (const auto& [name, op] : kBinaryOps)
    register_closure(L, name, reinterpret_cast<void*>(op), wrap<call_binary, kCountsFromZero>);
  for (const auto& [name, op] : kReductions)
    register_closure(L, name, reinterpret_cast<void*>(op), wrap<call_reduction, kCountsFromZero>);
  set_functions(L, {
                       {"add", wrap<add_or_sub<false, false>, kCountsFromZero>},
                       {"sub", wrap<add_or_sub<true, false>, kCountsFromZero>},
                       {"add_", wrap<add_or_sub<false, true>, kCountsFromZero>},
                       {"sub_", wrap<add_or_sub<true, true>, kCountsFromZero>},
                       {"fill_", wrap<tensor_fill_>},
                       {"lerp", wrap<tensor_lerp<false>, kCountsFromZero>},
                       {"lerp_", wrap<tensor_lerp<true>, kCountsFromZero>},
                       {"clamp", wrap<tensor_clamp<false>>},
                       {"clamp_", wrap<tensor_clamp<true>>},
                       {"normal_", wrap<tensor_normal_>},
                       {"uniform_", wrap<tensor_uniform_>},
                       {"gelu", wrap<tensor_gelu>},
                       {"leaky_relu", wrap<tensor_leaky_relu>},
                       {"softmax", wrap<tensor_softmax<false>, kCountsFromZero>},
                       {"log_softmax", wrap<tensor_softmax<true>, kCountsFromZero>},
                       {"equal", wrap<tensor_equal>},
                       {"allclose", wrap<tensor_allclose>},
                       {"prod", wrap<single_dim_reduction<0>, kCountsFromZero>},
                       {"all", wrap<single_dim_reduction<1>, kCountsFromZero>},
                       {"any", wrap<single_dim_reduction<2>, kCountsFromZero>},
                       {"max", wrap<tensor_max_min<true>, kCountsFromZero>},
                       {"min", wrap<tensor_max_min<false>, kCountsFromZero>},
                       {"argmax", wrap<tensor_argmax_argmin<true>, kCountsFromZero>},
                       {"argmin", wrap<tensor_argmax_argmin<false>, kCountsFromZero>},
                       {"norm", wrap<tensor_norm, kCountsFromZero>},
                       {"cumsum", wrap<tensor_cumulative<false>, kCountsFromZero>},
                       {"cumprod", wrap<tensor_cumulative<true>, kCountsFromZero>},
                       {"size", wrap<tensor_size>},
                       {"dim", wrap<tensor_dim>},
                       {"numel", wrap<tensor_numel>},
                       {"element_size", wrap<tensor_element_size>},
                       {"is_contiguous", wrap<tensor_is_contiguous>},
                       {"view", wrap<tensor_resize_like<0>, kCountsFromZero>},
                       {"reshape", wrap<tensor_resize_like<1>, kCountsFromZero>},
                       {"expand", wrap<tensor_resize_like<2>, kCountsFromZero>},
                       {"tile", wrap<tensor_resize_like<3>, kCountsFromZero>},
                       {"permute", wrap<tensor_permute, kCountsFromZero>},
                       {"flip", wrap<tensor_flip, kCountsFromZero>},
                       {"transpose", wrap<tensor_transpose, kCountsFromZero>},
                       {"flatten", wrap<tensor_flatten, kCountsFromZero>},
                       {"unflatten", wrap<tensor_unflatten, kCountsFromZero>},
                       {"unsqueeze", wrap<tensor_unsqueeze>},
                       {"squeeze", wrap<tensor_squeeze>},
                       {"narrow", wrap<tensor_narrow>},
                       {"select", wrap<tensor_select>},
                       {"chunk", wrap<tensor_chunk, kCountsFromZero>},
                       {"split", wrap<tensor_split, kCountsFromZero>},
                       {"index_select", wrap<tensor_index_select<false>, kCountsFromZero>},
                       {"gather", wrap<tensor_index_select<true>, kCountsFromZero>},
                       {"masked_fill", wrap<tensor_masked_fill, kCountsFromZero>},
                       {"tril", wrap<tensor_triangle<true>>},
                       {"triu", wrap<tensor_triangle<false>>},
                       {"sort", wrap<tensor_sort, kCountsFromZero>},
                       {"topk", wrap<tensor_topk, kCountsFromZero>},
                   });

  // Every method is also a torch function taking the tensor first: torch.exp(t) == t:exp().
  lua_getglobal(L, "torch");
  lua_pushnil(L);
  while (lua_next(L, -3)) {
    lua_pushvalue(L, -2);
    lua_rawget(L, -4);
    const bool taken = !lua_isnil(L, -1);
    lua_pop(L, 1);
    if (!taken) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_rawset(L, -4);
    } else {
      lua_pop(L, 1);
    }
  }
  set_functions(L, {
                       {"cat", wrap<torch_cat_stack<false>, kCountsFromZero>},
                       {"stack", wrap<torch_cat_stack<true>, kCountsFromZero>},
                       {"where", wrap<torch_where, kCountsFromZero>},
                   });
  lua_pop(L, 3);
}

}  // namespace runner::bindings
