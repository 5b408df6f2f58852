// runner._run: the run as userdata (runtime/run: start policy, metrics, summary, images, checkpoints,
// restore, final status), read-only queries over the index, and the host's hook that ends the active run.
// Argument conversion only; stdlib/runner/run.lua is the Lua API.
#include <ATen/ATen.h>

#include <sys/stat.h>

#include <cmath>
#include <fmt/format.h>
#include <memory>

#include "bindings/attach_session.h"
#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "bindings/lua_json.h"
#include "bindings/option_table.h"
#include "bindings/image_grid_binding.h"
#include "bindings/run_binding.h"
#include "bindings/tensor_binding.h"
#include "bindings/data_binding.h"
#include "bindings/train_binding.h"
#include "runtime/ckpt/checkpoint_store.h"
#include "runtime/ckpt/sharded_checkpoint.h"
#include "runtime/core/duration_text.h"
#include "runtime/core/launch_context.h"
#include "runtime/core/shape_text.h"
#include "runtime/core/logging.h"
#include "runtime/index/index_database.h"
#include "runtime/index/read_query.h"
#include "runtime/index/run_records.h"
#include "runtime/run/run_start.h"
#include "runtime/run/training_run.h"

namespace runner::bindings {
namespace {

constexpr const char* kRunType = "runner.Run";
constexpr const char* kActiveRunKey = "runner.active_run";

struct RunBox {
  std::unique_ptr<run::RunContext> context;
  std::unique_ptr<run::TrainingRun> training;
  int loader_ref = LUA_NOREF;                     // the loader given to run:restore, for runner attach's `loader`
  int named_state_ref = LUA_NOREF;                // the Lua function that collects the script's named state
  std::unique_ptr<attach::AttachServer> attach;   // runner attach's socket (rank 0), until the run ends
  std::optional<attach::Message> attach_request;  // arrived, to be answered by serve_attach
};

RunBox& check_box(lua_State* L, int index) { return *check_userdata<RunBox>(L, index, kRunType, "Run"); }

// Lua's math.random seeded from the run's seed and a step, so that a script's Lua draws after a resume are those
// of the uninterrupted run (at the restore, each checkpoint and each step of the attached trainer).
void reseed_lua_random(lua_State* L, std::int64_t seed, std::int64_t step) {
  const double mixed = static_cast<double>(seed) * 1000003.0 + static_cast<double>(step) * 7919.0;
  const double modulus = 2147483647.0;
  lua_getglobal(L, "math");
  lua_getfield(L, -1, "randomseed");
  lua_pushnumber(L, mixed - std::floor(mixed / modulus) * modulus);
  lua_call(L, 1, 0);
  lua_pop(L, 1);
}

run::RunContext& check_run(lua_State* L, int index) {
  RunBox& box = check_box(L, index);
  if (!box.context) throw std::logic_error("the run is closed");
  return *box.context;
}

run::TrainingRun& check_training(lua_State* L, int index, const char* function) {
  RunBox& box = check_box(L, index);
  if (!box.training)
    throw std::logic_error(
        fmt::format("{}: call run:restore{{trainer = ..., loader = ...}} first: it tells the run what a "
                    "checkpoint holds",
                    function));
  return *box.training;
}

// The run ended: an attached client is told so, and the socket is removed.
void close_attach(RunBox& box, const std::string& status) {
  if (!box.attach) return;
  box.attach->close(fmt::format("the run ended ({})", status));
  box.attach.reset();
  box.attach_request.reset();
}

// The banner of runner attach.
std::string attach_greeting(const run::RunContext& context) {
  const core::LaunchContext& launch = core::launch_context();
  const double limit = attached_chunks_time_limit();
  return fmt::format("attached to run {} ({}) at step {}{}", context.record().name, context.record().id, context.step(),
                     launch.world_size > 1
                         ? fmt::format(", rank 0 of {}; chunks may run {} after a step (half of RUNNER_DIST_TIMEOUT: "
                                       "the other ranks wait), then they are stopped",
                                       launch.world_size, std::isfinite(limit) ? core::duration_text(limit) : "-")
                         : "");
}

// Listens for runner attach in the run's folder (rank 0 only); a run goes on without it when the socket cannot
// be made (a warning says why).
void start_attach(RunBox& box) {
  if (box.context->follower()) return;
  const run::RunContext* context = box.context.get();
  const double idle_timeout = attach::idle_timeout_from_environment();
  try {
    box.attach = std::make_unique<attach::AttachServer>(
        context->directory(), [context] { return attach_greeting(*context); }, idle_timeout);
  } catch (const attach::AttachError& error) {
    core::log(core::LogLevel::warn, fmt::format("runner attach will not reach this run: {}", error.what()));
  }
}

// Ends the training part (waits for saves, reports) and then the run.
// A save that failed at the end fails a finished run; the failure is rethrown once the run is recorded.
void finish_box(lua_State* L, RunBox& box, const std::string& status, const std::optional<std::string>& error) {
  close_attach(box, status);
  std::optional<std::string> save_failure;
  if (box.training) {
    save_failure = box.training->finish();
    box.training.reset();
  }
  if (box.named_state_ref != LUA_NOREF) {
    luaL_unref(L, LUA_REGISTRYINDEX, box.named_state_ref);
    box.named_state_ref = LUA_NOREF;
  }
  if (!box.context) return;
  if (!save_failure) {
    box.context->finish(status, error);
    return;
  }
  const std::string combined = error ? *error + "; " + *save_failure : *save_failure;
  box.context->finish(status == "finished" ? "failed" : status, combined);
  throw std::runtime_error(*save_failure);
}

void set_string(lua_State* L, const char* key, const std::string& value) {
  lua_pushlstring(L, value.data(), value.size());
  lua_setfield(L, -2, key);
}

void push_record(lua_State* L, const run::RunContext& context) {
  const index::RunRecord& r = context.record();
  lua_newtable(L);
  set_string(L, "id", r.id);
  set_string(L, "name", r.name);
  set_string(L, "dir", context.directory());
  set_string(L, "home", context.home());
  set_string(L, "status", r.status);
  lua_pushnumber(L, r.started_at);
  lua_setfield(L, -2, "started_at");
  lua_pushboolean(L, context.resumed());
  lua_setfield(L, -2, "resumed");
  lua_pushnumber(L, static_cast<lua_Number>(context.seed()));
  lua_setfield(L, -2, "seed");
  if (context.fork()) set_string(L, "fork", context.fork()->name);
  if (r.git_revision) set_string(L, "git_revision", *r.git_revision);
  if (r.error) set_string(L, "error", *r.error);
}

void read_resume(lua_State* L, const char* key, run::StartRequest& request) {
  if (lua_type(L, -1) == LUA_TBOOLEAN)
    request.resume = lua_toboolean(L, -1) != 0;
  else if (lua_type(L, -1) == LUA_TSTRING)
    request.resume = std::string(lua_tostring(L, -1));
  else
    raise_error(
        L, fmt::format("runner.start: {} must be true, false or a run reference, got {}", key, luaL_typename(L, -1)));
}

void read_seed(lua_State* L, const char* key, run::StartRequest& request) {
  const bool number = lua_type(L, -1) == LUA_TNUMBER;
  const double value = number ? lua_tonumber(L, -1) : -1;
  if (value < 0 || value != std::floor(value) || value > 9007199254740992.0)
    raise_error(L, fmt::format("runner.start: {} must be a non-negative integer, got {}", key,
                               number                           ? fmt::format("{}", value)
                               : lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1)
                                                                : luaL_typename(L, -1)));
  request.seed = static_cast<int64_t>(value);
}

// system_metrics: seconds between samples, or false (or 0) for none.
void read_system_metrics(lua_State* L, const char* key, run::StartRequest& request) {
  if (lua_type(L, -1) == LUA_TBOOLEAN && !lua_toboolean(L, -1)) {
    request.system_metrics_seconds = 0;
    return;
  }
  const bool number = lua_type(L, -1) == LUA_TNUMBER;
  const double seconds = number ? lua_tonumber(L, -1) : -1;
  if (!(seconds >= 0) || std::isinf(seconds))
    raise_error(L, fmt::format("runner.start: {} must be a number of seconds, or false for none, got {}", key,
                               number ? fmt::format("{}", seconds) : std::string(luaL_typename(L, -1))));
  request.system_metrics_seconds = seconds;
}

void read_json(lua_State* L, const char* key, nlohmann::json& target) { target = to_json(L, lua_gettop(L), key); }

const OptionTable<run::StartRequest> kStartOptions(
    "runner.start", "StartOptions",
    {
        option("name", &run::StartRequest::name),
        option_with<run::StartRequest>("seed", read_seed),
        option("device", &run::StartRequest::device),
        option("parent", &run::StartRequest::parent),
        option("fork", &run::StartRequest::fork),
        option_with<run::StartRequest>("resume", read_resume),
        option_with<run::StartRequest>("flush_interval",
                                       [](lua_State* L, const char* key, run::StartRequest& r) {
                                         read_option_value(L, key, r.writer.flush_interval_seconds);
                                       }),
        option_with<run::StartRequest>("heartbeat",
                                       [](lua_State* L, const char* key, run::StartRequest& r) {
                                         read_option_value(L, key, r.writer.heartbeat_seconds);
                                       }),
        option_with<run::StartRequest>("system_metrics", read_system_metrics),
    });

// runner._run.start(options, {script, script_text, config, versions}) -> Run
// options are runner.start's (StartOptions); the second table is what the stdlib adds.
int start(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  if (auto* active = test_userdata<RunBox>(L, -1, kRunType); active && active->context && !active->context->finished())
    throw std::logic_error(
        fmt::format("run '{}' is still active in this process: call run:finish() before starting another",
                    active->context->record().name));
  lua_pop(L, 1);
  run::StartRequest request = kStartOptions.read(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  request.script = field_string(L, 2, "script", "");
  request.script_text = field_string(L, 2, "script_text", "");
  lua_getfield(L, 2, "config");
  if (!lua_isnil(L, -1)) read_json(L, "config", request.config);
  lua_pop(L, 1);
  lua_getfield(L, 2, "versions");
  if (!lua_isnil(L, -1)) read_json(L, "versions", request.versions);
  lua_pop(L, 1);
  if (has_field(L, 2, "device")) request.device = field_string(L, 2, "device", request.device);
  if (!request.seed && has_field(L, 2, "seed")) {
    lua_getfield(L, 2, "seed");
    read_seed(L, "seed", request);
    lua_pop(L, 1);
  }
  if (request.name.empty()) request.name = field_string(L, 2, "name", "");
  auto* box = new_userdata<RunBox>(L, kRunType);
  box->context = run::start_run(request, core::launch_context());
  start_attach(*box);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  return 1;
}

// run:log(values [, step]): numbers and one-element tensors by string key, at `step` or the run's step.
int run_log(lua_State* L) {
  run::RunContext& context = check_run(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  const int64_t step = lua_isnoneornil(L, 3) ? context.step() : check_integer(L, 3);
  const double now = index::now_seconds();
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING) throw std::invalid_argument("run:log: metric names must be strings");
    size_t length = 0;
    const char* key = lua_tolstring(L, -2, &length);
    if (lua_type(L, -1) == LUA_TNUMBER) {
      context.log_metric(std::string_view(key, length), step, lua_tonumber(L, -1), now);
    } else if (at::Tensor* tensor = test_tensor(L, -1)) {
      if (tensor->numel() == 0)
        throw std::invalid_argument(fmt::format("run:log: '{}' is an empty tensor (shape {}): nothing to log", key,
                                                core::shape_text(tensor->sizes())));
      if (tensor->numel() == 1)
        context.log_metric(std::string_view(key, length), step, *tensor, now);
      else
        context.log_histogram(std::string(key, length), step, *tensor, now);
    } else {
      throw std::invalid_argument(
          fmt::format("run:log: '{}' must be a number or a tensor (one element: a metric; more: a histogram), got a {}",
                      key, luaL_typename(L, -1)));
    }
    lua_pop(L, 1);
  }
  return 0;
}

int run_flush(lua_State* L) {
  if (run::RunContext& context = check_run(L, 1); !context.follower()) context.metrics().flush();
  return 0;
}

int run_step(lua_State* L) {
  lua_pushnumber(L, static_cast<lua_Number>(check_run(L, 1).step()));
  return 1;
}

int run_set_step(lua_State* L) {
  const int64_t step = check_integer(L, 2);
  if (step < 0) throw std::invalid_argument(fmt::format("run.step must be 0 or more, got {}", step));
  check_run(L, 1).set_step(step);
  return 0;
}

int run_merge_summary(lua_State* L) {
  run::RunContext& context = check_run(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  nlohmann::json values = to_json(L, 2, "summary");
  if (!values.is_object()) throw std::invalid_argument("run:set_summary expects a table of name = value");
  context.merge_summary(values);
  return 0;
}

// run:tag(tag, ...)
int run_tag(lua_State* L) {
  run::RunContext& context = check_run(L, 1);
  std::vector<std::string> tags;
  for (int i = 2; i <= lua_gettop(L); ++i) {
    if (lua_type(L, i) != LUA_TSTRING)
      throw std::invalid_argument(
          fmt::format("run:tag expects tag names (strings), got a {} as argument {}", luaL_typename(L, i), i - 1));
    tags.push_back(lua_tostring(L, i));
  }
  if (tags.empty()) throw std::invalid_argument("run:tag expects one or more tag names");
  context.add_tags(tags);
  return 0;
}

// run:note(text)
int run_note(lua_State* L) {
  check_run(L, 1).set_note(check_string(L, 2));
  return 0;
}

// run:save_images(name, images, options) -> path, at the run's step
int run_save_images(lua_State* L) {
  run::RunContext& context = check_run(L, 1);
  const std::string name = check_string(L, 2);
  const std::string path =
      context.save_images(name, context.step(), check_tensor(L, 3), grid_options(L, 4, "run:images"));
  lua_pushstring(L, path.c_str());
  return 1;
}

// run:record_file(name, relative_path [, step]): a file in the run directory recorded as an artifact at the step
// (default: the run's)
int run_record_file(lua_State* L) {
  run::RunContext& context = check_run(L, 1);
  context.record_file(check_string(L, 2), opt_integer(L, 4, context.step()), check_string(L, 3));
  return 0;
}

// run:finish(status [, error])
int run_finish(lua_State* L) {
  RunBox& box = check_box(L, 1);
  const std::string status = check_string(L, 2);
  if (status != "finished" && status != "failed" && status != "interrupted")
    throw std::invalid_argument("run status must be finished, failed or interrupted, got '" + status + "'");
  std::optional<std::string> error;
  if (!lua_isnoneornil(L, 3)) error = check_string(L, 3);
  finish_box(L, box, status, error);
  return 0;
}

int run_info(lua_State* L) {
  push_record(L, check_run(L, 1));
  return 1;
}

int run_rows_written(lua_State* L) {
  run::RunContext& context = check_run(L, 1);
  lua_pushnumber(L, context.follower() ? 0.0 : static_cast<double>(context.metrics().rows_written()));
  return 1;
}

// The Lua function collecting named state, called while the training thread is in a binding.
run::NamedStateFunction named_state_function(int ref) {
  return [ref]() -> nlohmann::json {
    lua_State* L = calling_lua_state();
    lua_rawgeti(L, LUA_REGISTRYINDEX, ref);
    if (lua_pcall(L, 0, 1, 0) != 0) {
      std::string message = lua_type(L, -1) == LUA_TSTRING ? lua_tostring(L, -1) : "(error object is not a string)";
      lua_pop(L, 1);
      throw LuaCallbackError(message);
    }
    nlohmann::json state = lua_isnil(L, -1) ? nlohmann::json::object() : to_json(L, lua_gettop(L), "checkpoint state");
    lua_pop(L, 1);
    return state;
  };
}

void read_mode(lua_State* L, const char* key, run::CheckpointPolicy& policy) {
  std::string mode;
  read_option_value(L, key, mode);
  if (mode != "min" && mode != "max") raise_error(L, "run:restore: mode must be 'min' or 'max', got '" + mode + "'");
  policy.rotation.lower_is_better = mode == "min";
}

const OptionTable<run::CheckpointPolicy> kRestoreOptions(
    "run:restore", "RestoreOptions",
    {
        lua_option<run::CheckpointPolicy>("trainer", true),
        lua_option<run::CheckpointPolicy>("loader"),
        lua_option<run::CheckpointPolicy>("state"),
        option_with<run::CheckpointPolicy>("keep_last",
                                           [](lua_State* L, const char* key, run::CheckpointPolicy& p) {
                                             read_option_value(L, key, p.rotation.keep_last);
                                           }),
        option_with<run::CheckpointPolicy>("keep_best",
                                           [](lua_State* L, const char* key, run::CheckpointPolicy& p) {
                                             read_option_value(L, key, p.rotation.keep_best);
                                           }),
        option("metric", &run::CheckpointPolicy::metric),
        option_with<run::CheckpointPolicy>("mode", read_mode),
        option_with<run::CheckpointPolicy>("on_error",
                                           [](lua_State* L, const char* key, run::CheckpointPolicy& p) {
                                             std::string name;
                                             read_option_value(L, key, name);
                                             try {
                                               p.on_error = run::parse_checkpoint_failure_policy(name);
                                             } catch (const std::invalid_argument& error) {
                                               raise_error(L, std::string("run:restore: ") + error.what());
                                             }
                                           }),
    });

// run:restore(options, trainer_native, loader_or_nil, named_state_function_or_nil) -> step, named_state
// Attaches what a checkpoint holds and continues from the newest good checkpoint.
int run_restore(lua_State* L) {
  RunBox& box = check_box(L, 1);
  run::RunContext& context = check_run(L, 1);
  const run::CheckpointPolicy policy = kRestoreOptions.read(L, 2);
  std::shared_ptr<train::Trainer> trainer = shared_trainer(L, 3);
  std::shared_ptr<data::Loader> loader = lua_isnoneornil(L, 4) ? nullptr : shared_loader(L, 4);
  if (box.training) {
    box.training->finish();
    box.training.reset();
  }
  if (box.named_state_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, box.named_state_ref);
  box.named_state_ref = LUA_NOREF;
  run::NamedStateFunction named_state;
  if (lua_isfunction(L, 5)) {
    lua_pushvalue(L, 5);
    box.named_state_ref = luaL_ref(L, LUA_REGISTRYINDEX);
    named_state = named_state_function(box.named_state_ref);
  }
  box.training = std::make_unique<run::TrainingRun>(context, std::move(trainer), std::move(loader),
                                                    std::move(named_state), policy);
  if (box.attach) {
    RunBox* at = &box;
    box.training->set_attach_waiting([at] {
      if (!at->attach) return false;  // closed with the run's end
      if (!at->attach_request) at->attach_request = at->attach->poll();
      return at->attach_request.has_value();
    });
  }
  if (box.loader_ref != LUA_NOREF) luaL_unref(L, LUA_REGISTRYINDEX, box.loader_ref);
  lua_getfield(L, 2, "loader");
  box.loader_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  const auto restored = box.training->restore();
  lua_pushnumber(L, static_cast<lua_Number>(restored ? restored->step : 0));
  if (restored)
    push_json(L, restored->named_state);
  else
    lua_pushnil(L);
  return 2;
}

const OptionTable<run::CheckpointRequest> kCheckpointOptions("run:checkpoint", "CheckpointOptions",
                                                             {
                                                                 option("metric", &run::CheckpointRequest::metric),
                                                                 option("value", &run::CheckpointRequest::value),
                                                                 option("wait", &run::CheckpointRequest::wait),
                                                             });

// run:checkpoint([options]) -> stall seconds
int run_checkpoint(lua_State* L) {
  refuse_on_one_rank("run:checkpoint");
  run::TrainingRun& training = check_training(L, 1, "run:checkpoint");
  const run::CheckpointRequest request = kCheckpointOptions.read(L, 2);
  lua_pushnumber(L, training.checkpoint(request));
  note_attached_change("run:checkpoint()");
  return 1;
}

// run:request_stop(): run:stop()
int run_request_stop(lua_State* L) {
  check_training(L, 1, "run:stop").request_stop();
  note_attached_change("run:stop()");
  return 0;
}

// Answers what a client of runner attach sent, if anything, in the scope of train (the Lua trainer at
// `trainer_table`), model, loader, batch (at `batch`; 0: none), out (at `out`; 0: none), loss and run.
void answer_attach(lua_State* L, RunBox& box, int trainer_table, int batch, int out) {
  if (!box.attach) return;
  if (!box.attach_request) box.attach_request = box.attach->poll();
  if (!box.attach_request) return;
  attach::Message request = std::move(*box.attach_request);
  box.attach_request.reset();
  lua_createtable(L, 0, 7);
  if (trainer_table != 0) {
    lua_pushvalue(L, trainer_table);
    lua_setfield(L, -2, "train");
    lua_getfield(L, trainer_table, "model");
    lua_setfield(L, -2, "model");
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, box.loader_ref);  // nil without one
  lua_setfield(L, -2, "loader");
  if (batch != 0) {
    lua_pushvalue(L, batch);
    lua_setfield(L, -2, "batch");
  }
  if (out != 0) {
    lua_pushvalue(L, out);
    lua_setfield(L, -2, "out");
    lua_getfield(L, out, "loss");
    lua_setfield(L, -2, "loss");
  }
  lua_getglobal(L, "runner");
  lua_getfield(L, -1, "run");
  lua_remove(L, -2);
  lua_setfield(L, -2, "run");
  serve_attached_client(L, *box.attach, *box.context, std::move(request), lua_gettop(L));
  lua_pop(L, 1);
}

// run:serve_attach(trainer, batch, out): answers a client of runner attach now, as the end of train:step does (a
// script's own safe point, e.g. a loop that waits); trainer, batch and out may be nil.
int run_serve_attach(lua_State* L) {
  RunBox& box = check_box(L, 1);
  if (!box.context || box.context->finished()) return 0;
  answer_attach(L, box, lua_istable(L, 2) ? 2 : 0, lua_isnoneornil(L, 3) ? 0 : 3, lua_istable(L, 4) ? 4 : 0);
  return 0;
}

// run:reseed_lua_random(step): math.randomseed from the run's seed and `step` (reseed_lua_random)
int run_reseed_lua_random(lua_State* L) {
  reseed_lua_random(L, check_run(L, 1).seed(), check_integer(L, 2));
  return 0;
}

// runner._run.query(sql, ...) -> rows, columns
// runner._run.open_run(reference, step|nil) -> {id, name, status, dir, script, config, step, checkpoint}: a run of
// the index and its newest good checkpoint (or that of `step`), for runner.load_run; reads the index only.
int open_run(lua_State* L) {
  const std::string reference = check_string(L, 1);
  std::optional<std::int64_t> step;
  if (!lua_isnoneornil(L, 2)) step = check_integer(L, 2);
  const index::IndexLocation where = index::index_location(core::launch_context());
  index::Database db = index::open_index_for_reading(where);
  const index::RunRecord run = index::resolve_run(db, reference, index::LastAmong::all_runs);
  const std::string run_dir = where.home + "/" + run.dir;
  const ckpt::RestoreChoice choice = ckpt::require_checkpoint(db, run.run, run.name, run_dir, step);
  push_json(L, {{"id", run.id},
                {"name", run.name},
                {"status", run.status},
                {"dir", run_dir},
                {"script", run_dir + "/script.lua"},
                {"config", run.config},
                {"step", choice.checkpoint->step},
                {"checkpoint", choice.directory}});
  return 1;
}

// runner._run.checkpoint_file(checkpoint_dir, name) -> {name = tensor}, metadata: a file of a checkpoint as
// unsharded training saves it (assembled from the rank files of a sharded one).
int checkpoint_file(lua_State* L) {
  const ckpt::SafetensorsContents contents = ckpt::read_checkpoint_file(check_string(L, 1), check_string(L, 2));
  lua_createtable(L, 0, static_cast<int>(contents.tensors.size()));
  for (const auto& t : contents.tensors) {
    push_tensor(L, t.tensor);
    lua_setfield(L, -2, t.name.c_str());
  }
  lua_createtable(L, 0, static_cast<int>(contents.metadata.size()));
  for (const auto& [key, value] : contents.metadata) {
    lua_pushlstring(L, value.data(), value.size());
    lua_setfield(L, -2, key.c_str());
  }
  return 2;
}

// runner._run.record_evaluation(run_id, step, {key = number}, {{name = ..., path = ...}, ...}): scores of a run's
// checkpoint (runner sample) as its metrics at `step`, and its images (paths relative to the run's folder) as its
// image artifacts.
int record_evaluation(lua_State* L) {
  const std::string id = check_string(L, 1);
  const std::int64_t step = check_integer(L, 2);
  luaL_checktype(L, 3, LUA_TTABLE);
  luaL_checktype(L, 4, LUA_TTABLE);
  std::map<std::string, double> values;
  lua_pushnil(L);
  while (lua_next(L, 3)) {
    if (lua_type(L, -2) != LUA_TSTRING || lua_type(L, -1) != LUA_TNUMBER)
      throw std::invalid_argument("record_evaluation: values must map names to numbers");
    values[lua_tostring(L, -2)] = lua_tonumber(L, -1);
    lua_pop(L, 1);
  }
  const index::IndexLocation where = index::index_location(core::launch_context());
  index::Database db = index::open_index_for_writing(where);
  const index::RunRecord run = index::resolve_run(db, id, index::LastAmong::all_runs);
  const double now = index::now_seconds();
  index::add_evaluation_metrics(db, run.run, step, values, now);
  for (int i = 1; i <= static_cast<int>(lua_objlen(L, 4)); ++i) {
    lua_rawgeti(L, 4, i);
    index::ArtifactRecord artifact;
    artifact.run = run.run;
    artifact.step = step;
    artifact.kind = "image";
    artifact.name = field_string(L, -1, "name", "");
    artifact.path = field_string(L, -1, "path", "");
    lua_pop(L, 1);
    struct stat status {};
    if (::stat((where.home + "/" + run.dir + "/" + artifact.path).c_str(), &status) != 0)
      throw std::invalid_argument(
          fmt::format("record_evaluation: {} is not in run {}'s folder", artifact.path, run.name));
    artifact.bytes = status.st_size;
    artifact.created_at = now;
    index::add_artifact(db, artifact);
  }
  return 0;
}

// runner._run.log_text(text): appends printed text to the active run's log file.
int log_text(lua_State* L) {
  size_t length = 0;
  const char* text = luaL_checklstring(L, 1, &length);
  core::append_to_log_file(std::string_view(text, length));
  return 0;
}

int home(lua_State* L) {
  lua_pushstring(L, core::launch_context().home.c_str());
  return 1;
}

}  // namespace

void open_run(lua_State* L) {
  new_metatable<RunBox>(L, kRunType,
                        {{"log", wrap<run_log>},
                         {"flush", wrap<run_flush>},
                         {"step", wrap<run_step>},
                         {"set_step", wrap<run_set_step>},
                         {"merge_summary", wrap<run_merge_summary>},
                         {"tag", wrap<run_tag>},
                         {"note", wrap<run_note>},
                         {"save_images", wrap<run_save_images>},
                         {"record_file", wrap<run_record_file>},
                         {"finish", wrap<run_finish>},
                         {"info", wrap<run_info>},
                         {"rows_written", wrap<run_rows_written>},
                         {"restore", wrap<run_restore>},
                         {"checkpoint", wrap<run_checkpoint>},
                         {"request_stop", wrap<run_request_stop>},
                         {"reseed_lua_random", wrap<run_reseed_lua_random>},
                         {"serve_attach", wrap<run_serve_attach>}});
  lua_pop(L, 1);
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L, {{"start", wrap<start>},
                    {"log_text", wrap<log_text>},
                    {"home", wrap<home>},
                    {"open_run", wrap<open_run>},
                    {"checkpoint_file", wrap<checkpoint_file>},
                    {"record_evaluation", wrap<record_evaluation>}});
  lua_setfield(L, -2, "_run");
  lua_pop(L, 1);
}

void after_trainer_step(lua_State* L, const train::Trainer& trainer, int trainer_table, int batch, int out) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  auto* box = test_userdata<RunBox>(L, -1, kRunType);
  lua_pop(L, 1);
  if (!box || !box->context || box->context->finished()) return;
  if (box->training && &box->training->trainer() == &trainer) {
    lua_getfield(L, out, "step");
    const auto step = static_cast<std::int64_t>(lua_tonumber(L, -1));
    lua_pop(L, 1);
    reseed_lua_random(L, box->context->seed(), step);
    if (box->training->distributed()) {
      // Only on a turn every rank agreed on at the step's start: the other ranks wait for rank 0 meanwhile.
      if (!box->training->attach_turn()) return;
      try {
        answer_attach(L, *box, trainer_table, batch, out);
      } catch (...) {
        box->training->end_attach_turn();
        throw;
      }
      box->training->end_attach_turn();
      return;
    }
  }
  answer_attach(L, *box, trainer_table, batch, out);
}

run::RunContext* active_run(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  auto* active = test_userdata<RunBox>(L, -1, kRunType);
  lua_pop(L, 1);
  return active && active->context && !active->context->finished() ? active->context.get() : nullptr;
}

void record_run_input(lua_State* L, const std::string& kind, const std::string& path,
                      const std::function<nlohmann::json()>& detail) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  auto* active = test_userdata<RunBox>(L, -1, kRunType);
  lua_pop(L, 1);
  if (active && active->context && !active->context->finished()) active->context->record_input(kind, path, detail());
}

std::optional<std::string> end_active_run(lua_State* L, const std::string& status,
                                          const std::optional<std::string>& error) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  auto* box = test_userdata<RunBox>(L, -1, kRunType);
  lua_pop(L, 1);
  if (!box || !box->context || box->context->finished()) {
    if (box) {
      box->training.reset();
      close_attach(*box, box->context ? box->context->record().status : status);
    }
    return std::nullopt;
  }
  const std::string name = fmt::format("{} ({})", box->context->record().name, box->context->record().id);
  try {
    finish_box(L, *box, status, error);
    return std::nullopt;
  } catch (const std::exception& failure) {
    return fmt::format("run {}: {}", name, failure.what());
  }
}

std::optional<std::string> withdraw_active_run(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  auto* box = test_userdata<RunBox>(L, -1, kRunType);
  lua_pop(L, 1);
  if (!box || !box->context) return std::nullopt;
  std::optional<std::string> withdrawn = box->context->withdraw();
  if (!withdrawn) return std::nullopt;
  try {
    finish_box(L, *box, "failed", std::nullopt);  // detaches the training part; the run itself is done
  } catch (const std::exception& failure) {
    return *withdrawn + "; " + failure.what();
  }
  return withdrawn;
}

}  // namespace runner::bindings
