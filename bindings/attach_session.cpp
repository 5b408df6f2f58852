// runner attach in the training process: the scope of an attached chunk (the script's locals), its run, the
// answers, and the commands refused on one rank of several.
#include "bindings/attach_session.h"

#include <lua.hpp>
#include <poll.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fmt/format.h>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "bindings/binding.h"
#include "bindings/lua_host.h"
#include "bindings/repl_session.h"
#include "runtime/core/clock.h"
#include "runtime/core/duration_text.h"
#include "runtime/core/exit_status.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/launch_context.h"
#include "runtime/dist/process_group.h"
#include "runtime/run/run_context.h"

namespace runner::bindings {
namespace {

bool attached_chunk_running = false;
std::vector<std::string> attached_changes;  // what the running chunk changed, in order, each once

// A local of a script frame that a chunk may assign: where it lives on the stack, counted from the serving
// function (whose callers do not change while it serves).
struct ScriptLocal {
  int level = 0;
  int index = 0;
};
using ScriptLocals = std::map<std::string, ScriptLocal>;

// The levels of the script's frames: the innermost Lua function outside the stdlib, and the outermost main chunk
// (the script's); 0 when there is none.
struct ScriptFrames {
  int innermost = 0;
  int main = 0;
};

ScriptFrames find_script_frames(lua_State* L) {
  ScriptFrames frames;
  lua_Debug frame;
  for (int level = 1; lua_getstack(L, level, &frame); ++level) {
    lua_getinfo(L, "S", &frame);
    if (*frame.what == 'C' || is_stdlib_source(frame.source)) continue;
    if (frames.innermost == 0) frames.innermost = level;
    if (*frame.what == 'm') frames.main = level;
  }
  return frames;
}

// Copies the active locals of the frame at `level` into the scope (and their values into `originals`).
void add_locals(lua_State* L, int level, int scope, int originals, ScriptLocals& locals) {
  lua_Debug frame;
  if (level == 0 || !lua_getstack(L, level, &frame)) return;
  for (int i = 1;; ++i) {
    const char* name = lua_getlocal(L, &frame, i);
    if (!name) break;
    if (name[0] == '(') {  // the interpreter's temporaries: (for index), (*temporary)
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, originals, name);
    lua_setfield(L, scope, name);
    locals[name] = {level, i};
  }
}

int assign_global(lua_State* L);

// Pushes the scope of attached chunks and the table of the locals' values it started with.
void push_scope(lua_State* L, int values, ScriptLocals& locals) {
  lua_newtable(L);
  const int scope = lua_gettop(L);
  lua_newtable(L);
  const int originals = lua_gettop(L);
  lua_pushnil(L);
  while (lua_next(L, values) != 0) {
    lua_pushvalue(L, -2);
    lua_insert(L, -2);
    lua_rawset(L, scope);
  }
  const ScriptFrames frames = find_script_frames(L);
  add_locals(L, frames.main, scope, originals, locals);
  if (frames.innermost != frames.main) add_locals(L, frames.innermost, scope, originals, locals);
  // Other names are the globals: read, and assigned (a helper defined in one chunk is there for the next).
  lua_newtable(L);
  lua_pushvalue(L, LUA_GLOBALSINDEX);
  lua_setfield(L, -2, "__index");
  lua_pushcfunction(L, assign_global);
  lua_setfield(L, -2, "__newindex");
  lua_setmetatable(L, scope);
}

// The scope's __newindex(scope, name, value): assigns the global and notes the change.
int assign_global(lua_State* L) {
  lua_settop(L, 3);
  lua_pushvalue(L, 2);
  lua_pushvalue(L, 3);
  lua_settable(L, LUA_GLOBALSINDEX);
  if (lua_type(L, 2) == LUA_TSTRING) note_attached_change(fmt::format("global {}", lua_tostring(L, 2)));
  return 0;
}

// Writes the locals a chunk assigned back into the script's frames.
void write_back_locals(lua_State* L, int scope, int originals, const ScriptLocals& locals) {
  for (const auto& [name, where] : locals) {
    lua_getfield(L, scope, name.c_str());
    lua_getfield(L, originals, name.c_str());
    const bool same = lua_rawequal(L, -1, -2);
    lua_pop(L, 1);
    lua_Debug frame;
    if (same || !lua_getstack(L, where.level, &frame)) {
      lua_pop(L, 1);
      continue;
    }
    lua_pushvalue(L, -1);
    lua_setfield(L, originals, name.c_str());
    if (lua_setlocal(L, &frame, where.index))
      note_attached_change("local " + name);
    else
      lua_pop(L, 1);
  }
}

// A config value as a change names it: numbers, booleans and strings as Lua writes them.
std::string config_value_text(lua_State* L, int index) {
  switch (lua_type(L, index)) {
    case LUA_TNUMBER:
      return fmt::format("{}", lua_tonumber(L, index));
    case LUA_TBOOLEAN:
      return lua_toboolean(L, index) ? "true" : "false";
    case LUA_TSTRING:
      return fmt::format("\"{}\"", lua_tostring(L, index));
    case LUA_TNIL:
      return "nil";
    default:
      return fmt::format("a {}", lua_typename(L, lua_type(L, index)));
  }
}

// Pushes a copy of the script's config (runner.config's keys and values; an empty table without one).
void push_config_copy(lua_State* L) {
  lua_newtable(L);
  lua_getglobal(L, "runner");
  if (lua_istable(L, -1)) {
    lua_getfield(L, -1, "config");
    if (luaL_getmetafield(L, -1, "__config_values")) lua_replace(L, -2);  // config {}'s proxy: its values
    if (lua_istable(L, -1)) {
      lua_pushnil(L);
      while (lua_next(L, -2) != 0) {
        lua_pushvalue(L, -2);
        lua_insert(L, -2);
        lua_rawset(L, -6);
      }
    }
    lua_pop(L, 1);
  }
  lua_pop(L, 1);
}

// Notes each config key whose value differs from the copy at `before` (push_config_copy) as "config.KEY = VALUE".
void note_config_changes(lua_State* L, int before) {
  push_config_copy(L);
  const int after = lua_gettop(L);
  std::map<std::string, std::string> changed;
  for (const auto& [from, to] : {std::pair{before, after}, std::pair{after, before}}) {
    lua_pushnil(L);
    while (lua_next(L, from) != 0) {
      lua_pushvalue(L, -2);
      lua_rawget(L, to);
      const bool same = lua_rawequal(L, -1, -2);
      lua_pop(L, 1);
      if (!same && lua_type(L, -2) == LUA_TSTRING) {
        lua_pushvalue(L, -2);
        lua_rawget(L, after);
        changed[lua_tostring(L, -3)] = config_value_text(L, -1);
        lua_pop(L, 1);
      }
      lua_pop(L, 1);
    }
  }
  lua_pop(L, 1);
  for (const auto& [key, value] : changed) note_attached_change(fmt::format("config.{} = {}", key, value));
}

// What stopped a chunk before it returned.
enum class StopCause { none, client, stop_signal, time_limit };

// Beside a running chunk (on a thread of its own), watches for what must stop it: the client's interrupt or
// hang-up (its connection becomes readable: only AttachServer::poll reads it, after the chunk), a stop signal to
// the run, and the end of the time rank 0 may serve in a job of several ranks. Then stops it with the reason.
class ChunkWatch {
 public:
  ChunkWatch(StoppableCode& code, int client, double deadline)
      : thread_([this, &code, client, deadline] { watch(code, client, deadline); }) {}
  ~ChunkWatch() { finish(); }
  ChunkWatch(const ChunkWatch&) = delete;
  ChunkWatch& operator=(const ChunkWatch&) = delete;

  // Ends the watch (the chunk returned); what stopped the chunk, if anything did.
  StopCause finish() {
    finished_ = true;
    if (thread_.joinable()) thread_.join();
    return cause_;
  }
  static std::string reason(StopCause cause, int signal_number) {
    switch (cause) {
      case StopCause::client:
        return "interrupted by Ctrl-C in runner attach; the run goes on";
      case StopCause::stop_signal:
        return fmt::format("the run received {}: the chunk stopped, the run stops after this step with a checkpoint",
                           core::signal_name(signal_number));
      case StopCause::time_limit:
        return fmt::format(
            "stopped: rank 0 has answered runner attach for {} since its step, the most a job of {} ranks allows "
            "(half of RUNNER_DIST_TIMEOUT: the other ranks wait for rank 0 meanwhile); the run goes on",
            core::duration_text(attached_chunks_time_limit()), core::launch_context().world_size);
      case StopCause::none:
        break;
    }
    return "";
  }

 private:
  static constexpr int kWatchMilliseconds = 50;

  void watch(StoppableCode& code, int client, double deadline) {
    while (!finished_) {
      pollfd readable{client, POLLIN, 0};
      const bool client_spoke = ::poll(&readable, 1, kWatchMilliseconds) > 0;
      if (finished_) return;
      const int signal_number = core::stop_signal();
      const StopCause cause = client_spoke                        ? StopCause::client
                              : signal_number != 0                ? StopCause::stop_signal
                              : core::steady_seconds() > deadline ? StopCause::time_limit
                                                                  : StopCause::none;
      if (cause == StopCause::none) continue;
      cause_ = cause;
      code.stop(reason(cause, signal_number));
      return;
    }
  }

  std::atomic<bool> finished_{false};
  std::atomic<StopCause> cause_{StopCause::none};
  std::thread thread_;  // last: it starts once the members above are made
};

// Runs an eval request's chunk and answers it. Returns whether to go on answering requests (not after a stop
// signal or the time limit stopped the chunk: the run must take its next step).
bool answer_eval(lua_State* L, LuaHost& host, attach::AttachServer& server, run::RunContext& run,
                 const std::string& chunk, int scope, int originals, const ScriptLocals& locals, double deadline) {
  if (server.interrupt_waiting()) {  // Ctrl-C came before the chunk ran: it does not run
    server.send({"error", ChunkWatch::reason(StopCause::client, 0)});
    return true;
  }
  ReplOutcome outcome;
  StopCause cause = StopCause::none;
  push_config_copy(L);
  const int config_before = lua_gettop(L);
  attached_changes.clear();
  {
    StoppableCode code(host);
    ChunkWatch watch(code, server.client_descriptor(), deadline);
    attached_chunk_running = true;
    outcome = run_attached_chunk(host, chunk, scope);
    cause = watch.finish();
  }
  write_back_locals(L, scope, originals, locals);
  note_config_changes(L, config_before);
  attached_chunk_running = false;
  lua_remove(L, config_before);
  // Recorded before the answer, so the client's next look at the run finds it.
  if (outcome.kind == ReplOutcome::Kind::ran && !attached_changes.empty())
    run.record_intervention(chunk, attached_changes);
  if (!outcome.output.empty()) server.send({"output", outcome.output});
  switch (outcome.kind) {
    case ReplOutcome::Kind::incomplete:
      server.send({"incomplete", ""});
      return true;
    case ReplOutcome::Kind::syntax_error:
      server.send({"syntax_error", outcome.message});
      return true;
    case ReplOutcome::Kind::ran:
      break;
  }
  if (outcome.status == core::kExitOk) {
    // The client's detach line says that the run stops rather than goes on.
    if (std::find(attached_changes.begin(), attached_changes.end(), "run:stop()") != attached_changes.end())
      server.send({"stopping", ""});
    server.send({"done", ""});
    return true;
  }
  if (host.exit_requested()) {
    server.send({"error", fmt::format("os.exit({}) ends the run", host.exit_status())});
    throw core::ExitRequest(host.exit_status(), "os.exit in runner attach");
  }
  // The reason, with the traceback of where the chunk was stopped (an error handler of the chunk's that the stop
  // reached leaves the reason alone).
  const std::string reason = ChunkWatch::reason(cause, core::stop_signal());
  if (cause != StopCause::none && outcome.message.rfind(reason, 0) != 0) outcome.message = reason;
  server.send({"error", outcome.message});
  if (core::is_interrupt_status(outcome.status)) throw core::Interrupted();
  return cause == StopCause::none || cause == StopCause::client;
}

std::string joined_lines(const std::vector<std::string>& lines) {
  std::string text;
  for (const std::string& line : lines) text += line + "\n";
  return text;
}

}  // namespace

void serve_attached_client(lua_State* L, attach::AttachServer& server, run::RunContext& run, attach::Message first,
                           int values) {
  if (values < 0) values = lua_gettop(L) + values + 1;
  LuaHost& host = LuaHost::of(L);
  const int top = lua_gettop(L);
  ScriptLocals locals;
  push_scope(L, values, locals);
  const int scope = top + 1;
  const int originals = top + 2;
  const double deadline = core::steady_seconds() + attached_chunks_time_limit();
  for (std::optional<attach::Message> request = std::move(first); request; request = server.poll()) {
    if (request->kind == "eval") {
      if (!answer_eval(L, host, server, run, request->text, scope, originals, locals, deadline)) break;
    } else if (request->kind == "interrupt") {
      // A Ctrl-C that came after its chunk returned: nothing runs to stop.
    } else if (request->kind == "complete")
      server.send({"completions", joined_lines(repl_completions(host, request->text, scope))});
    else
      server.send({"error", fmt::format("runner attach: unknown request '{}'", request->kind)});
  }
  lua_settop(L, top);
}

bool attached_chunk_is_running() { return attached_chunk_running; }

void note_attached_change(const std::string& what) {
  if (!attached_chunk_running) return;
  if (std::find(attached_changes.begin(), attached_changes.end(), what) == attached_changes.end())
    attached_changes.push_back(what);
}

double attached_chunks_time_limit() {
  const dist::ProcessGroup* group = dist::process_group();
  if (core::launch_context().world_size <= 1 || !group) return std::numeric_limits<double>::infinity();
  return std::chrono::duration<double>(group->timeout()).count() / 2;
}

void refuse_on_one_rank(const char* what) {
  const int ranks = core::launch_context().world_size;
  if (!attached_chunk_running || ranks <= 1) return;
  throw std::logic_error(fmt::format(
      "{} is refused in runner attach: this job has {} ranks and attach reaches rank 0 alone, so the ranks would "
      "disagree (run:stop() is agreed by every rank and works)",
      what, ranks));
}

}  // namespace runner::bindings
