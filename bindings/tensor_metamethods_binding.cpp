// The Tensor metamethods: arithmetic with numbers on either side, unary minus, length, comparisons, tostring.
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
  throw std::invalid_argument(
      "Tensors cannot be compared with < or <=: use t:lt(u), t:le(u), t:gt(u), t:ge(u) "
      "for elementwise comparison, or t:equal(u)");
  return 0;
}

int tensor_tostring(lua_State* L) {
  const std::string text = core::format_tensor(check_tensor(L, 1));
  lua_pushlstring(L, text.data(), text.size());
  return 1;
}

}  // namespace

void add_tensor_metamethods(lua_State* L) {
  set_functions(L, {
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
}

}  // namespace runner::bindings
