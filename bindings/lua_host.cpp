// The Lua host: state set-up, script loading, error reporting, os.exit and Ctrl-C handling.
#include "bindings/lua_host.h"

#include <atomic>
#include <climits>
#include <csignal>
#include <sys/time.h>
#include <unistd.h>
#include <cstdio>
#include <cstring>
#include <fmt/format.h>
#include <fstream>
#include <sstream>

#include "bindings/attach_session.h"
#include "bindings/binding.h"
#include "bindings/bindings.h"
#include "bindings/runner_binding.h"
#include "bindings/run_binding.h"
#include "bindings/stdlib_dir.h"
#include "runtime/core/interrupt.h"
#include "runtime/core/logging.h"
#include "runtime/core/open_line.h"
#include "runtime/core/terminal_text.h"
#include "runtime/dist/failure_report.h"

namespace runner::bindings {

const char* luajit_version() { return LUAJIT_VERSION; }

namespace {

lua_State* active_state = nullptr;
volatile std::sig_atomic_t interrupt_signal = SIGINT;  // the signal behind the pending interrupt
volatile std::sig_atomic_t held_signal = 0;            // the first stop signal while a run is being recorded
volatile std::sig_atomic_t traces_interruptible = 0;   // interrupt_compiled_loops(true) is in effect
std::atomic<const char*> stop_message{nullptr};        // StoppableCode::stop's, raised at every instruction
static_assert(std::atomic<const char*>::is_always_lock_free);
constexpr int kStopSignals[4] = {SIGINT, SIGTERM, SIGHUP, SIGUSR1};
const char* exit_key = "runner.exit";
const char* host_key = "runner.host";
const char* keep_locals_key = "runner.keep_locals";

// Copies the active locals of the function at `frame` into globals, in declaration order (so a later local
// of the same name wins).
void export_locals(lua_State* L, lua_Debug* frame) {
  for (int i = 1;; ++i) {
    const char* name = lua_getlocal(L, frame, i);
    if (!name) break;
    if (name[0] == '(')
      lua_pop(L, 1);
    else
      lua_setglobal(L, name);
  }
}

// Appended as the script's last statement under `runner -i`: exports its caller's (the main chunk's) locals.
int export_script_locals(lua_State* L) {
  lua_Debug frame;
  if (lua_getstack(L, 1, &frame)) export_locals(L, &frame);
  return 0;
}

// At an error under `runner -i`: the locals of the outermost main chunk (the script), as they were.
void export_locals_at_error(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, keep_locals_key);
  const bool keep = lua_toboolean(L, -1);
  lua_pop(L, 1);
  if (!keep) return;
  lua_Debug frame;
  int script_level = -1;
  for (int level = 1; lua_getstack(L, level, &frame); ++level) {
    lua_getinfo(L, "S", &frame);
    if (*frame.what == 'm' && !is_stdlib_source(frame.source)) script_level = level;
  }
  if (script_level > 0 && lua_getstack(L, script_level, &frame)) export_locals(L, &frame);
}

// Stack traceback of user frames only: Lua functions outside the stdlib.
std::string user_traceback(lua_State* L, int first_level) {
  std::string text;
  lua_Debug frame;
  int shown = 0;
  for (int level = first_level; lua_getstack(L, level, &frame); ++level) {
    lua_getinfo(L, "Sln", &frame);
    if (frame.currentline <= 0 || is_stdlib_source(frame.source)) continue;
    if (++shown > 20) {
      text += "\n\t...";
      break;
    }
    std::string where = fmt::format("\n\t{}:{}: in ", source_name(frame), frame.currentline);
    if (*frame.what == 'm')
      where += "main chunk";
    else if (frame.name)
      where += fmt::format("function '{}'", frame.name);
    else
      where += fmt::format("function <{}:{}>", source_name(frame), frame.linedefined);
    text += where;
    // A REPL chunk is the bottom of what its user sees (an attached one runs inside the script's frames).
    if (*frame.what == 'm' && std::strcmp(frame.source, "=stdin") == 0) break;
  }
  return text.empty() ? text : "\nstack traceback:" + text;
}

bool is_usage_error(lua_State* L, int index) {
  if (!lua_istable(L, index) || !lua_getmetatable(L, index)) return false;
  luaL_getmetatable(L, kUsageErrorType);
  const bool same = lua_rawequal(L, -1, -2);
  lua_pop(L, 2);
  return same;
}

// LuaJIT writes a long path's position as "...<tail>:LINE:": with `path` ending in <tail>, the message starts
// with `path` whole instead (else it is returned as it is).
std::string with_whole_path(const std::string& message, const std::string& path) {
  const size_t colon = message.find(':');
  if (message.rfind("...", 0) != 0 || colon == std::string::npos || colon <= 3) return message;
  const size_t tail = colon - 3;
  if (path.size() < tail || path.compare(path.size() - tail, tail, message, 3, tail) != 0) return message;
  return path + message.substr(colon);
}

// with_whole_path for the file of the first frame on the stack whose path completes the message's.
std::string with_whole_path(lua_State* L, const std::string& message) {
  lua_Debug frame;
  for (int level = 1; message.rfind("...", 0) == 0 && lua_getstack(L, level, &frame); ++level) {
    lua_getinfo(L, "S", &frame);
    if (frame.source[0] != '@') continue;
    const std::string whole = with_whole_path(message, source_name(frame));
    if (whole != message) return whole;
  }
  return message;
}

// Message handler: keeps control errors (exit, interrupt, usage) as they are; turns everything else into
// "file:line: message" plus a traceback of user frames.
int message_handler(lua_State* L) {
  if (is_interrupt_error(L, 1) || is_usage_error(L, 1) ||
      (lua_islightuserdata(L, 1) && lua_touserdata(L, 1) == exit_key))
    return 1;
  std::string message;
  if (lua_type(L, 1) == LUA_TSTRING) {
    message = lua_tostring(L, 1);
  } else if (luaL_callmeta(L, 1, "__tostring") && lua_type(L, -1) == LUA_TSTRING) {
    message = lua_tostring(L, -1);
  } else {
    message = fmt::format("(error object is a {} value)", luaL_typename(L, 1));
  }
  export_locals_at_error(L);
  message = with_whole_path(L, message);
  message += user_traceback(L, 1);
  lua_pushlstring(L, message.data(), message.size());
  return 1;
}

void interrupt_hook(lua_State* L, lua_Debug*) {
  lua_sethook(L, nullptr, 0, 0);
  if (core::take_interrupt()) raise_interrupt(L);
}

// StoppableCode's hook: stays set, raising its message again wherever the code goes on (an interrupt outranks it).
void stop_hook(lua_State* L, lua_Debug*) {
  if (core::take_interrupt()) raise_interrupt(L);
  const char* message = stop_message.load(std::memory_order_acquire);
  if (!message) {
    lua_sethook(L, nullptr, 0, 0);
    return;
  }
  lua_pushstring(L, message);
  lua_error(L);
}

// What a call() leaves when it returns: StoppableCode's hook while it stops the code around the call, else none.
void reset_hook(lua_State* L) {
  if (stop_message.load(std::memory_order_acquire))
    lua_sethook(L, stop_hook, LUA_MASKCOUNT, 1);
  else
    lua_sethook(L, nullptr, 0, 0);
}

// SIGUSR2 sent to the Lua thread by StoppableCode::stop: sets the hook there (lua_sethook is meant for signal
// handlers; from another thread it would race the interpreter).
void on_stop_code_signal(int) {
  if (!stop_message.load(std::memory_order_acquire) || !active_state) return;
  lua_sethook(active_state, stop_hook, LUA_MASKCOUNT, 1);
  if (traces_interruptible) std::raise(SIGPROF);
}

// SIGINT (Ctrl-C), SIGTERM, SIGHUP and SIGUSR1 stop the script at the next Lua instruction or blocking runtime call,
// so that the run is marked interrupted and its metrics flushed.
void on_stop_signal(int signal_number) {
  // A training loop that checkpoints finishes its step first; the next signal interrupts.
  if (core::graceful_stop_enabled() && core::repeated_stop(signal_number)) return;
  core::end_open_line_from_signal();
  if (core::graceful_stop_enabled() && core::request_stop(signal_number)) {
    static const char notice[] = "stopping after this step and a checkpoint (signal again to stop at once)\n";
    (void)!::write(STDERR_FILENO, notice, sizeof(notice) - 1);
    return;
  }
  std::signal(signal_number, SIG_DFL);  // a second signal before the script stops ends the process
  interrupt_signal = signal_number;
  core::request_interrupt();
  if (active_state) lua_sethook(active_state, interrupt_hook, LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  // Compiled traces run no hooks; LuaJIT's profiler signal makes them exit to the interpreter, which runs it.
  if (traces_interruptible) std::raise(SIGPROF);
}

void ignore_profile_sample(void*, lua_State*, int, int) {}

void hold_stop_signal(int signal_number) {
  if (held_signal == 0) held_signal = signal_number;
}

// os.exit([code]): unwinds the script so that the host can flush logs and close the state first.
int os_exit(lua_State* L) {
  // The one os.exit, however a chunk reaches it (os, _G.os, require "os", package.loaded.os): from runner attach
  // it would end the training process under the loop.
  if (attached_chunk_is_running())
    return luaL_error(L,
                      "os.exit would end the training process from runner attach; run:stop() stops the run after "
                      "this step, with a checkpoint");
  int status = kExitOk;
  if (lua_type(L, 1) == LUA_TBOOLEAN)
    status = lua_toboolean(L, 1) ? kExitOk : kExitError;
  else
    status = static_cast<int>(luaL_optinteger(L, 1, kExitOk));
  lua_getfield(L, LUA_REGISTRYINDEX, host_key);
  auto* host = static_cast<LuaHost*>(lua_touserdata(L, -1));
  host->request_exit(status);
  lua_pushlightuserdata(L, const_cast<char*>(exit_key));
  return lua_error(L);
}

void set_package_path(lua_State* L, const std::string& script_dir) {
  lua_getglobal(L, "package");
  std::string path = fmt::format("{0}/?.lua;{0}/?/init.lua", stdlib_dir());
  if (!script_dir.empty()) path += fmt::format(";{0}/?.lua;{0}/?/init.lua", script_dir);
  lua_pushstring(L, path.c_str());
  lua_setfield(L, -2, "path");
  lua_pushstring(L, "");
  lua_setfield(L, -2, "cpath");
  lua_pop(L, 1);
}

}  // namespace

LuaHost::LuaHost() : L_(luaL_newstate()) {
  if (!L_) throw std::runtime_error("cannot create the Lua state (out of memory)");
  active_state = L_;
  luaL_openlibs(L_);
  lua_pushlightuserdata(L_, this);
  lua_setfield(L_, LUA_REGISTRYINDEX, host_key);
  lua_getglobal(L_, "os");
  lua_pushcfunction(L_, os_exit);
  lua_setfield(L_, -2, "exit");
  lua_pop(L_, 1);
  set_package_path(L_, "");
  open_all_bindings(L_);
  lua_getglobal(L_, "require");
  lua_pushstring(L_, "runner.prelude");
  if (call(1, 0) != kExitOk) throw std::runtime_error("the runner stdlib failed to load (see the error above)");
}

LuaHost::~LuaHost() {
  interrupt_compiled_loops(false);
  active_state = nullptr;
  lua_close(L_);
  release_held_signals();
}

// LuaJIT's profiler in line mode compiles a check of its hook flag into every trace at each new source line
// (a load and a branch: no measurable cost). Its periodic timer is disarmed at once: only on_stop_signal sets
// the flag, by raising SIGPROF, whose handler is the profiler's.
void LuaHost::interrupt_compiled_loops(bool enabled) {
  if (enabled == (traces_interruptible != 0)) return;
  if (enabled) {
    luaJIT_profile_start(L_, "l", ignore_profile_sample, nullptr);
    const itimerval disarmed{};
    setitimer(ITIMER_PROF, &disarmed, nullptr);
    traces_interruptible = 1;
  } else {
    traces_interruptible = 0;
    luaJIT_profile_stop(L_);
  }
}

bool LuaHost::compiled_loops_interruptible() const { return traces_interruptible != 0; }

StoppableCode::StoppableCode(LuaHost& host) : host_(host), lua_thread_(pthread_self()) {
  enabled_compiled_loops_ = !host_.compiled_loops_interruptible();
  host_.interrupt_compiled_loops(true);
  struct sigaction action {};
  action.sa_handler = on_stop_code_signal;
  sigemptyset(&action.sa_mask);
  action.sa_flags = SA_RESTART;
  sigaction(SIGUSR2, &action, &previous_handler_);
}

StoppableCode::~StoppableCode() {
  stop_message.store(nullptr, std::memory_order_release);
  lua_sethook(host_.state(), nullptr, 0, 0);
  sigaction(SIGUSR2, &previous_handler_, nullptr);
  if (enabled_compiled_loops_) host_.interrupt_compiled_loops(false);
}

void StoppableCode::stop(const std::string& message) {
  if (stopping_.exchange(true)) return;
  message_ = message;
  stop_message.store(message_.c_str(), std::memory_order_release);
  pthread_kill(lua_thread_, SIGUSR2);
}

void LuaHost::request_exit(int status) {
  exit_requested_ = true;
  exit_status_ = status;
}

int LuaHost::load_text(const std::string& text, const std::string& chunk_name) {
  std::string source = text;
  if (!source.empty() && source[0] == '#')
    source.replace(0, source.find('\n') == std::string::npos ? source.size() : source.find('\n'), "");
  return luaL_loadbufferx(L_, source.data(), source.size(), chunk_name.c_str(), "t");
}

int LuaHost::report_failure(int status) {
  if (!error_sink_) core::end_open_line();
  if (lua_islightuserdata(L_, -1) && lua_touserdata(L_, -1) == exit_key) {
    lua_pop(L_, 1);
    return exit_status_;
  }
  if (is_interrupt_error(L_, -1)) {
    lua_pop(L_, 1);
    const int signal_number = interrupt_signal;
    if (error_sink_) {
      *error_sink_ = signal_number == SIGINT ? "interrupted" : fmt::format("interrupted by signal {}", signal_number);
      return 128 + signal_number;
    }
    last_error_ = signal_number == SIGINT
                      ? "interrupted (Ctrl-C)"
                      : fmt::format("interrupted by signal {} ({})", signal_number, strsignal(signal_number));
    std::fprintf(stderr, "%s\n", signal_number == SIGINT ? "interrupted" : last_error_.c_str());
    return 128 + signal_number;
  }
  const bool usage = is_usage_error(L_, -1);
  if (usage) {
    lua_getfield(L_, -1, "message");
    lua_remove(L_, -2);
  }
  const char* message = lua_tostring(L_, -1);
  if (error_sink_) {
    *error_sink_ = message ? message : (status == LUA_ERRMEM ? "out of memory" : "unknown error");
    lua_pop(L_, 1);
    return usage ? kExitUsage : kExitError;
  }
  last_error_ = message ? message : (status == LUA_ERRMEM ? "out of memory" : "unknown error");
  std::fprintf(stderr, "%s\n", core::terminal_text(last_error_).c_str());
  std::fflush(stderr);
  core::append_to_log_file(core::terminal_text(last_error_) + "\n");
  lua_pop(L_, 1);
  return usage ? kExitUsage : kExitError;
}

int LuaHost::call(int nargs, int nresults) { return call(nargs, nresults, AfterCall::restore_signals); }

int LuaHost::call_capturing_error(int nargs, int nresults, std::string& error) {
  std::string* outer = error_sink_;
  error_sink_ = &error;
  const int status = call(nargs, nresults, AfterCall::restore_signals);
  error_sink_ = outer;
  return status;
}

LuaHost& LuaHost::of(lua_State* L) {
  lua_getfield(L, LUA_REGISTRYINDEX, host_key);
  auto* host = static_cast<LuaHost*>(lua_touserdata(L, -1));
  lua_pop(L, 1);
  if (!host) throw std::logic_error("this Lua state has no host");
  return *host;
}

int LuaHost::call(int nargs, int nresults, AfterCall after) {
  const int function_index = lua_gettop(L_) - nargs;
  lua_pushcfunction(L_, message_handler);
  lua_insert(L_, function_index);
  core::take_interrupt();
  interrupt_signal = SIGINT;
  void (*previous[4])(int);
  for (int i = 0; i < 4; ++i) previous[i] = std::signal(kStopSignals[i], on_stop_signal);
  const int status = lua_pcall(L_, nargs, nresults, function_index);
  if (after == AfterCall::hold_signals && !holding_signals_) {
    held_signal = 0;
    for (int i = 0; i < 4; ++i) {
      std::signal(kStopSignals[i], hold_stop_signal);
      held_previous_[i] = previous[i];
    }
    holding_signals_ = true;
  } else {
    for (int i = 0; i < 4; ++i) std::signal(kStopSignals[i], holding_signals_ ? hold_stop_signal : previous[i]);
  }
  reset_hook(L_);
  lua_remove(L_, function_index);
  if (status == 0) return kExitOk;
  return report_failure(status);
}

void LuaHost::release_held_signals() {
  if (!holding_signals_) return;
  for (int i = 0; i < 4; ++i) std::signal(kStopSignals[i], held_previous_[i]);
  holding_signals_ = false;
  if (held_signal != 0) std::raise(held_signal);
}

namespace {

// The script's path as errors show it: relative to the working directory when it is inside it, else as given.
std::string shown_script_path(const std::string& path) {
  if (path.empty() || path[0] != '/') return path;
  char buffer[PATH_MAX];
  if (!::getcwd(buffer, sizeof buffer)) return path;
  const std::string cwd = buffer;
  if (cwd != "/" && path.size() > cwd.size() + 1 && path.compare(0, cwd.size(), cwd) == 0 && path[cwd.size()] == '/')
    return path.substr(cwd.size() + 1);
  return path;
}

// Whether the chunk's last statement is a `return` (nothing may follow it).
bool ends_with_return(const std::string& source) {
  size_t end = source.find_last_not_of(" \t\r\n;");
  if (end == std::string::npos) return false;
  const size_t line = source.rfind('\n', end);
  const std::string last = source.substr(line == std::string::npos ? 0 : line + 1, end + 1);
  const size_t first = last.find_first_not_of(" \t");
  return first != std::string::npos && last.compare(first, 6, "return") == 0;
}

}  // namespace

void LuaHost::want_config() {
  lua_pushboolean(L_, 1);
  lua_setfield(L_, LUA_REGISTRYINDEX, kConfigWantedKey);
}

std::optional<std::string> LuaHost::reported_config() const {
  lua_getfield(L_, LUA_REGISTRYINDEX, kReportedConfigKey);
  std::optional<std::string> text;
  if (lua_type(L_, -1) == LUA_TSTRING) text = lua_tostring(L_, -1);
  lua_pop(L_, 1);
  return text;
}

int LuaHost::run_file(const std::string& path, const std::vector<std::string>& overrides,
                      const std::vector<std::string>& script_args) {
  std::ifstream file(path, std::ios::binary);
  if (!file) {
    std::fprintf(stderr, "runner: cannot open %s: %s\n", core::terminal_text(path).c_str(), std::strerror(errno));
    return kExitUsage;
  }
  std::stringstream text;
  text << file.rdbuf();

  const auto slash = path.rfind('/');
  set_package_path(L_, slash == std::string::npos ? "." : path.substr(0, slash));
  lua_createtable(L_, static_cast<int>(script_args.size()), 1);
  lua_pushstring(L_, path.c_str());
  lua_rawseti(L_, -2, 0);
  for (size_t i = 0; i < script_args.size(); ++i) {
    lua_pushstring(L_, script_args[i].c_str());
    lua_rawseti(L_, -2, static_cast<int>(i + 1));
  }
  lua_setglobal(L_, "arg");
  set_overrides(L_, overrides);

  const std::string shown = shown_script_path(path);
  std::string source = text.str();
  if (keep_locals_) {
    lua_pushboolean(L_, 1);
    lua_setfield(L_, LUA_REGISTRYINDEX, keep_locals_key);
    lua_pushcfunction(L_, export_script_locals);
    lua_setfield(L_, LUA_REGISTRYINDEX, "runner.export_script_locals");
    // A statement after the script's last line (a script ending in `return` keeps its locals to itself).
    if (!ends_with_return(source)) source += "\n;debug.getregistry()[\"runner.export_script_locals\"]()";
  }
  if (load_text(source, "@" + shown) != 0) {
    // A syntax error has no frame to name the file: the chunk's path completes LuaJIT's short name.
    const std::string message = with_whole_path(lua_tostring(L_, -1) ? lua_tostring(L_, -1) : "", shown);
    lua_pop(L_, 1);
    lua_pushlstring(L_, message.data(), message.size());
    return report_failure(LUA_ERRSYNTAX);
  }
  const int status = call(0, 0, AfterCall::hold_signals);
  if (status != kExitOk || exit_requested_) return status;
  if (check_overrides_used(L_)) return kExitOk;
  return report_failure(LUA_ERRRUN);
}

int LuaHost::end_run(int status) {
  // A run that a usage error stopped before its first step is not kept (docs/index-schema.md, "Attempts").
  if (status == kExitUsage)
    if (const std::optional<std::string> withdrawn = withdraw_active_run(L_))
      std::fprintf(stderr, "runner: %s\n", core::terminal_text(*withdrawn).c_str());
  std::optional<std::string> failure;
  if (status == kExitOk) {
    failure = end_active_run(L_, "finished", std::nullopt);
  } else if (core::is_interrupt_status(status)) {
    // In a data-parallel job, an interruption after another rank failed is the launcher stopping the job.
    if (auto cause = dist::failure_behind_interruption(last_error_.empty() ? "interrupted" : last_error_))
      failure = end_active_run(L_, "failed", *cause);
    else
      failure = end_active_run(L_, "interrupted",
                               last_error_.empty() ? std::nullopt : std::optional<std::string>(last_error_));
  } else {
    std::string error = last_error_;
    if (exit_requested_ && error.empty()) error = fmt::format("the script called os.exit({})", status);
    if (error.empty()) error = fmt::format("exit status {}", status);
    const std::string recorded = dist::report_rank_failure(error);
    if (recorded != error) {
      std::fprintf(stderr, "runner: %s (the error above is a consequence)\n",
                   core::terminal_text(recorded.substr(0, recorded.find('\n'))).c_str());
      std::fflush(stderr);
    }
    failure = end_active_run(L_, "failed", recorded);
  }
  if (failure) {
    std::fprintf(stderr, "runner: %s\n", core::terminal_text(*failure).c_str());
    std::fflush(stderr);
  }
  core::flush_logs();
  release_held_signals();
  if (!failure) return status;
  return status == kExitOk ? kExitError : status;
}

int LuaHost::run_string(const std::string& code, const std::string& chunk_name) {
  if (load_text(code, chunk_name) != 0) return report_failure(LUA_ERRSYNTAX);
  return call(0, 0, AfterCall::hold_signals);
}

}  // namespace runner::bindings
