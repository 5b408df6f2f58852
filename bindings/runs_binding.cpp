// runner._index: the run context as userdata (metrics, summary, images, final status), read-only queries
// over the index, and the host's hook that ends the active run when the script ends.
#include <ATen/ATen.h>

#include <chrono>
#include <cmath>
#include <fmt/format.h>
#include <memory>

#include "bindings/binding.h"
#include "bindings/lua_json.h"
#include "bindings/bindings.h"
#include "bindings/runs_binding.h"
#include "bindings/samples_binding.h"
#include "bindings/tensor_binding.h"
#include "runtime/core/logging.h"
#include "runtime/core/sha256.h"
#include "runtime/index/index_database.h"
#include "runtime/index/read_query.h"
#include "runtime/index/run_context.h"
#include "runtime/ckpt/checkpoint_store.h"
#include "bindings/train_binding.h"

namespace runner::bindings {
namespace {

constexpr const char* kRunType = "runner.Run";
constexpr const char* kActiveRunKey = "runner.active_run";

struct RunBox {
  std::unique_ptr<index::RunContext> context;
  std::unique_ptr<ckpt::CheckpointSaver> saver;
};

index::RunContext& check_run(lua_State* L, int index) {
  auto* box = check_userdata<RunBox>(L, index, kRunType, "Run");
  if (!box->context) throw std::logic_error("the run is closed");
  return *box->context;
}

void push_record(lua_State* L, const index::RunContext& context) {
  const index::RunRecord& r = context.record();
  lua_newtable(L);
  lua_pushstring(L, r.id.c_str());
  lua_setfield(L, -2, "id");
  lua_pushstring(L, r.name.c_str());
  lua_setfield(L, -2, "name");
  lua_pushstring(L, context.directory().c_str());
  lua_setfield(L, -2, "dir");
  lua_pushstring(L, context.home().c_str());
  lua_setfield(L, -2, "home");
  lua_pushstring(L, r.status.c_str());
  lua_setfield(L, -2, "status");
  lua_pushnumber(L, r.started_at);
  lua_setfield(L, -2, "started_at");
  lua_pushboolean(L, context.resumed());
  lua_setfield(L, -2, "resumed");
  if (r.seed) {
    lua_pushnumber(L, static_cast<lua_Number>(*r.seed));
    lua_setfield(L, -2, "seed");
  }
  if (r.git_revision) {
    lua_pushstring(L, r.git_revision->c_str());
    lua_setfield(L, -2, "git_revision");
  }
  if (r.error) {
    lua_pushstring(L, r.error->c_str());
    lua_setfield(L, -2, "error");
  }
}

// runner._index.start{script=, script_text=, name=, config=, device=, seed=, parent=, versions=,
//                     flush_interval=, heartbeat=} -> Run
int start(lua_State* L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  check_option_keys(L, 1, "runner.start",
                    {"script", "script_text", "name", "config", "device", "seed", "parent", "versions",
                     "flush_interval", "heartbeat", "resume"});
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  if (auto* active = test_userdata<RunBox>(L, -1, kRunType); active && active->context && !active->context->finished())
    throw std::logic_error(fmt::format("run '{}' is still active in this process: call run:finish() before starting "
                                       "another",
                                       active->context->record().name));
  lua_pop(L, 1);

  index::RunStart spec;
  spec.home = index::home_directory();
  spec.run.script = field_string(L, 1, "script", "");
  spec.script_text = field_string(L, 1, "script_text", "");
  spec.run.script_hash = spec.script_text.empty() ? "" : core::sha256_hex(spec.script_text);
  spec.run.name = field_string(L, 1, "name", "");
  spec.run.device = field_string(L, 1, "device", "cpu");
  if (has_field(L, 1, "seed")) spec.run.seed = field_integer(L, 1, "seed", 0);
  lua_getfield(L, 1, "config");
  if (!lua_isnil(L, -1)) spec.run.config = to_json(L, -1, "config");
  lua_pop(L, 1);
  lua_getfield(L, 1, "versions");
  if (!lua_isnil(L, -1)) spec.run.versions = to_json(L, -1, "versions");
  lua_pop(L, 1);
  if (has_field(L, 1, "parent")) {
    index::Database db = index::open_index_for_writing(spec.home);
    spec.run.parent = index::resolve_run(db, field_string(L, 1, "parent", "")).run;
  }
  spec.writer.flush_interval_seconds = field_number(L, 1, "flush_interval", spec.writer.flush_interval_seconds);
  spec.writer.heartbeat_seconds = field_number(L, 1, "heartbeat", spec.writer.heartbeat_seconds);
  const std::string script_dir =
      spec.run.script.rfind('/') == std::string::npos ? "." : spec.run.script.substr(0, spec.run.script.rfind('/'));
  if (!spec.run.script.empty()) {
    const index::GitState git = index::git_state(script_dir);
    spec.run.git_revision = git.revision;
    spec.run.git_dirty = git.dirty;
  }
  // resume: a run reference (continue that run), or true (continue the latest ended run of this script with
  // this exact config that has a checkpoint, else start a new one).
  if (lua_getfield(L, 1, "resume"), !lua_isnil(L, -1)) {
    index::Database db = index::open_index_for_writing(spec.home);
    if (lua_type(L, -1) == LUA_TSTRING) spec.resume = index::resolve_run(db, lua_tostring(L, -1)).run;
    else if (lua_toboolean(L, -1)) spec.resume = index::find_resumable_run(db, spec.run.script, spec.run.config);
  }
  lua_pop(L, 1);
  auto* box = new_userdata<RunBox>(L, kRunType);
  box->context = std::make_unique<index::RunContext>(spec);
  lua_pushvalue(L, -1);
  lua_setfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  return 1;
}

// run:log(values, step): numbers and one-element tensors by string key.
int run_log(lua_State* L) {
  index::RunContext& context = check_run(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  const int64_t step = check_integer(L, 3);
  const double now = index::now_seconds();
  index::MetricWriter& writer = context.metrics();
  writer.set_step(step);
  lua_pushnil(L);
  while (lua_next(L, 2)) {
    if (lua_type(L, -2) != LUA_TSTRING) throw std::invalid_argument("run:log: metric names must be strings");
    size_t length = 0;
    const char* key = lua_tolstring(L, -2, &length);
    if (lua_type(L, -1) == LUA_TNUMBER) {
      writer.log(std::string_view(key, length), step, lua_tonumber(L, -1), now);
    } else if (at::Tensor* tensor = test_tensor(L, -1)) {
      writer.log(std::string_view(key, length), step, *tensor, now);
    } else {
      throw std::invalid_argument(fmt::format("run:log: metric '{}' must be a number or a one-element tensor, got a {}",
                                              key, luaL_typename(L, -1)));
    }
    lua_pop(L, 1);
  }
  return 0;
}

int run_flush(lua_State* L) {
  check_run(L, 1).metrics().flush();
  return 0;
}

int run_set_step(lua_State* L) {
  check_run(L, 1).metrics().set_step(check_integer(L, 2));
  return 0;
}

int run_merge_summary(lua_State* L) {
  index::RunContext& context = check_run(L, 1);
  luaL_checktype(L, 2, LUA_TTABLE);
  nlohmann::json values = to_json(L, 2, "summary");
  if (!values.is_object()) throw std::invalid_argument("run:set_summary expects a table of name = value");
  context.merge_summary(values);
  return 0;
}

// run:_save_images(name, step, images, options) -> path
int run_save_images(lua_State* L) {
  index::RunContext& context = check_run(L, 1);
  const std::string name = check_string(L, 2);
  const int64_t step = check_integer(L, 3);
  const std::string path = context.save_images(name, step, check_tensor(L, 4), grid_options(L, 5, "run:images"));
  lua_pushstring(L, path.c_str());
  return 1;
}

// run:_finish(status [, error])
int run_finish(lua_State* L) {
  auto* box = check_userdata<RunBox>(L, 1, kRunType, "Run");
  const std::string status = check_string(L, 2);
  if (status != "finished" && status != "failed" && status != "interrupted")
    throw std::invalid_argument("run status must be finished, failed or interrupted, got '" + status + "'");
  std::optional<std::string> error;
  if (!lua_isnoneornil(L, 3)) error = check_string(L, 3);
  if (box->saver) box->saver->wait();
  if (box->context) box->context->finish(status, error);
  return 0;
}

int run_info(lua_State* L) {
  push_record(L, check_run(L, 1));
  return 1;
}

int run_rows_written(lua_State* L) {
  lua_pushnumber(L, static_cast<double>(check_run(L, 1).metrics().rows_written()));
  return 1;
}

void push_report(lua_State* L, const ckpt::SaveReport& report) {
  lua_createtable(L, 0, 6);
  lua_pushnumber(L, static_cast<lua_Number>(report.step));
  lua_setfield(L, -2, "step");
  lua_pushstring(L, report.path.c_str());
  lua_setfield(L, -2, "path");
  lua_pushnumber(L, static_cast<lua_Number>(report.bytes));
  lua_setfield(L, -2, "bytes");
  lua_pushnumber(L, report.write_seconds);
  lua_setfield(L, -2, "seconds");
  if (report.error) {
    lua_pushstring(L, report.error->c_str());
    lua_setfield(L, -2, "error");
  }
  lua_createtable(L, static_cast<int>(report.dropped.size()), 0);
  for (size_t i = 0; i < report.dropped.size(); ++i) {
    lua_pushstring(L, report.dropped[i].c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  lua_setfield(L, -2, "dropped");
}

// run:checkpoint(trainer, step, extra, {metric, value, keep_last, keep_best, mode}) -> stall seconds
// Copies the training state (the stall) and hands it to the saving thread; the previous save is waited for
// first (that wait is part of the stall).
int run_checkpoint(lua_State* L) {
  auto* box = check_userdata<RunBox>(L, 1, kRunType, "Run");
  if (!box->context) throw std::logic_error("the run is closed");
  train::Trainer& trainer = check_trainer(L, 2);
  const int64_t step = check_integer(L, 3);
  const nlohmann::json extra = lua_isnoneornil(L, 4) ? nlohmann::json::object() : to_json(L, 4, "checkpoint state");
  luaL_checktype(L, 5, LUA_TTABLE);
  check_option_keys(L, 5, "run:checkpoint", {"metric", "value", "keep_last", "keep_best", "mode"});
  ckpt::RotationPolicy rotation;
  rotation.keep_last = field_integer(L, 5, "keep_last", rotation.keep_last);
  rotation.keep_best = field_integer(L, 5, "keep_best", rotation.keep_best);
  const std::string mode = field_string(L, 5, "mode", "min");
  if (mode != "min" && mode != "max") throw std::invalid_argument("checkpoint mode must be 'min' or 'max', got '" + mode + "'");
  rotation.lower_is_better = mode == "min";
  if (rotation.keep_last < 0 || rotation.keep_best < 0) throw std::invalid_argument("keep_last and keep_best must be 0 or more");
  if (rotation.keep_last == 0 && rotation.keep_best == 0) throw std::invalid_argument("keep_last and keep_best cannot both be 0");

  const auto start = std::chrono::steady_clock::now();
  if (!box->saver || box->saver->rotation().keep_last != rotation.keep_last || box->saver->rotation().keep_best != rotation.keep_best ||
      box->saver->rotation().lower_is_better != rotation.lower_is_better) {
    if (box->saver) box->saver->wait();
    box->saver = std::make_unique<ckpt::CheckpointSaver>(box->context->home(), box->context->record().run,
                                                         box->context->directory(), rotation);
  }
  box->saver->wait();
  train::Trainer::Snapshot snapshot = trainer.snapshot(extra);
  ckpt::SaveRequest request;
  request.step = step;
  request.files = std::move(snapshot.files);
  request.wait_ready = std::move(snapshot.wait_ready);
  request.manifest_extra = {{"run", box->context->record().id}};
  if (has_field(L, 5, "metric")) {
    request.metric = field_string(L, 5, "metric", "");
    if (has_field(L, 5, "value")) request.metric_value = field_number(L, 5, "value", 0.0);
  }
  box->saver->submit(std::move(request));
  lua_pushnumber(L, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  return 1;
}

// run:checkpoint_reports([wait]) -> list of finished saves since the last call
int run_checkpoint_reports(lua_State* L) {
  auto* box = check_userdata<RunBox>(L, 1, kRunType, "Run");
  std::vector<ckpt::SaveReport> reports;
  if (box->saver) {
    if (lua_toboolean(L, 2)) box->saver->wait();
    reports = box->saver->take_reports();
  }
  lua_createtable(L, static_cast<int>(reports.size()), 0);
  for (size_t i = 0; i < reports.size(); ++i) {
    push_report(L, reports[i]);
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 1;
}

// run:choose_checkpoint([run reference]) -> {step, path, dir} or nil, rejected (list of messages)
// The newest good checkpoint of this run (or of the referenced run, for a fork).
int run_choose_checkpoint(lua_State* L) {
  index::RunContext& context = check_run(L, 1);
  int64_t run = context.record().run;
  std::string run_dir = context.directory();
  if (!lua_isnoneornil(L, 2)) {
    const index::RunRecord source = index::resolve_run(context.database(), check_string(L, 2));
    run = source.run;
    run_dir = context.home() + "/" + source.dir;
  }
  const ckpt::RestoreChoice choice = ckpt::choose_checkpoint(context.database(), run, run_dir);
  if (choice.checkpoint) {
    lua_createtable(L, 0, 3);
    lua_pushnumber(L, static_cast<lua_Number>(choice.checkpoint->step));
    lua_setfield(L, -2, "step");
    lua_pushstring(L, choice.checkpoint->path.c_str());
    lua_setfield(L, -2, "path");
    lua_pushstring(L, choice.directory.c_str());
    lua_setfield(L, -2, "dir");
  } else {
    lua_pushnil(L);
  }
  lua_createtable(L, static_cast<int>(choice.rejected.size()), 0);
  for (size_t i = 0; i < choice.rejected.size(); ++i) {
    lua_pushstring(L, choice.rejected[i].c_str());
    lua_rawseti(L, -2, static_cast<int>(i + 1));
  }
  return 2;
}

// runner._index.query(sql, ...) -> rows, columns
int query(lua_State* L) {
  const std::string sql = check_string(L, 1);
  std::vector<index::SqlValue> parameters;
  for (int i = 2; i <= lua_gettop(L); ++i) {
    switch (lua_type(L, i)) {
      case LUA_TNUMBER: {
        const double value = lua_tonumber(L, i);
        if (value == std::floor(value) && std::fabs(value) < 9.007199254740992e15) parameters.emplace_back(static_cast<int64_t>(value));
        else parameters.emplace_back(value);
        break;
      }
      case LUA_TSTRING: parameters.emplace_back(std::string(lua_tostring(L, i))); break;
      case LUA_TBOOLEAN: parameters.emplace_back(static_cast<int64_t>(lua_toboolean(L, i))); break;
      case LUA_TNIL: parameters.emplace_back(std::monostate{}); break;
      default:
        throw std::invalid_argument(fmt::format("runner.query: parameter {} is a {} (numbers, strings, booleans or nil)",
                                                i - 1, luaL_typename(L, i)));
    }
  }
  index::Database db = index::open_index_for_reading(index::home_directory());
  const index::QueryResult result = index::run_read_query(db, sql, parameters);
  lua_createtable(L, static_cast<int>(result.rows.size()), 0);
  for (size_t r = 0; r < result.rows.size(); ++r) {
    lua_createtable(L, 0, static_cast<int>(result.columns.size()));
    for (size_t c = 0; c < result.columns.size(); ++c) {
      const auto& value = result.rows[r][c];
      if (std::holds_alternative<std::monostate>(value)) continue;
      if (auto* integer = std::get_if<int64_t>(&value)) lua_pushnumber(L, static_cast<double>(*integer));
      else if (auto* real = std::get_if<double>(&value)) lua_pushnumber(L, *real);
      else {
        const auto& text = std::get<std::string>(value);
        lua_pushlstring(L, text.data(), text.size());
      }
      lua_setfield(L, -2, result.columns[c].c_str());
    }
    lua_rawseti(L, -2, static_cast<int>(r + 1));
  }
  lua_createtable(L, static_cast<int>(result.columns.size()), 0);
  for (size_t c = 0; c < result.columns.size(); ++c) {
    lua_pushstring(L, result.columns[c].c_str());
    lua_rawseti(L, -2, static_cast<int>(c + 1));
  }
  return 2;
}

// runner._index.log_text(text): appends printed text to the active run's log file.
int log_text(lua_State* L) {
  size_t length = 0;
  const char* text = luaL_checklstring(L, 1, &length);
  core::append_to_log_file(std::string_view(text, length));
  return 0;
}

int home(lua_State* L) {
  lua_pushstring(L, index::home_directory().c_str());
  return 1;
}

}  // namespace

void open_runs(lua_State* L) {
  new_metatable<RunBox>(L, kRunType,
                        {{"log", wrap<run_log>},
                         {"flush", wrap<run_flush>},
                         {"set_step", wrap<run_set_step>},
                         {"merge_summary", wrap<run_merge_summary>},
                         {"save_images", wrap<run_save_images>},
                         {"finish", wrap<run_finish>},
                         {"info", wrap<run_info>},
                         {"rows_written", wrap<run_rows_written>},
                         {"checkpoint", wrap<run_checkpoint>},
                         {"checkpoint_reports", wrap<run_checkpoint_reports>},
                         {"choose_checkpoint", wrap<run_choose_checkpoint>}});
  lua_pop(L, 1);
  lua_getglobal(L, "runner");
  lua_newtable(L);
  set_functions(L, {{"start", wrap<start>}, {"query", wrap<query>}, {"log_text", wrap<log_text>}, {"home", wrap<home>}});
  lua_setfield(L, -2, "_index");
  lua_pop(L, 1);
}

void end_active_run(lua_State* L, const std::string& status, const std::optional<std::string>& error) {
  lua_getfield(L, LUA_REGISTRYINDEX, kActiveRunKey);
  auto* box = test_userdata<RunBox>(L, -1, kRunType);
  lua_pop(L, 1);
  if (!box || !box->context || box->context->finished()) return;
  try {
    if (box->saver) box->saver->wait();
    box->context->finish(status, error);
    const auto& record = box->context->record();
    core::log(core::LogLevel::info, fmt::format("run {} ({}) {}", record.name, record.id, record.status));
  } catch (const std::exception& failure) {
    core::log(core::LogLevel::error, std::string("the run could not be finished cleanly: ") + failure.what());
  }
}

}  // namespace runner::bindings
