// runner._train: the trainer as userdata (its options declared once; one call per step, with a Lua loss function or
// an objective), its progress line and profiled steps. stdlib/runner/train.lua builds the friendly API on it.
#include <ATen/ATen.h>
#include <c10/core/CachingDeviceAllocator.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fmt/format.h>
#include <memory>
#include <unistd.h>

#include "bindings/attach_session.h"
#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "bindings/data_binding.h"
#include "bindings/lua_json.h"
#include "bindings/nn_binding.h"
#include "bindings/option_table.h"
#include "bindings/optim_binding.h"
#include "bindings/run_binding.h"
#include "bindings/tensor_binding.h"
#include "bindings/train_binding.h"
#include "runtime/core/clock.h"
#include "runtime/core/device.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/launch_context.h"
#include "runtime/dist/process_group.h"
#include "runtime/run/run_context.h"
#include "runtime/run/trainer_observers.h"
#include "runtime/train/progress_observer.h"
#include "runtime/train/step_profiler.h"

namespace runner::bindings {
namespace {

constexpr const char* kTrainerType = "runner.Trainer";

constexpr const char* kObjectiveType = "runner.Objective";

struct TrainerBox {
  std::shared_ptr<train::Trainer> trainer;
  // Its step observers, writing to the run runner.start made (the active run at each step; none: nothing).
  std::shared_ptr<run::TrainerObservers> observers;
};

TrainerBox& check_trainer_box(lua_State* L, int index) {
  return *check_userdata<TrainerBox>(L, index, kTrainerType, "Trainer");
}

struct ObjectiveBox {
  std::shared_ptr<train::Objective> objective;
};

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

const OptionTable<train::LrScheduleOptions> kScheduleOptions(
    "schedule", "ScheduleOptions",
    {
        option("kind", &train::LrScheduleOptions::kind),
        option("warmup_steps", &train::LrScheduleOptions::warmup_steps),
        option("warmup_start_factor", &train::LrScheduleOptions::warmup_start_factor),
        option("total_steps", &train::LrScheduleOptions::total_steps),
        option("min_lr_factor", &train::LrScheduleOptions::min_lr_factor),
        option("step_size", &train::LrScheduleOptions::step_size),
        option("gamma", &train::LrScheduleOptions::gamma),
        option("milestones", &train::LrScheduleOptions::milestones),
        option("mode", &train::LrScheduleOptions::mode),
        option("factor", &train::LrScheduleOptions::factor),
        option("patience", &train::LrScheduleOptions::patience),
        option("threshold", &train::LrScheduleOptions::threshold),
        option("threshold_mode", &train::LrScheduleOptions::threshold_mode),
        option("cooldown", &train::LrScheduleOptions::cooldown),
        option("eps", &train::LrScheduleOptions::eps),
    });

const OptionTable<train::EmaOptions> kEmaOptions("ema", "EmaOptions",
                                                 {
                                                     option("decay", &train::EmaOptions::decay),
                                                     option("min_decay", &train::EmaOptions::min_decay),
                                                     option("update_after_step", &train::EmaOptions::update_after_step),
                                                     option("warmup", &train::EmaOptions::warmup),
                                                     option("inv_gamma", &train::EmaOptions::inv_gamma),
                                                     option("power", &train::EmaOptions::power),
                                                     option("update_every", &train::EmaOptions::update_every),
                                                 });

const OptionTable<train::LossScalerOptions> kScalerOptions(
    "scaler", "ScalerOptions",
    {
        option("init_scale", &train::LossScalerOptions::init_scale),
        option("growth_factor", &train::LossScalerOptions::growth_factor),
        option("backoff_factor", &train::LossScalerOptions::backoff_factor),
        option("growth_interval", &train::LossScalerOptions::growth_interval),
    });

const OptionTable<dist::GradientAveragingOptions> kDataParallelOptions(
    "data_parallel", "DataParallelOptions",
    {
        option("bucket_mb", &dist::GradientAveragingOptions::bucket_mb),
        option("overlap", &dist::GradientAveragingOptions::overlap),
    });

// runner.trainer's options table (---@class TrainerOptions): how each step runs (train::StepOptions) and what
// the binding builds around the trainer from the other keys.
struct TrainerOptions {
  train::StepOptions step;
  train::LrScheduleOptions schedule;
  std::optional<std::int64_t> warmup;
  std::vector<train::EmaOptions> emas;
  std::optional<std::int64_t> steps;
  std::optional<bool> tf32;
  bool deterministic = false;
};

// A decay, {decay = ..., ...}, or a list of them.
void read_emas(lua_State* L, const char* key, TrainerOptions& options) {
  const int value = lua_gettop(L);
  auto one = [&](int index) {
    if (lua_type(L, index) == LUA_TNUMBER) {
      train::EmaOptions ema;
      ema.decay = lua_tonumber(L, index);
      return ema;
    }
    if (!lua_istable(L, index))
      raise_error(
          L, fmt::format(
                 "runner.trainer: '{}' must be a decay, a table {{decay = ..., warmup = ...}} or a list of them", key));
    return kEmaOptions.read(L, index);
  };
  if (lua_type(L, value) == LUA_TBOOLEAN && !lua_toboolean(L, value)) return;
  if (lua_istable(L, value) && lua_objlen(L, value) > 0) {
    const int count = static_cast<int>(lua_objlen(L, value));
    for (int i = 1; i <= count; ++i) {
      lua_rawgeti(L, value, i);
      options.emas.push_back(one(lua_gettop(L)));
      lua_pop(L, 1);
    }
  } else {
    options.emas.push_back(one(value));
  }
}

void read_schedule(lua_State* L, const char*, TrainerOptions& options) {
  if (lua_type(L, -1) == LUA_TSTRING)
    options.schedule.kind = lua_tostring(L, -1);
  else
    options.schedule = kScheduleOptions.read(L, lua_gettop(L));
}

const OptionTable<TrainerOptions> kTrainerOptions(
    "runner.trainer", "TrainerOptions",
    {
        lua_option<TrainerOptions>("model", true),
        lua_option<TrainerOptions>("optimizer", true),
        option_with<TrainerOptions>("schedule", read_schedule),
        option("warmup", &TrainerOptions::warmup),
        option_with<TrainerOptions>("ema", read_emas),
        lua_option<TrainerOptions>("ema_model"),
        option_with<TrainerOptions>("amp", [](lua_State* L, const char* key,
                                              TrainerOptions& o) { read_option_value(L, key, o.step.amp); }),
        option_with<TrainerOptions>("accumulate",
                                    [](lua_State* L, const char* key, TrainerOptions& o) {
                                      read_option_value(L, key, o.step.accumulate);
                                    }),
        option_with<TrainerOptions>("clip", [](lua_State* L, const char* key,
                                               TrainerOptions& o) { read_option_value(L, key, o.step.clip); }),
        option_with<TrainerOptions>("cast_weights_once",
                                    [](lua_State* L, const char* key, TrainerOptions& o) {
                                      read_option_value(L, key, o.step.cast_weights_once);
                                    }),
        option_with<TrainerOptions>("on_nonfinite",
                                    [](lua_State* L, const char* key, TrainerOptions& o) {
                                      std::string name;
                                      read_option_value(L, key, name);
                                      o.step.on_nonfinite = train::parse_nonfinite_policy(name);
                                    }),
        option("steps", &TrainerOptions::steps),
        lua_option<TrainerOptions>("batch"),
        lua_option<TrainerOptions>("progress"),
        option("tf32", &TrainerOptions::tf32),
        option("deterministic", &TrainerOptions::deterministic),
        option_with<TrainerOptions>("scaler",
                                    [](lua_State* L, const char*, TrainerOptions& o) {
                                      o.step.scaler = kScalerOptions.read(L, lua_gettop(L));
                                    }),
        option_with<TrainerOptions>("shard",
                                    [](lua_State* L, const char* key, TrainerOptions& o) {
                                      std::string name;
                                      read_option_value(L, key, name);
                                      o.step.shard = dist::parse_shard_mode(name);
                                    }),
        option_with<TrainerOptions>("shard_gather",
                                    [](lua_State* L, const char* key, TrainerOptions& o) {
                                      std::string name;
                                      read_option_value(L, key, name);
                                      o.step.shard_gather = dist::parse_weight_gather(name);
                                    }),
        option_with<TrainerOptions>("data_parallel",
                                    [](lua_State* L, const char*, TrainerOptions& o) {
                                      o.step.data_parallel = kDataParallelOptions.read(L, lua_gettop(L));
                                    }),
        option_with<TrainerOptions>("graph",
                                    [](lua_State* L, const char*, TrainerOptions& o) {
                                      if (lua_type(L, -1) == LUA_TBOOLEAN)
                                        o.step.graph =
                                            lua_toboolean(L, -1) ? train::GraphMode::on : train::GraphMode::off;
                                      else if (lua_type(L, -1) == LUA_TSTRING)
                                        o.step.graph = train::parse_graph_mode(lua_tostring(L, -1));
                                      else
                                        raise_error(
                                            L, fmt::format(
                                                   "runner.trainer: 'graph' must be true, false or \"auto\", got a {}",
                                                   luaL_typename(L, -1)));
                                    }),
        lua_option<TrainerOptions>("profile"),
        lua_option<TrainerOptions>("objective"),
    });

// runner._train.new(options, parameters, buffers, optimizer [, model]) -> Trainer
// options: runner.trainer's table (TrainerOptions); parameters and buffers: lists of {name, tensor} of the
// model; optimizer: an optim object over the model's parameters; model: the module (a built-in denoiser brackets
// its parameter groups for shard = "weights").
int trainer_new(lua_State* L) {
  TrainerOptions options = kTrainerOptions.read(L, 1);
  train::TrainerModel model;
  model.parameters = named_tensors(L, 2, "parameters");
  model.buffers = named_tensors(L, 3, "buffers");
  model.grouped = test_denoiser(L, 5);
  if (model.parameters.empty()) throw std::invalid_argument("runner.trainer: the model has no parameters");
  std::shared_ptr<train::Optimizer> optimizer = test_optimizer(L, 4);
  if (!optimizer)
    throw std::invalid_argument(
        "runner.trainer: 'optimizer' must be an optim object or a table such as {\"adamw\", lr = 1e-4}");
  if (options.warmup) options.schedule.warmup_steps = *options.warmup;
  options.schedule = train::with_total_steps(options.schedule, options.steps);
  options.step.steps = options.steps;
  const c10::Device device = model.parameters.front().second.device();
  if (options.deterministic) train::set_deterministic(true);
  core::set_tf32(options.tf32.value_or(device.is_cuda() && !options.deterministic));
  auto trainer = std::make_shared<train::Trainer>(std::move(model), std::move(optimizer), options.schedule,
                                                  std::move(options.emas), options.step, device, dist::process_group());
  TrainerBox box{std::move(trainer)};
  box.observers = run::TrainerObservers::of(*box.trainer, [L] { return active_run(L); });
  new_userdata<TrainerBox>(L, kTrainerType, std::move(box));
  return 1;
}

void push_timing(lua_State* L, const train::StepTiming& timing) {
  lua_createtable(L, 0, 5);
  const std::pair<const char*, double> parts[] = {{"forward_backward", timing.forward_backward},
                                                  {"optimizer", timing.optimizer},
                                                  {"ema", timing.ema},
                                                  {"batch_wait", timing.batch_wait},
                                                  {"between_steps", timing.between_steps}};
  for (const auto& [name, seconds] : parts) {
    lua_pushnumber(L, seconds);
    lua_setfield(L, -2, name);
  }
}

// {loss, grad_norm, loss_scale, skipped, lr, step, timing}
void push_step_result(lua_State* L, train::Trainer& trainer, const train::StepResult& result) {
  lua_createtable(L, 0, 7);
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
  push_timing(L, trainer.timing());
  lua_setfield(L, -2, "timing");
}

// The loader's wait for the batch table at `index` (its wait_s), 0 without one.
double batch_wait_seconds(lua_State* L, int index) {
  if (!lua_istable(L, index)) return 0;
  lua_getfield(L, index, "wait_s");
  const double seconds = lua_type(L, -1) == LUA_TNUMBER ? lua_tonumber(L, -1) : 0;
  lua_pop(L, 1);
  return seconds;
}

// The step's result at the top of the stack; then the active run's part of the step (after_trainer_step), with the
// Lua trainer at `trainer_table` (0: none given) and the batch at `batch` (0: none).
void finish_lua_step(lua_State* L, TrainerBox& box, const train::StepResult& result, int trainer_table, int batch) {
  push_step_result(L, *box.trainer, result);
  if (trainer_table != 0) after_trainer_step(L, *box.trainer, trainer_table, batch, lua_gettop(L));
}

// trainer:step(loss_function [, inputs [, batch [, trainer]]]) -> {loss, grad_norm, loss_scale, skipped, lr, step,
// timing}. loss_function(micro, count) is called once per micro-batch (1-based micro); batch: what the inputs came
// from (its wait_s, and runner attach's `batch`); trainer: the Lua trainer (runner attach's `train`).
int trainer_step(lua_State* L) {
  TrainerBox& box = check_trainer_box(L, 1);
  train::Trainer& trainer = *box.trainer;
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
      std::string message = lua_type(L, -1) == LUA_TSTRING
                                ? lua_tostring(L, -1)
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
  const int batch = lua_toboolean(L, 4) ? 4 : 0;
  const train::StepResult result = trainer.step(loss_of, inputs, batch ? batch_wait_seconds(L, batch) : 0);
  finish_lua_step(L, box, result, lua_istable(L, 5) ? 5 : 0, batch);
  return 1;
}

// trainer:set_objective(objective): what trainer:step_batch minimises from now on.
int trainer_set_objective(lua_State* L) {
  train::Trainer& trainer = check_trainer(L, 1);
  std::shared_ptr<train::Objective> objective = test_objective(L, 2);
  if (!objective) raise_type_error(L, 2, "Objective");
  trainer.set_objective(std::move(objective));
  return 0;
}

// A loader batch table ({data, label, index, ...: tensors; epoch: number}) at `index`: its tensors under string
// keys, in key order, and its epoch.
train::StepBatch check_batch(lua_State* L, int index) {
  luaL_checktype(L, index, LUA_TTABLE);
  train::StepBatch batch;
  lua_pushnil(L);
  while (lua_next(L, index)) {
    if (lua_type(L, -2) == LUA_TSTRING) {
      if (at::Tensor* tensor = test_tensor(L, -1)) batch.tensors.emplace_back(lua_tostring(L, -2), *tensor);
    }
    lua_pop(L, 1);
  }
  std::sort(batch.tensors.begin(), batch.tensors.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  lua_getfield(L, index, "epoch");
  if (lua_type(L, -1) == LUA_TNUMBER) batch.epoch = runtime_epoch(lua_tonumber(L, -1));
  lua_pop(L, 1);
  return batch;
}

// runner._train.split_batch(batch, count) -> {micro_1, ..., micro_count}: train::split_batch's micro-batches as
// tables; the batch's other fields are shared.
int split_batch(lua_State* L) {
  const std::vector<train::StepBatch> micro = train::split_batch(check_batch(L, 1), check_integer(L, 2));
  lua_createtable(L, static_cast<int>(micro.size()), 0);
  for (std::size_t i = 0; i < micro.size(); ++i) {
    lua_newtable(L);
    lua_pushnil(L);
    while (lua_next(L, 1)) {
      lua_pushvalue(L, -2);
      lua_insert(L, -2);
      lua_settable(L, -4);
    }
    for (const auto& [name, tensor] : micro[i].tensors) {
      push_tensor(L, tensor);
      lua_setfield(L, -2, name.c_str());
    }
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

// trainer:step_batch(batch [, given [, trainer]]) -> {loss, grad_norm, loss_scale, skipped, lr, step, timing}: one
// step of the trainer's objective over a loader batch; given: what the script passed (the batch, or an image tensor),
// and trainer: the Lua trainer, for runner attach.
int trainer_step_batch(lua_State* L) {
  TrainerBox& box = check_trainer_box(L, 1);
  train::StepBatch batch = check_batch(L, 2);
  batch.wait_seconds = batch_wait_seconds(L, 2);
  const train::StepResult result = box.trainer->step(batch);
  finish_lua_step(L, box, result, lua_istable(L, 4) ? 4 : 0, lua_isnoneornil(L, 3) ? 2 : 3);
  return 1;
}

int objective_tostring(lua_State* L) {
  const std::string text =
      "Objective(" + check_userdata<ObjectiveBox>(L, 1, kObjectiveType, "Objective")->objective->describe() + ")";
  lua_pushlstring(L, text.data(), text.size());
  return 1;
}

int trainer_timing(lua_State* L) {
  push_timing(L, check_trainer(L, 1).timing());
  return 1;
}

int trainer_state_version(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_trainer(L, 1).state_version()));
  return 1;
}

// trainer:raise_pending_stop(): on_nonfinite = "stop" raises a stopped step not yet raised
// (Trainer::raise_pending_stop).
int trainer_raise_pending_stop(lua_State* L) {
  train::Trainer& trainer = check_trainer(L, 1);
  trainer.raise_pending_stop();
  return 0;
}

// trainer:graphs() -> {captured, replayed, eager_reason}: what CUDA graph capture has done (Trainer::graph_status).
int trainer_graphs(lua_State* L) {
  const train::GraphStatus status = check_trainer(L, 1).graph_status();
  lua_createtable(L, 0, 3);
  lua_pushnumber(L, static_cast<lua_Number>(status.captured));
  lua_setfield(L, -2, "captured");
  lua_pushnumber(L, static_cast<lua_Number>(status.replayed));
  lua_setfield(L, -2, "replayed");
  if (status.eager_reason) {
    lua_pushlstring(L, status.eager_reason->data(), status.eager_reason->size());
    lua_setfield(L, -2, "eager_reason");
  }
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

// trainer:accumulate() -> micro-batches per step (TrainerOptions.accumulate, its default filled in)
int trainer_accumulate(lua_State* L) {
  lua_pushinteger(L, static_cast<lua_Integer>(check_trainer(L, 1).step_options().accumulate));
  return 1;
}

// trainer:lr([group = 1]) -> the LR of the next step
int trainer_lr(lua_State* L) {
  train::Trainer& trainer = check_trainer(L, 1);
  const std::int64_t group = opt_integer(L, 2, 1);
  lua_pushnumber(L, trainer.next_lr(static_cast<std::size_t>(group - 1)));
  return 1;
}

// trainer:set_lr(lr [, group]): the LR the schedule scales from the next step on (every group when none is named)
int trainer_set_lr(lua_State* L) {
  refuse_on_one_rank("train:set_lr");
  train::Trainer& trainer = check_trainer(L, 1);
  const double lr = luaL_checknumber(L, 2);
  if (lua_isnoneornil(L, 3)) {
    for (std::size_t g = 0; g < trainer.optimizer().groups().size(); ++g) trainer.set_base_lr(g, lr);
  } else {
    const std::int64_t group = luaL_checkinteger(L, 3);
    if (group < 1)
      throw std::out_of_range(fmt::format("parameter group {} does not exist (groups count from 1)", group));
    trainer.set_base_lr(static_cast<std::size_t>(group - 1), lr);
  }
  note_attached_change(lua_isnoneornil(L, 3) ? fmt::format("train:set_lr({})", lr)
                                             : fmt::format("train:set_lr({}, {})", lr, lua_tointeger(L, 3)));
  return 0;
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
  if (index < 1 || index > static_cast<std::int64_t>(trainer.emas().size()))
    throw std::invalid_argument(fmt::format("the trainer has {} EMA averages, not {}", trainer.emas().size(), index));
  trainer.copy_ema(static_cast<std::size_t>(index - 1), check_tensor_list(L, 3), check_tensor_list(L, 4));
  return 0;
}

// trainer:state_bytes() -> {weights, gradients, optimizer, ema, total}: bytes of model state this rank holds.
int trainer_state_bytes(lua_State* L) {
  const train::Trainer::StateBytes bytes = check_trainer(L, 1).state_bytes();
  lua_createtable(L, 0, 5);
  for (const auto& [key, value] : {std::pair<const char*, std::int64_t>{"weights", bytes.weights},
                                   {"gradients", bytes.gradients},
                                   {"optimizer", bytes.optimizer},
                                   {"ema", bytes.ema},
                                   {"total", bytes.total()}}) {
    lua_pushnumber(L, static_cast<lua_Number>(value));
    lua_setfield(L, -2, key);
  }
  return 1;
}

// trainer:model_state() -> {name = tensor}: the trained weights and buffers, gathered when sharded over the weights.
int trainer_model_state(lua_State* L) {
  const train::NamedTensorList state = check_trainer(L, 1).full_model_state();
  lua_createtable(L, 0, static_cast<int>(state.size()));
  for (const auto& [name, tensor] : state) {
    push_tensor(L, tensor.detach());
    lua_setfield(L, -2, name.c_str());
  }
  return 1;
}

// runner._train.precision(amp, device) -> the precision runner.trainer's amp resolves to on that device, or the
// error it would raise there.
int precision(lua_State* L) {
  const train::Precision resolved =
      train::resolve_precision(check_string(L, 1), core::parse_device(check_string(L, 2)));
  lua_pushstring(L, train::precision_name(resolved).c_str());
  return 1;
}

// runner._train.step_range(text) -> first, last (parse_step_range's checks)
int step_range(lua_State* L) {
  const train::StepRange range = train::parse_step_range(check_string(L, 1));
  lua_pushnumber(L, static_cast<lua_Number>(range.first));
  lua_pushnumber(L, static_cast<lua_Number>(range.last));
  return 2;
}

// runner._train.launch_profile() -> `runner --profile A:B`'s text (core::LaunchContext::profile), or nil
int launch_profile(lua_State* L) {
  const std::string& profile = core::launch_context().profile;
  if (profile.empty()) return 0;
  lua_pushlstring(L, profile.data(), profile.size());
  return 1;
}

const OptionTable<train::ProgressOptions> kProgressOptions("progress", "ProgressOptions",
                                                           {
                                                               option("total", &train::ProgressOptions::total_steps),
                                                               option("batch", &train::ProgressOptions::batch),
                                                               option("terminal", &train::ProgressOptions::terminal),
                                                               option("line_seconds",
                                                                      &train::ProgressOptions::line_seconds),
                                                           });

// trainer:show_progress(ProgressOptions): the progress line after every step from now on; terminal defaults to
// whether stdout is a terminal.
int trainer_show_progress(lua_State* L) {
  TrainerBox& box = check_trainer_box(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  train::ProgressOptions defaults;
  defaults.terminal = ::isatty(::fileno(stdout)) != 0;
  train::ProgressOptions options = kProgressOptions.read(L, 2, defaults);
  box.observers->show_progress(options);
  return 0;
}

// trainer:finish_progress(): the final progress line now (nothing without one).
int trainer_finish_progress(lua_State* L) {
  TrainerBox& box = check_trainer_box(L, 1);
  if (train::ProgressObserver* progress = box.observers->progress())
    progress->finish(box.trainer->step_count(), box.trainer->next_lr(0));
  return 0;
}

// trainer:profile(first, last): profiles steps first..last; the trace goes into the active run's folder (recorded
// as its artifact) or, without a run, the working directory.
int trainer_profile(lua_State* L) {
  TrainerBox& box = check_trainer_box(L, 1);
  box.observers->profile(train::StepRange{check_integer(L, 2), check_integer(L, 3)});
  return 0;
}

int empty_device_cache(lua_State* L) {
  if (core::cuda_available()) c10::getDeviceAllocator(c10::DeviceType::CUDA)->emptyCache();
  (void)L;
  return 0;
}

// The options of runner.early_stopping and runner.find_batch_size (Lua functions of stdlib/runner/train.lua),
// with their defaults.
struct EarlyStoppingOptions {
  std::int64_t patience = 10;  // observations in a row that may fail to beat the best
  std::string mode = "min";    // or "max"
  double min_delta = 0;        // an observation beats the best by more than this
};
const OptionTable<EarlyStoppingOptions> kEarlyStoppingOptions(
    "runner.early_stopping", "EarlyStoppingOptions",
    {
        option_with<EarlyStoppingOptions>("patience",
                                          [](lua_State* L, const char* key, EarlyStoppingOptions& o) {
                                            if (lua_type(L, -1) != LUA_TNUMBER || lua_tonumber(L, -1) < 0 ||
                                                std::floor(lua_tonumber(L, -1)) != lua_tonumber(L, -1))
                                              raise_error(
                                                  L,
                                                  "runner.early_stopping: patience must be a whole number, 0 or more");
                                            read_option_value(L, key, o.patience);
                                          }),
        option_with<EarlyStoppingOptions>("mode",
                                          [](lua_State* L, const char* key, EarlyStoppingOptions& o) {
                                            read_option_value(L, key, o.mode);
                                            if (o.mode != "min" && o.mode != "max")
                                              raise_error(L, "runner.early_stopping: mode must be 'min' or 'max'");
                                          }),
        option("min_delta", &EarlyStoppingOptions::min_delta),
    });

// runner._train.early_stopping_options(options) -> {patience, mode, min_delta}, the defaults filled in.
int early_stopping_options(lua_State* L) {
  const EarlyStoppingOptions o = kEarlyStoppingOptions.read(L, 1);
  lua_createtable(L, 0, 3);
  lua_pushinteger(L, static_cast<lua_Integer>(o.patience));
  lua_setfield(L, -2, "patience");
  lua_pushlstring(L, o.mode.data(), o.mode.size());
  lua_setfield(L, -2, "mode");
  lua_pushnumber(L, o.min_delta);
  lua_setfield(L, -2, "min_delta");
  return 1;
}

struct FindBatchSizeOptions {
  std::int64_t start = 1;  // the first batch size tried; then doubled until one does not fit
  std::int64_t max = 65536;
};
const OptionTable<FindBatchSizeOptions> kFindBatchSizeOptions(
    "runner.find_batch_size", "FindBatchSizeOptions",
    {
        lua_option<FindBatchSizeOptions>("try",
                                         /*required=*/true),  // function(batch_size): a forward and backward pass
        lua_option<FindBatchSizeOptions>("device"),           // default: the run's, else "auto"
        option("start", &FindBatchSizeOptions::start),
        option("max", &FindBatchSizeOptions::max),
    });

// runner._train.find_batch_size_options(options) -> start, max (try and device stay in the table).
int find_batch_size_options(lua_State* L) {
  const FindBatchSizeOptions o = kFindBatchSizeOptions.read(L, 1);
  lua_pushinteger(L, static_cast<lua_Integer>(o.start));
  lua_pushinteger(L, static_cast<lua_Integer>(o.max));
  return 2;
}

}  // namespace

train::Trainer& check_trainer(lua_State* L, int index) { return *shared_trainer(L, index); }

std::shared_ptr<train::Trainer> shared_trainer(lua_State* L, int index) {
  return check_userdata<TrainerBox>(L, index, kTrainerType, "Trainer")->trainer;
}

void push_objective(lua_State* L, std::shared_ptr<train::Objective> objective) {
  new_userdata<ObjectiveBox>(L, kObjectiveType, ObjectiveBox{std::move(objective)});
}

std::shared_ptr<train::Objective> test_objective(lua_State* L, int index) {
  ObjectiveBox* box = test_userdata<ObjectiveBox>(L, index, kObjectiveType);
  return box ? box->objective : nullptr;
}

void open_train(lua_State* L) {
  new_metatable<TrainerBox>(L, kTrainerType,
                            {{"step", wrap<trainer_step>},
                             {"timing", wrap<trainer_timing>},
                             {"step_count", wrap<trainer_step_count>},
                             {"graphs", wrap<trainer_graphs>},
                             {"raise_pending_stop", wrap<trainer_raise_pending_stop>},
                             {"state_version", wrap<trainer_state_version>},
                             {"precision", wrap<trainer_precision>},
                             {"accumulate", wrap<trainer_accumulate>},
                             {"lr", wrap<trainer_lr>},
                             {"set_lr", wrap<trainer_set_lr>},
                             {"observe", wrap<trainer_observe>},
                             {"describe_schedule", wrap<trainer_describe_schedule>},
                             {"copy_ema", wrap<trainer_copy_ema>},
                             {"state_bytes", wrap<trainer_state_bytes>},
                             {"model_state", wrap<trainer_model_state>},
                             {"set_objective", wrap<trainer_set_objective>},
                             {"show_progress", wrap<trainer_show_progress>},
                             {"finish_progress", wrap<trainer_finish_progress>},
                             {"profile", wrap<trainer_profile>},
                             {"step_batch", wrap<trainer_step_batch>}});
  lua_pop(L, 1);
  new_metatable<ObjectiveBox>(L, kObjectiveType, {});
  lua_pop(L, 1);
  luaL_getmetatable(L, kObjectiveType);
  lua_pushcfunction(L, wrap<objective_tostring>);
  lua_setfield(L, -2, "__tostring");
  lua_pop(L, 1);
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L, {{"new", wrap<trainer_new>},
                    {"early_stopping_options", wrap<early_stopping_options>},
                    {"find_batch_size_options", wrap<find_batch_size_options>},
                    {"empty_device_cache", wrap<empty_device_cache>},
                    {"step_range", wrap<step_range>},
                    {"precision", wrap<precision>},
                    {"launch_profile", wrap<launch_profile>},
                    {"split_batch", wrap<split_batch>}});
  lua_setfield(L, -2, "_train");
  lua_pop(L, 1);
}

}  // namespace runner::bindings
