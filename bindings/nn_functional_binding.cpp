// nn.functional: the losses (mse_loss, l1_loss, cross_entropy) and stateless layer ops (linear, dropout, norms).
#include <ATen/ATen.h>
#include <fmt/format.h>

#include <optional>
#include <string>

#include "bindings/binding.h"
#include "bindings/nn_functional_binding.h"
#include "bindings/option_table.h"
#include "bindings/tensor_binding.h"

namespace runner::bindings {
namespace {

at::Reduction::Reduction reduction_of(const std::string& reduction, const char* function) {
  if (reduction == "mean") return at::Reduction::Mean;
  if (reduction == "sum") return at::Reduction::Sum;
  if (reduction == "none") return at::Reduction::None;
  throw std::invalid_argument(fmt::format("{}: reduction must be mean, sum or none, got '{}'", function, reduction));
}

// The options of the losses, each with only the keys its loss reads (PyTorch's defaults).
struct LossOptions {
  std::string reduction = "mean";
};
const OptionTable<LossOptions> kLossOptions("loss", "LossOptions", {option("reduction", &LossOptions::reduction)});

struct CrossEntropyOptions {
  std::string reduction = "mean";
  double label_smoothing = 0.0;
  std::int64_t ignore_index = -100;  // target ids equal to this add nothing
  std::optional<at::Tensor> weight;  // [C] per-class weights
};
const OptionTable<CrossEntropyOptions> kCrossEntropyOptions(
    "cross_entropy", "CrossEntropyOptions",
    {
        option("reduction", &CrossEntropyOptions::reduction),
        option("label_smoothing", &CrossEntropyOptions::label_smoothing),
        option("ignore_index", &CrossEntropyOptions::ignore_index),
        option_with<CrossEntropyOptions>("weight",
                                         [](lua_State* L, const char*, CrossEntropyOptions& o) {
                                           o.weight = check_tensor(L, lua_gettop(L));
                                         }),
    });

// F.mse_loss(input, target [, LossOptions])
int f_mse_loss(lua_State* L) {
  const LossOptions o = kLossOptions.read_as("mse_loss", L, 3);
  push_tensor(L, at::mse_loss(check_tensor(L, 1), check_tensor(L, 2), reduction_of(o.reduction, "mse_loss")));
  return 1;
}

// F.l1_loss(input, target [, LossOptions])
int f_l1_loss(lua_State* L) {
  const LossOptions o = kLossOptions.read_as("l1_loss", L, 3);
  push_tensor(L, at::l1_loss(check_tensor(L, 1), check_tensor(L, 2), reduction_of(o.reduction, "l1_loss")));
  return 1;
}

// F.cross_entropy(logits [N, C, ...], target [N, ...] int64 class ids (0-based) or probabilities
// [, CrossEntropyOptions])
int f_cross_entropy(lua_State* L) {
  const CrossEntropyOptions o = kCrossEntropyOptions.read(L, 3);
  push_tensor(L, at::cross_entropy_loss(check_tensor(L, 1), check_tensor(L, 2), o.weight,
                                        reduction_of(o.reduction, "cross_entropy"), o.ignore_index, o.label_smoothing));
  return 1;
}

// F.linear(x, weight [, bias])
int f_linear(lua_State* L) {
  std::optional<at::Tensor> bias;
  if (!lua_isnoneornil(L, 3)) bias = check_tensor(L, 3);
  push_tensor(L, at::linear(check_tensor(L, 1), check_tensor(L, 2), bias));
  return 1;
}

// F.dropout(x, p [, training = true])
int f_dropout(lua_State* L) {
  push_tensor(L, at::dropout(check_tensor(L, 1), luaL_checknumber(L, 2), opt_boolean(L, 3, true)));
  return 1;
}

// F.group_norm(x, num_groups [, weight [, bias [, eps]]])
int f_group_norm(lua_State* L) {
  std::optional<at::Tensor> weight, bias;
  if (!lua_isnoneornil(L, 3)) weight = check_tensor(L, 3);
  if (!lua_isnoneornil(L, 4)) bias = check_tensor(L, 4);
  push_tensor(L, at::group_norm(check_tensor(L, 1), check_integer(L, 2), weight, bias, luaL_optnumber(L, 5, 1e-5)));
  return 1;
}

// F.layer_norm(x, shape [, weight [, bias [, eps]]])
int f_layer_norm(lua_State* L) {
  int next = 2;
  const auto shape = check_sizes(L, 2, &next);
  std::optional<at::Tensor> weight, bias;
  if (!lua_isnoneornil(L, next)) weight = check_tensor(L, next);
  if (!lua_isnoneornil(L, next + 1)) bias = check_tensor(L, next + 1);
  push_tensor(L, at::layer_norm(check_tensor(L, 1), shape, weight, bias, luaL_optnumber(L, next + 2, 1e-5)));
  return 1;
}

}  // namespace

void push_nn_functional(lua_State* L) {
  lua_newtable(L);
  set_functions(L, {
                       {"mse_loss", wrap<f_mse_loss>},
                       {"l1_loss", wrap<f_l1_loss>},
                       {"cross_entropy", wrap<f_cross_entropy>},
                       {"linear", wrap<f_linear>},
                       {"dropout", wrap<f_dropout>},
                       {"group_norm", wrap<f_group_norm>},
                       {"layer_norm", wrap<f_layer_norm>},
                   });
}

}  // namespace runner::bindings
