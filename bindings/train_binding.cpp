// runner._train: the trainer as userdata (one call per step with a Lua loss function), the progress display,
// device memory and the TF32 / deterministic switches. stdlib/runner/train.lua builds the friendly API on it.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <memory>
#include <unistd.h>

#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "bindings/lua_json.h"
#include "bindings/tensor_binding.h"
#include "bindings/train_binding.h"
#include "runtime/core/device.h"
#include "runtime/core/interrupt.h"
#include "runtime/train/progress_display.h"

namespace runner::bindings {
namespace {

constexpr const char* kTrainerType = "runner.Trainer";
constexpr const char* kProgressType = "runner.Progress";

struct TrainerBox {
  std::unique_ptr<train::Trainer> trainer;
};

struct ProgressBox {
  std::unique_ptr<train::ProgressDisplay> display;
};

double clock_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A list of {name, tensor} pairs at `index`.
train::NamedTensorList named_tensors(lua_State* L, int index, const char* what) {
  train::NamedTensorList list;
  if (lua_isnoneornil(L, index)) return list;
  luaL_checktype(L, index, LUA_TTABLE);
  const int count = static_cast<int>(lua_objlen(L, index));
  for (int i = 1; i <= count; ++i) {
    lua_rawgeti(L, index, i);
    lua_rawgeti(L, -1, 1);
    lua_rawgeti(L, -2, 2);
    at::Tensor* tensor = test_tensor(L, -1);
    if (lua_type(L, -2) != LUA_TSTRING || !tensor)
      throw std::invalid_argument(fmt::format("{} entry {} must be {{name, tensor}}", what, i));
    list.emplace_back(lua_tostring(L, -2), *tensor);
    lua_pop(L, 3);
  }
  return list;
}

template <class T>
std::optional<T> optional_field(lua_State* L, int index, const char* key) {
  if (!has_field(L, index, key)) return std::nullopt;
  if constexpr (std::is_same_v<T, std::string>) return field_string(L, index, key, "");
  else if constexpr (std::is_same_v<T, std::int64_t>) return field_integer(L, index, key, 0);
  else return field_number(L, index, key, 0.0);
}

train::LrScheduleOptions schedule_options(lua_State* L, int index) {
  train::LrScheduleOptions o;
  if (lua_isnoneornil(L, index)) return o;
  luaL_checktype(L, index, LUA_TTABLE);
  check_option_keys(L, index, "schedule",
                    {"kind", "warmup_steps", "warmup_start_factor", "total_steps", "min_lr_factor", "step_size", "gamma",
                     "milestones", "mode", "factor", "patience", "threshold", "threshold_mode", "cooldown", "eps"});
  o.kind = field_string(L, index, "kind", o.kind);
  o.warmup_steps = field_integer(L, index, "warmup_steps", o.warmup_steps);
  o.warmup_start_factor = field_number(L, index, "warmup_start_factor", o.warmup_start_factor);
  o.total_steps = optional_field<std::int64_t>(L, index, "total_steps");
  o.min_lr_factor = optional_field<double>(L, index, "min_lr_factor");
  o.step_size = optional_field<std::int64_t>(L, index, "step_size");
  o.gamma = optional_field<double>(L, index, "gamma");
  for (double m : field_numbers(L, index, "milestones", {})) o.milestones.push_back(static_cast<std::int64_t>(m));
  o.mode = optional_field<std::string>(L, index, "mode");
  o.factor = optional_field<double>(L, index, "factor");
  o.patience = optional_field<std::int64_t>(L, index, "patience");
  o.threshold = optional_field<double>(L, index, "threshold");
  o.threshold_mode = optional_field<std::string>(L, index, "threshold_mode");
  o.cooldown = optional_field<std::int64_t>(L, index, "cooldown");
  o.eps = optional_field<double>(L, index, "eps");
  return o;
}

train::EmaOptions ema_options(lua_State* L, int index) {
  check_option_keys(L, index, "ema", {"decay", "min_decay", "update_after_step", "warmup", "inv_gamma", "power", "update_every"});
  train::EmaOptions o;
  o.decay = field_number(L, index, "decay", o.decay);
  o.min_decay = field_number(L, index, "min_decay", o.min_decay);
  o.update_after_step = field_integer(L, index, "update_after_step", o.update_after_step);
  o.warmup = field_boolean(L, index, "warmup", o.warmup);
  o.inv_gamma = field_number(L, index, "inv_gamma", o.inv_gamma);
  o.warmup_power = field_number(L, index, "power", o.warmup_power);
  o.update_every = field_integer(L, index, "update_every", o.update_every);
  return o;
}

train::ParamGroup param_group(lua_State* L, int index, int number) {
  check_option_keys(L, index, "optimizer group",
                    {"params", "lr", "weight_decay", "betas", "eps", "momentum", "dampening", "nesterov"});
  train::ParamGroup group;
  lua_getfield(L, index, "params");
  group.params = check_tensor_list(L, lua_gettop(L));
  lua_pop(L, 1);
  if (group.params.empty()) throw std::invalid_argument(fmt::format("parameter group {} has no parameters", number));
  if (!has_field(L, index, "lr")) throw std::invalid_argument(fmt::format("parameter group {} has no lr", number));
  group.lr = field_number(L, index, "lr", group.lr);
  group.weight_decay = field_number(L, index, "weight_decay", group.weight_decay);
  const auto betas = field_numbers(L, index, "betas", {group.beta1, group.beta2});
  if (betas.size() != 2) throw std::invalid_argument("option 'betas' must hold two numbers");
  group.beta1 = betas[0];
  group.beta2 = betas[1];
  group.eps = field_number(L, index, "eps", group.eps);
  group.momentum = field_number(L, index, "momentum", group.momentum);
  group.dampening = field_number(L, index, "dampening", group.dampening);
  group.nesterov = field_boolean(L, index, "nesterov", group.nesterov);
  return group;
}

// runner._train.new{parameters, buffers, optimizer, groups, schedule, emas, amp, accumulate, clip, on_nonfinite,
//                   device, scaler}
int trainer_new(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  check_option_keys(L, 1, "trainer",
                    {"parameters", "buffers", "optimizer", "groups", "schedule", "emas", "amp", "accumulate", "clip",
                     "on_nonfinite", "device", "scaler"});
  train::TrainerModel model;
  lua_getfield(L, 1, "parameters");
  model.parameters = named_tensors(L, lua_gettop(L), "parameters");
  lua_pop(L, 1);
  lua_getfield(L, 1, "buffers");
  model.buffers = named_tensors(L, lua_gettop(L), "buffers");
  lua_pop(L, 1);

  std::vector<train::ParamGroup> groups;
  lua_getfield(L, 1, "groups");
  luaL_checktype(L, -1, LUA_TTABLE);
  const int group_count = static_cast<int>(lua_objlen(L, -1));
  for (int i = 1; i <= group_count; ++i) {
    lua_rawgeti(L, -1, i);
    groups.push_back(param_group(L, lua_gettop(L), i));
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
  if (groups.empty()) throw std::invalid_argument("the optimizer has no parameters to train");

  lua_getfield(L, 1, "schedule");
  const train::LrScheduleOptions schedule = schedule_options(L, lua_gettop(L));
  lua_pop(L, 1);

  std::vector<train::EmaOptions> emas;
  lua_getfield(L, 1, "emas");
  if (lua_istable(L, -1)) {
    const int count = static_cast<int>(lua_objlen(L, -1));
    for (int i = 1; i <= count; ++i) {
      lua_rawgeti(L, -1, i);
      emas.push_back(ema_options(L, lua_gettop(L)));
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);

  train::TrainerOptions options;
  options.amp = field_string(L, 1, "amp", options.amp);
  options.accumulate = field_integer(L, 1, "accumulate", options.accumulate);
  if (has_field(L, 1, "clip")) options.clip = field_number(L, 1, "clip", 0.0);
  options.on_nonfinite = train::parse_nonfinite_policy(field_string(L, 1, "on_nonfinite", "skip"));
  lua_getfield(L, 1, "scaler");
  if (lua_istable(L, -1)) {
    const int scaler = lua_gettop(L);
    check_option_keys(L, scaler, "scaler", {"init_scale", "growth_factor", "backoff_factor", "growth_interval"});
    options.scaler.init_scale = field_number(L, scaler, "init_scale", options.scaler.init_scale);
    options.scaler.growth_factor = field_number(L, scaler, "growth_factor", options.scaler.growth_factor);
    options.scaler.backoff_factor = field_number(L, scaler, "backoff_factor", options.scaler.backoff_factor);
    options.scaler.growth_interval = field_integer(L, scaler, "growth_interval", options.scaler.growth_interval);
  }
  lua_pop(L, 1);
  const c10::Device device = core::parse_device(field_string(L, 1, "device", "cpu"));
  const auto kind = train::parse_optimizer_kind(field_string(L, 1, "optimizer", "adamw"));

  auto trainer = std::make_unique<train::Trainer>(std::move(model), kind, std::move(groups), schedule, std::move(emas),
                                                  options, device);
  new_userdata<TrainerBox>(L, kTrainerType, TrainerBox{std::move(trainer)});
  return 1;
}

// trainer:step(loss_function [, inputs]) -> {loss, grad_norm, loss_scale, skipped, lr, step}
// loss_function(micro, count) is called once per micro-batch (1-based micro).
int trainer_step(lua_State* L) {
  train::Trainer& trainer = check_trainer(L, 1);
  luaL_checktype(L, 2, LUA_TFUNCTION);
  train::NamedTensorList inputs;
  if (lua_istable(L, 3)) {
    lua_pushnil(L);
    while (lua_next(L, 3)) {
      if (lua_type(L, -2) == LUA_TSTRING)
        if (at::Tensor* tensor = test_tensor(L, -1)) inputs.emplace_back(lua_tostring(L, -2), *tensor);
      lua_pop(L, 1);
    }
  }
  train::LossFunction loss_of = [L](std::int64_t micro, std::int64_t count) -> at::Tensor {
    lua_pushvalue(L, 2);
    lua_pushnumber(L, static_cast<lua_Number>(micro + 1));
    lua_pushnumber(L, static_cast<lua_Number>(count));
    if (lua_pcall(L, 2, 1, 0) != 0) {
      if (is_interrupt_error(L, -1)) {
        lua_pop(L, 1);
        throw core::Interrupted();
      }
      std::string message = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                           : fmt::format("(error object is a {} value)", luaL_typename(L, -1));
      lua_pop(L, 1);
      throw LuaCallbackError(message);
    }
    at::Tensor* tensor = test_tensor(L, -1);
    if (!tensor) {
      const std::string type = luaL_typename(L, -1);
      lua_pop(L, 1);
      throw std::invalid_argument("the loss function must return the loss tensor, got a " + type);
    }
    at::Tensor loss = *tensor;
    lua_pop(L, 1);
    return loss;
  };
  train::StepResult result;
  try {
    result = trainer.step(loss_of, inputs);
  } catch (const train::NonFiniteError& error) {
    throw std::runtime_error(error.what());
  }
  lua_createtable(L, 0, 6);
  push_tensor(L, result.loss);
  lua_setfield(L, -2, "loss");
  push_tensor(L, result.grad_norm);
  lua_setfield(L, -2, "grad_norm");
  if (result.loss_scale.defined()) {
    push_tensor(L, result.loss_scale);
    lua_setfield(L, -2, "loss_scale");
  }
  push_tensor(L, result.skipped.clone());
  lua_setfield(L, -2, "skipped");
  lua_pushnumber(L, result.lr);
  lua_setfield(L, -2, "lr");
  lua_pushnumber(L, static_cast<lua_Number>(result.step));
  lua_setfield(L, -2, "step");
  return 1;
}

int trainer_timing(lua_State* L) {
  const train::StepTiming timing = check_trainer(L, 1).timing();
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, timing.forward_backward);
  lua_setfield(L, -2, "forward_backward");
  lua_pushnumber(L, timing.optimizer);
  lua_setfield(L, -2, "optimizer");
  lua_pushnumber(L, timing.ema);
  lua_setfield(L, -2, "ema");
  return 1;
}

int trainer_step_count(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_trainer(L, 1).step_count()));
  return 1;
}

int trainer_precision(lua_State* L) {
  lua_pushstring(L, train::precision_name(check_trainer(L, 1).precision()).c_str());
  return 1;
}

// trainer:lr([group = 1]) -> the LR of the next step
int trainer_lr(lua_State* L) {
  train::Trainer& trainer = check_trainer(L, 1);
  const std::int64_t group = opt_integer(L, 2, 1);
  lua_pushnumber(L, trainer.base_lr(static_cast<std::size_t>(group - 1)) * trainer.schedule().factor(trainer.step_count()));
  return 1;
}

int trainer_observe(lua_State* L) {
  check_trainer(L, 1).schedule().observe(luaL_checknumber(L, 2));
  return 0;
}

int trainer_describe_schedule(lua_State* L) {
  lua_pushstring(L, check_trainer(L, 1).schedule().describe().c_str());
  return 1;
}

// trainer:copy_ema(i, params, buffers): writes average i (1-based) into the given tensors.
int trainer_copy_ema(lua_State* L) {
  train::Trainer& trainer = check_trainer(L, 1);
  const std::int64_t index = check_integer(L, 2);
  auto& emas = trainer.emas();
  if (index < 1 || index > static_cast<std::int64_t>(emas.size()))
    throw std::invalid_argument(fmt::format("the trainer has {} EMA averages, not {}", emas.size(), index));
  emas[static_cast<std::size_t>(index - 1)].copy_to(check_tensor_list(L, 3), check_tensor_list(L, 4));
  return 0;
}

// trainer:restore(checkpoint_dir) -> extra (a table)
int trainer_restore(lua_State* L) {
  push_json(L, check_trainer(L, 1).restore(check_string(L, 2)));
  return 1;
}

// runner._train.device_memory(device) -> bytes allocated by tensors on a CUDA device, or nil
int device_memory(lua_State* L) {
  const c10::Device device = core::parse_device(check_string(L, 1));
  if (!device.is_cuda()) return 0;
  const auto stats = c10::getDeviceAllocator(c10::DeviceType::CUDA)->getDeviceStats(device.index() < 0 ? 0 : device.index());
  lua_pushnumber(L, static_cast<lua_Number>(stats.allocated_bytes[0].current));
  return 1;
}

int empty_device_cache(lua_State* L) {
  if (core::cuda_available()) c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
  (void)L;
  return 0;
}

// runner._train.graceful(enabled): the first stop signal waits for the end of the current step.
int graceful(lua_State* L) {
  core::set_graceful_stop(lua_toboolean(L, 1) != 0);
  return 0;
}

// runner._train.stop_signal() -> the pending stop's signal number, 0 when none
int stop_signal(lua_State* L) {
  lua_pushnumber(L, core::stop_signal());
  return 1;
}

int set_tf32(lua_State* L) {
  train::set_tf32(lua_toboolean(L, 1) != 0);
  return 0;
}

int set_deterministic(lua_State* L) {
  train::set_deterministic(lua_toboolean(L, 1) != 0);
  return 0;
}

// runner._train.progress{total, batch, terminal} -> Progress
int progress_new(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  check_option_keys(L, 1, "progress", {"total", "batch", "terminal", "line_seconds"});
  train::ProgressOptions options;
  options.total_steps = field_integer(L, 1, "total", 0);
  options.batch_size = field_integer(L, 1, "batch", 0);
  options.terminal = field_boolean(L, 1, "terminal", ::isatty(::fileno(stdout)) != 0);
  options.line_seconds = field_number(L, 1, "line_seconds", options.line_seconds);
  new_userdata<ProgressBox>(L, kProgressType, ProgressBox{std::make_unique<train::ProgressDisplay>(options, clock_seconds())});
  return 1;
}

// progress:update(step, values, lr, memory_bytes [, final]): values (numbers or one-element tensors) are read
// only when the line is shown.
int progress_update(lua_State* L) {
  auto* box = check_userdata<ProgressBox>(L, 1, kProgressType, "Progress");
  const std::int64_t step = check_integer(L, 2);
  const bool final = lua_toboolean(L, 6) != 0;
  const double now = clock_seconds();
  if (!final && !box->display->tick(step, now)) {
    lua_pushboolean(L, 0);
    return 1;
  }
  train::ProgressSnapshot snapshot;
  snapshot.step = step;
  if (lua_istable(L, 3)) {
    const int count = static_cast<int>(lua_objlen(L, 3));
    for (int i = 1; i <= count; ++i) {
      lua_rawgeti(L, 3, i);
      lua_rawgeti(L, -1, 1);
      lua_rawgeti(L, -2, 2);
      double value = NAN;
      if (lua_type(L, -1) == LUA_TNUMBER) value = lua_tonumber(L, -1);
      else if (at::Tensor* tensor = test_tensor(L, -1)) value = tensor->item<double>();
      snapshot.values.emplace_back(lua_tostring(L, -2) ? lua_tostring(L, -2) : "?", value);
      lua_pop(L, 3);
    }
  }
  if (lua_type(L, 4) == LUA_TNUMBER) snapshot.lr = lua_tonumber(L, 4);
  if (lua_type(L, 5) == LUA_TNUMBER) snapshot.memory_bytes = lua_tonumber(L, 5);
  if (final) box->display->finish(snapshot, now);
  else box->display->show(snapshot, now);
  lua_pushboolean(L, 1);
  return 1;
}

}  // namespace

train::Trainer& check_trainer(lua_State* L, int index) {
  auto* box = check_userdata<TrainerBox>(L, index, kTrainerType, "Trainer");
  return *box->trainer;
}

void open_train(lua_State* L) {
  new_metatable<TrainerBox>(L, kTrainerType,
                            {{"step", wrap<trainer_step>},
                             {"timing", wrap<trainer_timing>},
                             {"step_count", wrap<trainer_step_count>},
                             {"precision", wrap<trainer_precision>},
                             {"lr", wrap<trainer_lr>},
                             {"observe", wrap<trainer_observe>},
                             {"describe_schedule", wrap<trainer_describe_schedule>},
                             {"copy_ema", wrap<trainer_copy_ema>},
                             {"restore", wrap<trainer_restore>}});
  lua_pop(L, 1);
  new_metatable<ProgressBox>(L, kProgressType, {{"update", wrap<progress_update>}});
  lua_pop(L, 1);
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L, {{"new", wrap<trainer_new>},
                    {"progress", wrap<progress_new>},
                    {"device_memory", wrap<device_memory>},
                    {"empty_device_cache", wrap<empty_device_cache>},
                    {"graceful", wrap<graceful>},
                    {"stop_signal", wrap<stop_signal>},
                    {"set_tf32", wrap<set_tf32>},
                    {"set_deterministic", wrap<set_deterministic>}});
  lua_setfield(L, -2, "_train");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
