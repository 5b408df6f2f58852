// optim: the trainer's optimizers (runtime/train/optimizer.h: PyTorch's foreach math, fused kernels on CUDA)
// as Lua objects with parameter groups, shared with runner.trainer; gradient-norm clipping.
// stdlib/runner/optim.lua turns modules and parameter lists into the groups taken here.
#include <ATen/ATen.h>
#include <fmt/format.h>

#include "bindings/bindings.h"
#include "bindings/option_table.h"
#include "bindings/optim_binding.h"
#include "bindings/tensor_binding.h"
#include "runtime/train/grad_norm.h"

namespace runner::bindings {
namespace {

constexpr const char* kOptimizerType = "runner.Optimizer";

struct OptimizerBox {
  std::shared_ptr<train::Optimizer> optimizer;
};

train::Optimizer& check_optimizer(lua_State* L, int index) {
  return *check_userdata<OptimizerBox>(L, index, kOptimizerType, "Optimizer")->optimizer;
}

void read_betas(lua_State* L, const char* key, train::ParamGroup& group) {
  std::vector<double> betas;
  read_option_value(L, key, betas);
  if (betas.size() != 2) raise_error(L, "option 'betas' must hold two numbers");
  group.beta1 = betas[0];
  group.beta2 = betas[1];
}

// The keys of a group table: params (the stdlib's list of tensors) and the kind's hyperparameters.
const OptionTable<train::ParamGroup> kSgdOptions("SGD", "SGDOptions",
                                                 {
                                                     lua_option<train::ParamGroup>("params"),
                                                     option("lr", &train::ParamGroup::lr),
                                                     option("momentum", &train::ParamGroup::momentum),
                                                     option("dampening", &train::ParamGroup::dampening),
                                                     option("weight_decay", &train::ParamGroup::weight_decay),
                                                     option("nesterov", &train::ParamGroup::nesterov),
                                                 });
// Adam and AdamW take the same keys.
std::vector<OptionField<train::ParamGroup>> adam_fields() {
  return {
      lua_option<train::ParamGroup>("params"),
      option("lr", &train::ParamGroup::lr),
      option_with<train::ParamGroup>("betas", read_betas),
      option("eps", &train::ParamGroup::eps),
      option("weight_decay", &train::ParamGroup::weight_decay),
      option("amsgrad", &train::ParamGroup::amsgrad),
  };
}
const OptionTable<train::ParamGroup> kAdamOptions("Adam", "AdamOptions", adam_fields());
const OptionTable<train::ParamGroup> kAdamWOptions("AdamW", "AdamWOptions", adam_fields());

const OptionTable<train::ParamGroup>& options_of(train::OptimizerKind kind) {
  switch (kind) {
    case train::OptimizerKind::sgd:
      return kSgdOptions;
    case train::OptimizerKind::adam:
      return kAdamOptions;
    case train::OptimizerKind::adamw:
      return kAdamWOptions;
  }
  return kAdamWOptions;
}

// optim._new(kind, groups, defaults): groups is a list of {params = {tensors}, <overrides>}.
int optim_new(lua_State* L) {
  const train::OptimizerKind kind = train::parse_optimizer_kind(check_string(L, 1));
  const OptionTable<train::ParamGroup>& table = options_of(kind);
  const bool default_lr = has_field(L, 3, "lr");
  const train::ParamGroup defaults = table.read(L, 3, train::default_param_group(kind));
  luaL_checktype(L, 2, LUA_TTABLE);
  std::vector<train::ParamGroup> groups;
  const int count = static_cast<int>(lua_objlen(L, 2));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, 2, i);
    const int group_index = lua_gettop(L);
    // One rule for every optimizer and the trainer's {"adamw", lr = ...}: the learning rate is given, never
    // torch.optim's default 1e-3 taken in silence.
    if (!default_lr && !has_field(L, group_index, "lr"))
      throw std::invalid_argument(
          count == 1 ? fmt::format("{}: option 'lr' is required", table.function())
                     : fmt::format("{}: option 'lr' is required (in the options, or in parameter group {})",
                                   table.function(), i));
    train::ParamGroup group = table.read(L, group_index, defaults);
    lua_getfield(L, group_index, "params");
    group.params = check_tensor_list(L, lua_gettop(L));
    lua_pop(L, 2);
    if (group.params.empty()) throw std::invalid_argument(fmt::format("parameter group {} has no parameters", i));
    for (const auto& p : group.params)
      if (!p.is_leaf() || !p.requires_grad())
        throw std::invalid_argument(
            fmt::format("parameter group {} holds a tensor that is not a leaf requiring grad", i));
    groups.push_back(std::move(group));
  }
  if (groups.empty()) throw std::invalid_argument("optimizer got no parameters");
  new_userdata<OptimizerBox>(L, kOptimizerType,
                             OptimizerBox{std::make_shared<train::Optimizer>(kind, std::move(groups))});
  return 1;
}

int optimizer_step(lua_State* L) {
  check_optimizer(L, 1).step();
  return 0;
}

// opt:zero_grad([set_to_none = true])
int optimizer_zero_grad(lua_State* L) {
  check_optimizer(L, 1).zero_grad(opt_boolean(L, 2, true));
  return 0;
}

std::size_t check_group(lua_State* L, train::Optimizer& optimizer, int index) {
  const std::int64_t group = opt_integer(L, index, 1);
  const auto count = static_cast<std::int64_t>(optimizer.groups().size());
  if (group < 1 || group > count)
    luaL_argerror(L, index, fmt::format("group {} out of range (the optimizer has {} groups)", group, count).c_str());
  return static_cast<std::size_t>(group - 1);
}

// opt:lr([group = 1]) -> learning rate of that group
int optimizer_lr(lua_State* L) {
  train::Optimizer& optimizer = check_optimizer(L, 1);
  lua_pushnumber(L, optimizer.lr(check_group(L, optimizer, 2)));
  return 1;
}

// opt:set_lr(lr [, group]): one group, or every group when none is named.
int optimizer_set_lr(lua_State* L) {
  train::Optimizer& optimizer = check_optimizer(L, 1);
  const double lr = luaL_checknumber(L, 2);
  if (lua_isnoneornil(L, 3)) {
    for (std::size_t g = 0; g < optimizer.groups().size(); ++g) optimizer.set_lr(g, lr);
  } else {
    optimizer.set_lr(check_group(L, optimizer, 3), lr);
  }
  return 0;
}

int optimizer_group_count(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_optimizer(L, 1).groups().size()));
  return 1;
}

int optimizer_kind(lua_State* L) {
  lua_pushstring(L, train::optimizer_kind_name(check_optimizer(L, 1).kind()).c_str());
  return 1;
}

int optimizer_tostring(lua_State* L) {
  train::Optimizer& optimizer = check_optimizer(L, 1);
  std::string text = options_of(optimizer.kind()).function() + std::string("(");
  for (std::size_t g = 0; g < optimizer.groups().size(); ++g)
    text += fmt::format("{}group {}: {} tensors, lr={}", g ? "; " : "", g + 1, optimizer.groups()[g].params.size(),
                        optimizer.lr(g));
  lua_pushstring(L, (text + ")").c_str());
  return 1;
}

// optim.clip_grad_norm(params, max_norm [, norm_type = 2]) -> total norm before clipping (a number)
int optim_clip_grad_norm(lua_State* L) {
  const auto params = check_tensor_list(L, 1);
  const double max_norm = luaL_checknumber(L, 2);
  const double norm_type = luaL_optnumber(L, 3, 2.0);
  std::vector<at::Tensor> grads;
  for (const auto& p : params)
    if (p.grad().defined()) grads.push_back(p.grad());
  if (grads.empty()) {
    lua_pushnumber(L, 0);
    return 1;
  }
  const at::Tensor norm = train::clip_grad_norm(grads, max_norm, norm_type);
  lua_pushnumber(L, norm.item<double>());
  return 1;
}

}  // namespace

std::shared_ptr<train::Optimizer> test_optimizer(lua_State* L, int index) {
  auto* box = test_userdata<OptimizerBox>(L, index, kOptimizerType);
  return box ? box->optimizer : nullptr;
}

void open_optim(lua_State* L) {
  new_metatable<OptimizerBox>(L, kOptimizerType,
                              {
                                  {"step", wrap<optimizer_step>},
                                  {"zero_grad", wrap<optimizer_zero_grad>},
                                  {"lr", wrap<optimizer_lr>},
                                  {"set_lr", wrap<optimizer_set_lr>},
                                  {"group_count", wrap<optimizer_group_count>},
                                  {"kind", wrap<optimizer_kind>},
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
