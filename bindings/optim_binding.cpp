// Optimizers (SGD with momentum, Adam, AdamW) with parameter groups, and gradient-norm clipping.
// stdlib/runner/optim.lua turns modules and parameter lists into the groups taken here.
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim.h>

#include <fmt/format.h>

#include "bindings/bindings.h"
#include "bindings/tensor_binding.h"

namespace runner::bindings {
namespace {

constexpr const char* kOptimizerType = "runner.Optimizer";

struct OptimizerBox {
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  std::string kind;
};

OptimizerBox& check_optimizer(lua_State* L, int index) {
  return *check_userdata<OptimizerBox>(L, index, kOptimizerType, "Optimizer");
}

std::tuple<double, double> betas_option(lua_State* L, int index, std::tuple<double, double> fallback) {
  const auto betas = field_numbers(L, index, "betas", {std::get<0>(fallback), std::get<1>(fallback)});
  if (betas.size() != 2) throw std::invalid_argument("option 'betas' must hold two numbers");
  return {betas[0], betas[1]};
}

// Options read from the table at `index` on top of `base` (the defaults, or a group's own table).
torch::optim::SGDOptions sgd_options(lua_State* L, int index, torch::optim::SGDOptions base) {
  check_option_keys(L, index, "SGD", {"params", "lr", "momentum", "dampening", "weight_decay", "nesterov"});
  return base.lr(field_number(L, index, "lr", base.lr()))
      .momentum(field_number(L, index, "momentum", base.momentum()))
      .dampening(field_number(L, index, "dampening", base.dampening()))
      .weight_decay(field_number(L, index, "weight_decay", base.weight_decay()))
      .nesterov(field_boolean(L, index, "nesterov", base.nesterov()));
}

template <class Options>
Options adam_options(lua_State* L, int index, Options base, const char* name) {
  check_option_keys(L, index, name, {"params", "lr", "betas", "eps", "weight_decay", "amsgrad"});
  return base.lr(field_number(L, index, "lr", base.lr()))
      .betas(betas_option(L, index, base.betas()))
      .eps(field_number(L, index, "eps", base.eps()))
      .weight_decay(field_number(L, index, "weight_decay", base.weight_decay()))
      .amsgrad(field_boolean(L, index, "amsgrad", base.amsgrad()));
}

// Builds one group per entry of the list at index 1: {params = {tensors}, <option overrides>}.
template <class Options, class ParseOptions>
std::vector<torch::optim::OptimizerParamGroup> param_groups(lua_State* L, const Options& defaults, ParseOptions parse) {
  luaL_checktype(L, 1, LUA_TTABLE);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  const int count = static_cast<int>(lua_objlen(L, 1));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, 1, i);
    const int group = lua_gettop(L);
    lua_getfield(L, group, "params");
    auto params = check_tensor_list(L, lua_gettop(L));
    lua_pop(L, 1);
    if (params.empty()) throw std::invalid_argument(fmt::format("parameter group {} has no parameters", i));
    for (const auto& p : params)
      if (!p.is_leaf() || !p.requires_grad())
        throw std::invalid_argument(fmt::format("parameter group {} holds a tensor that is not a leaf requiring grad", i));
    groups.emplace_back(std::move(params), std::make_unique<Options>(parse(L, group, defaults)));
    lua_pop(L, 1);
  }
  if (groups.empty()) throw std::invalid_argument("optimizer got no parameters");
  return groups;
}

// optim._new(groups, defaults, kind)
int optim_new(lua_State* L) {
  const std::string kind = check_string(L, 3);
  if (lua_isnoneornil(L, 2)) {
    lua_newtable(L);
    lua_replace(L, 2);
  }
  std::unique_ptr<torch::optim::Optimizer> optimizer;
  if (kind == "SGD") {
    if (!has_field(L, 2, "lr")) throw std::invalid_argument("SGD: option 'lr' is required");
    const auto defaults = sgd_options(L, 2, torch::optim::SGDOptions(0.0));
    optimizer = std::make_unique<torch::optim::SGD>(param_groups(L, defaults, sgd_options), defaults);
  } else if (kind == "Adam") {
    const auto defaults = adam_options(L, 2, torch::optim::AdamOptions(), "Adam");
    auto parse = [](lua_State* S, int i, torch::optim::AdamOptions b) { return adam_options(S, i, b, "Adam"); };
    optimizer = std::make_unique<torch::optim::Adam>(param_groups(L, defaults, parse), defaults);
  } else if (kind == "AdamW") {
    const auto defaults = adam_options(L, 2, torch::optim::AdamWOptions(), "AdamW");
    auto parse = [](lua_State* S, int i, torch::optim::AdamWOptions b) { return adam_options(S, i, b, "AdamW"); };
    optimizer = std::make_unique<torch::optim::AdamW>(param_groups(L, defaults, parse), defaults);
  } else {
    throw std::invalid_argument("unknown optimizer '" + kind + "' (expected SGD, Adam or AdamW)");
  }
  new_userdata<OptimizerBox>(L, kOptimizerType, OptimizerBox{std::move(optimizer), kind});
  return 1;
}

int optimizer_step(lua_State* L) {
  check_optimizer(L, 1).optimizer->step();
  return 0;
}

// opt:zero_grad([set_to_none = true])
int optimizer_zero_grad(lua_State* L) {
  check_optimizer(L, 1).optimizer->zero_grad(opt_boolean(L, 2, true));
  return 0;
}

torch::optim::OptimizerParamGroup& check_group(lua_State* L, OptimizerBox& box, int index) {
  auto& groups = box.optimizer->param_groups();
  const std::int64_t group = opt_integer(L, index, 1);
  if (group < 1 || group > static_cast<std::int64_t>(groups.size()))
    luaL_argerror(L, index, fmt::format("group {} out of range (the optimizer has {} groups)", group, groups.size()).c_str());
  return groups[static_cast<size_t>(group - 1)];
}

// opt:lr([group = 1]) -> learning rate of that group
int optimizer_lr(lua_State* L) {
  OptimizerBox& box = check_optimizer(L, 1);
  lua_pushnumber(L, check_group(L, box, 2).options().get_lr());
  return 1;
}

// opt:set_lr(lr [, group]): one group, or every group when none is named.
int optimizer_set_lr(lua_State* L) {
  OptimizerBox& box = check_optimizer(L, 1);
  const double lr = luaL_checknumber(L, 2);
  if (lua_isnoneornil(L, 3)) {
    for (auto& group : box.optimizer->param_groups()) group.options().set_lr(lr);
  } else {
    check_group(L, box, 3).options().set_lr(lr);
  }
  return 0;
}

int optimizer_group_count(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_optimizer(L, 1).optimizer->param_groups().size()));
  return 1;
}

int optimizer_tostring(lua_State* L) {
  OptimizerBox& box = check_optimizer(L, 1);
  std::string text = box.kind + "(";
  int i = 0;
  for (auto& group : box.optimizer->param_groups())
    text += fmt::format("{}group {}: {} tensors, lr={}", i++ ? "; " : "", i, group.params().size(), group.options().get_lr());
  lua_pushstring(L, (text + ")").c_str());
  return 1;
}

// optim.clip_grad_norm(params, max_norm [, norm_type = 2]) -> total norm before clipping
int optim_clip_grad_norm(lua_State* L) {
  const auto params = check_tensor_list(L, 1);
  const double max_norm = luaL_checknumber(L, 2);
  const double norm_type = luaL_optnumber(L, 3, 2.0);
  lua_pushnumber(L, torch::nn::utils::clip_grad_norm_(params, max_norm, norm_type));
  return 1;
}

}  // namespace

void open_optim(lua_State* L) {
  new_metatable<OptimizerBox>(L, kOptimizerType, {
      {"step", wrap<optimizer_step>},
      {"zero_grad", wrap<optimizer_zero_grad>},
      {"lr", wrap<optimizer_lr>},
      {"set_lr", wrap<optimizer_set_lr>},
      {"group_count", wrap<optimizer_group_count>},
  });
  lua_pop(L, 1);
  luaL_getmetatable(L, kOptimizerType);
  lua_pushcfunction(L, wrap<optimizer_tostring>);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);

  lua_newtable(L);
  set_functions(L, {{"_new", wrap<optim_new>}, {"clip_grad_norm", wrap<optim_clip_grad_norm>}});
  lua_setglobal(L, "optim");
}

}  // namespace runner::bindings
